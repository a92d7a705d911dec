"""The drop-in's checkpoint calls, as NeMo RL's checkpoint-participant work names them; the
shapes and their meaning are described in :mod:`.participants`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import CheckpointFailed, RlGymError
from rl_gym_actors.integrations.nemo_rl import participants as shapes
from rl_gym_actors.integrations.nemo_rl.checkpoints import CheckpointSteps
from rl_gym_actors.integrations.nemo_rl.dropin_part import read_part, write_part
from rl_gym_actors.integrations.nemo_rl.participants import CheckpointDeadline, ReceiptBook
from rl_gym_actors.protocol import StatusReport


class CheckpointCalls:
    """Mixed into the drop-in, which provides ``_steps``, ``_orch``, ``endpoints``,
    ``receipts`` (a :class:`ReceiptBook`), ``_held_count()``, ``_require_spinup()`` and
    ``_gym_status()``."""

    _steps: CheckpointSteps
    _orch: Any
    endpoints: list[GymEndpoint]
    receipts: ReceiptBook
    _participant_names: dict[str, str]
    _topology: dict[str, Any] | None
    _book: Any  # a RolloutBook: its run id and call counter are this actor's checkpoint part

    # the drop-in's own methods, declared for the type checker
    _require_spinup: Callable[[], None]
    _held_count: Callable[[], int]
    _gym_status: Callable[[str], Awaitable[dict[str, StatusReport | RlGymError]]]

    def _identities(self) -> list[dict[str, str]]:
        return shapes.identities(self.endpoints, self._participant_names)

    async def discover_checkpoint_capabilities(
        self, server_names: list[str] | None = None
    ) -> dict[str, Any]:
        """Every (or each named) Gym server's capabilities as the participant topology."""
        from rl_gym_actors.gym.agent_checkpoint.client import GymClient

        self._require_spinup()
        chosen = [
            (i, e)
            for i, e in enumerate(self.endpoints)
            if server_names is None or shapes.server_name(e, i) in server_names
        ]
        if not chosen or (server_names is not None and len(chosen) != len(set(server_names))):
            raise RuntimeError(f"no Gym checkpoint participants named {server_names}")

        async def one(endpoint: GymEndpoint) -> dict[str, Any] | None:
            async with GymClient(endpoint) as client:
                caps = await client.capabilities(deadline_ts=time.time() + 10.0)
            return None if caps is None else caps.model_dump(mode="json")

        answers = await asyncio.gather(*(one(e) for _, e in chosen))
        contracts = []
        for (i, endpoint), caps in zip(chosen, answers, strict=True):
            server = shapes.server_name(endpoint, i)
            name = (caps or {}).get("name")
            if isinstance(name, str) and name:
                self._participant_names[server] = name
            identity = shapes.identities([endpoint], self._participant_names)[0]
            contracts.append(shapes.contract({**identity, "server_name": server}, caps))
        self._topology = shapes.topology(contracts)
        return self._topology

    async def prepare_checkpoint(self, checkpoint_id: str, deadline_ts: float) -> dict[str, Any]:
        """Close admission and drain this actor's rollouts by ``deadline_ts``."""
        self._require_spinup()
        try:
            await self._steps.prepare(
                checkpoint_id, deadline_ts, facts=lambda: {"held_results": self._held_count()}
            )
        except CheckpointFailed as exc:
            self._steps.give_up(checkpoint_id)
            raise CheckpointDeadline(
                f"checkpoint {checkpoint_id} did not prepare by its "
                f"deadline; admission reopened: {exc}"
            ) from None
        return await self._prepare_answer(checkpoint_id)

    async def _prepare_answer(self, checkpoint_id: str) -> dict[str, Any]:
        recorded = self._steps.answer(checkpoint_id, "participants")
        if recorded is not None:
            return recorded
        statuses = await self._gym_status(checkpoint_id)
        participants = [
            {
                "participant": ident,
                "ready": True,
                "payload": shapes.prepare_payload(statuses.get(e.url)),
            }
            for ident, e in zip(self._identities(), self.endpoints, strict=True)
        ]
        answer = {"checkpoint_id": checkpoint_id, "ready": True, "participants": participants}
        return self._steps.record(checkpoint_id, "participants", answer)

    async def commit_checkpoint(
        self, checkpoint_id: str, deadline_ts: float, checkpoint_dir: str
    ) -> dict[str, Any]:
        """Run the ledger's gate into ``checkpoint_dir`` (after a ready prepare)."""
        self._require_spinup()

        async def gate(cid: str, directory: str, deadline_s: float) -> Any:
            # this actor's part first: durable before the gate releases anything on Gym
            await asyncio.to_thread(write_part, directory, self._book.durable_state())
            return await self._orch.acheckpoint(cid, directory, deadline_s=deadline_s)

        committed = await self._steps.commit(checkpoint_id, checkpoint_dir, gate, deadline_ts)
        if "participants" not in committed:
            committed["participants"] = [
                shapes.commit_participant(
                    ident, checkpoint_dir, e["checkpoint_dir"], _Commit(e.get("commit"))
                )
                for ident, e in zip(self._identities(), committed["endpoints"], strict=True)
            ]
        return {"checkpoint_id": checkpoint_id, "participants": committed["participants"]}

    async def resume_checkpoint(self, checkpoint_id: str, deadline_ts: float) -> dict[str, Any]:
        """Reopen admission after a commit, a restore or an abandoned prepare."""
        self._steps.end(checkpoint_id)
        return {
            "checkpoint_id": checkpoint_id,
            "participants": [
                {"participant": ident, "payload": dict(shapes.RESUMED)}
                for ident in self._identities()
            ],
        }

    async def abort_checkpoint(self, checkpoint_id: str, deadline_ts: float) -> dict[str, Any]:
        """Give up a checkpoint that is not published: the same as resuming."""
        return await self.resume_checkpoint(checkpoint_id, deadline_ts)

    async def restore_checkpoint(
        self,
        checkpoint_id: str,
        deadline_ts: float,
        checkpoint_dir: str,
        source_checkpoint_id: str | None = None,
        generation_cut_proofs: tuple[dict[str, object], ...] = (),
        generation_cut_exclusions: tuple[dict[str, object], ...] = (),
    ) -> dict[str, Any]:
        """Check every participant's part of ``checkpoint_dir`` and hold admission closed
        until ``resume_checkpoint``. Generation-cut arguments concern a policy model
        participant; there is none here, so they must be empty."""
        self._require_spinup()
        if generation_cut_proofs or generation_cut_exclusions:
            raise ValueError(
                "generation cuts concern a policy model participant; the drop-in has none"
            )
        try:
            await self._steps.prepare(checkpoint_id, deadline_ts)
        except CheckpointFailed as exc:
            self._steps.give_up(checkpoint_id)
            raise CheckpointDeadline(f"restore {checkpoint_id}: {exc}") from None
        try:
            part = await asyncio.to_thread(read_part, checkpoint_dir)
            if part is not None:  # the run id and call counter: the same ids again
                self._book.restore(part)
                # the layer's part the gate wrote before releasing anything: the results the
                # dead instance sealed answer re-sent rows (repeated), never a rerun
                await self._orch.arestore(checkpoint_dir)
            parts = [
                shapes.restored_participant(ident, checkpoint_dir, where, source_checkpoint_id)
                for ident, where in zip(
                    self._identities(),
                    shapes.endpoint_dirs(checkpoint_dir, self.endpoints),
                    strict=True,
                )
            ]
        except (CheckpointFailed, RlGymError):
            self._steps.give_up(checkpoint_id)
            raise
        return {"checkpoint_id": checkpoint_id, "participants": parts}

    async def acknowledge_completed_executions(
        self, executions: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Record RL's ownership of results this actor handed out (see the module doc)."""
        return self.receipts.acknowledge(list(executions))


class _Commit:
    """The commit answer of one endpoint as recorded (a dict) with attribute access."""

    def __init__(self, answer: Any) -> None:
        self.manifest_digest = (answer or {}).get("manifest_digest")
        self.continuation_index = (answer or {}).get("continuation_index")
