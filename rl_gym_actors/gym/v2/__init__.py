"""NeMo Gym's v2 checkpoint protocol (``/ng-control/v1/checkpoint/*``): wire models, the
client, discovery, and our server's participant (docs/PROTOCOL.md, the v2 chapter)."""
