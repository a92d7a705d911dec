"""The Ray actors and the typed calls between them; the only Ray code besides the driver's modules.

- Rollouts: :mod:`.rollout_actor` (an actor that runs many rollouts, each driving a
  ``core.rollout`` machine), :mod:`.gym_calls` (the Gym calls that perform the machine's effects),
  :mod:`.pool` (the warm pool of rollout actors), :mod:`.chunks` (rows sent in chunks, one Ray call
  per actor per loop turn), :mod:`.messages` (what crosses Ray: ``RolloutTask``, ``ChunkResult``),
  :mod:`.reports` (the batched outbox of attempt reports to the ledger).
- The ledger: :mod:`.ledger_actor` (one per orchestrator: the book's single writer),
  :mod:`.ledger_client` (the orchestrator's typed calls to it).
- Checkpoints: :mod:`.gate_select` (each server's gate by the protocol it speaks),
  :mod:`.checkpoint_gate` (the agent-checkpoint gate: prepare, release, commit, resume on every
  endpoint), :mod:`.gate_steps` (one round of its plan performed), :mod:`.gate_endpoint` (the
  owners it asks and what it counts per endpoint), :mod:`.gym_memory` (the results a server must
  still hold, checked before any release), :mod:`.v2_gate` (the gate of v2 servers),
  :mod:`.checkpoint_abort` (resume an id everywhere).
- :mod:`.runtime`: starting a local Ray on loopback, the namespace of the named actors, and an
  actor's watch on its driver.

The decisions are ``core/``'s; these modules perform them.
"""
