"""The v2 gate and the replies our v2 server keeps (issue 18), without Ray: a real ``gym serve
--protocol v2`` on loopback, the ledger's book and :class:`V2Gate`. A kept reply nobody will
ever read (a run the book never saw, or one whose owner is gone though it still counts as live)
is retired by the checkpoint and forgotten once no live owner holds its rollout; a sealed one is
forgotten after the commit; another run's is left alone."""

from __future__ import annotations

import time

import pytest

from rl_gym_actors.actors.gate_endpoint import OwnerAnswer
from rl_gym_actors.actors.v2_gate import V2Gate
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.attempt_reports import AttemptReport, AttemptState
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.coordinate import Participant
from rl_gym_actors.protocol import result_digest
from rl_gym_actors.testing.v2_server import V2ServerThread

aio = pytest.mark.asyncio(loop_scope="session")


def soon(seconds: float = 10.0) -> float:
    return time.time() + seconds


class Owners:
    """``lost`` counts as live (its node went away unnoticed) until ``forget_lost``; asked to
    adopt it answers GONE, as a dead actor's call does."""

    def __init__(self) -> None:
        self.names = {"lost"}
        self.asked: list[tuple[str, str, int]] = []

    def forget_lost(self) -> None:
        self.names.discard("lost")

    def live(self) -> frozenset[str]:
        return frozenset(self.names)

    async def adopt(self, owner, rollout_id, attempt_index, deadline_ts) -> OwnerAnswer:
        self.asked.append((owner, rollout_id, attempt_index))
        return OwnerAnswer.GONE

    async def flush(self, deadline_ts, checkpoint_id=None) -> int:
        return len(self.names)


@aio
async def test_kept_replies_nobody_reads_are_retired_and_forgotten(tmp_path):
    with V2ServerThread() as srv:
        async with GymClient(srv.endpoint) as gym:
            url = srv.endpoint.url
            replies = {}
            for rid in ("run-lost", "run-unseen", "run-sealed", "other-x"):
                result = await gym.run({}, rollout_id=rid, attempt_index=0, deadline_ts=soon())
                replies[rid] = result.reply
            book, owners = AttemptBook([url]), Owners()
            book.apply(AttemptReport("run-lost", 0, url, AttemptState.RUNNING, "lost"))
            book.apply(AttemptReport("run-sealed", 0, url, AttemptState.RUNNING, "gone-owner"))
            digest = result_digest(replies["run-sealed"])
            book.apply(
                AttemptReport(
                    "run-sealed", 0, url, AttemptState.SEALED, "gone-owner", released=True,
                    result_digest=digest,
                )
            )  # fmt: skip
            part = Participant("gym", "agent", V2Client(gym))

            async def checkpoint(cid: str):
                gate = V2Gate(
                    book,
                    [srv.endpoint],
                    ["gym"],
                    [part],
                    owners,
                    control_s=5.0,
                    own=lambda rid: rid.startswith("run-"),
                )
                [entry] = await gate.run(cid, str(tmp_path / cid), soon(20))
                book.record_checkpoint(cid, committed=True)
                return entry, srv.participant.status()

            entry, status = await checkpoint("ck-1")
            assert owners.asked == [("lost", "run-lost", 0)]  # the book's running one only
            assert entry.orphans_acked == 2  # run-lost (its owner gone) and run-unseen
            assert entry.forgotten == 2  # run-sealed (finished for good) and run-unseen
            assert status["kept_replies"] == 1  # another run's reply is not this gate's
            assert status["retired_rollouts"] == 1  # run-lost: its owner still counts as live
            owners.forget_lost()
            entry, status = await checkpoint("ck-2")
            assert (entry.orphans_acked, entry.forgotten) == (0, 1)
            assert (status["kept_replies"], status["retired_rollouts"]) == (1, 0)
            listed = await V2Client(gym).kept(deadline_ts=soon())
            assert listed is not None and listed.kept == ["other-x"]
