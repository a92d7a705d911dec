"""The agent-checkpoint protocol (``/ng-control/v1/agent-checkpoint/*``, ``/run``), both sides.

- :mod:`.client`: :class:`~.client.GymClient`, the trainer side's calls of this protocol.
- :mod:`.participant`: the server side's participant (the async shell around its pure core).
- :mod:`.settled`: the compact record of keys that were ACKed or tombstoned.

What both protocols share (keys, typed errors, retry, endpoint health, the fence, the store, the
agents and the HTTP server) lives one floor up, in :mod:`rl_gym_actors.gym`.
"""
