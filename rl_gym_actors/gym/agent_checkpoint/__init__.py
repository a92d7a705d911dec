"""The agent-checkpoint protocol (``/ng-control/v1/agent-checkpoint/*``, ``/run``), both sides.

- :mod:`.client`: :class:`~.client.GymClient`, the trainer side's calls of this protocol.
- :mod:`.client_answers`: the client's pure side (its ``/run`` result, a prepare 409 as a value,
  the receipt header, the checks of the keys and receipts it is given).
- :mod:`.machine`: the lifecycle of one execution key as one table (state x event -> state).
- :mod:`.core`: :class:`~.core.ParticipantCore`, every decision of the server side, pure.
- :mod:`.participant`: :class:`~.participant.Participant`, the async shell around the core.
- :mod:`.lease`: :class:`~.lease.LeaseTimer`, the shell's timer on the checkpoint lease.
- :mod:`.settled`: the compact record of keys that were ACKed or tombstoned.
- :mod:`.routes`: :func:`~.routes.create_app`, the HTTP routes of this protocol's server.
- :mod:`.faults`: fault injection (``--allow-faults``), a middleware the routes never see.

What both protocols share (keys, typed errors, retry, endpoint health, the fence, the store, the
agents and the HTTP server) lives one floor up, in :mod:`rl_gym_actors.gym`.
"""
