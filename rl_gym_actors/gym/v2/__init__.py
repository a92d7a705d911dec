"""NeMo Gym's v2 checkpoint protocol (``/ng-control/v1/checkpoint/*``; docs/PROTOCOL.md section 9).

Client side: :mod:`.wire` (episode ids, request and answer models), :mod:`.client` (``V2Client``
on the shared transport), :mod:`.discover` (which protocol a server speaks), :mod:`.coordinate`
(the controller's steps over several participants, forget hygiene). Server side: :mod:`.machine`
(phases, fencing, lease, retired marks: a pure table), :mod:`.episodes` (episodes, boundaries,
restored and kept state: pure), :mod:`.participant` (the async shell), :mod:`.state` ((ext) what
``--state-dir`` keeps across a crash), :mod:`.records` (a commit's files), :mod:`.stepped` (agents
with step boundaries) and :mod:`.routes` (the app factory ``gym serve --protocol v2`` serves).
"""
