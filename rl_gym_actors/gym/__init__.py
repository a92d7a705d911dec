"""Both sides of the Gym wire: what the trainer's client and our Gym server share, and one folder
per checkpoint protocol.

Shared here, client side: :mod:`.transport` (pools, deadlines, one HTTP exchange; the base of
each protocol's client), :mod:`.transport_errors` (the one table from aiohttp's exceptions to
ours), :mod:`.answers` (HTTP answers to values or typed errors), :mod:`.retry` (retry as policy
data, one decider), :mod:`.health` (an endpoint marked down and probed back up), :mod:`.probe`
(is each endpoint there before any row runs). Server side:
:mod:`.fence` (the checkpoint phase machine), :mod:`.store` (the durable store of executions),
:mod:`.checkpoint_files` (a commit's records and manifest; the durable-file steps both
protocols' files use),
:mod:`.state_lock` (one server per state dir),
:mod:`.agents` (agent adapters), :mod:`.web` (the HTTP conventions of every server of ours:
error bodies, the one bearer dependency, body limits, extensions) and :mod:`.server` (the one
server class: a participant served with its protocol's app factory under uvicorn).

Per protocol: :mod:`.agent_checkpoint` (``/ng-control/v1/agent-checkpoint/*`` beside ``/run``):
its client calls, its server participant (table, core, shell), its routes and fault injection.
:mod:`.v2` (NeMo Gym's v2, ``/ng-control/v1/checkpoint/*``): its wire models, client,
discovery, the controller's steps, its participant (table, episodes, shell) and routes. :mod:`.both`
(``gym serve --protocol both``): the two on one server, the v2 participant admitting each
``/run`` in front of the agent-checkpoint one, which runs and keeps it.

Nothing here imports :mod:`rl_gym_actors.core`, nor the reverse.
"""
