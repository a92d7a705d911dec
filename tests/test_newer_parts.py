"""A restore also reads the run's newer parts beside the restored one (newer_parts.py), and a
part rewritten keeps what the old one held. Files and the orchestrator's memory only (no Ray, no
Gym: the real processes are tests/test_state_after.py's)."""

from __future__ import annotations

import pytest

from rl_gym_actors.checkpoint_part import (
    SEALED_ALT,
    SEALED_FILE,
    add_gym_v2,
    add_report,
    own_open_ids,
    part_dir,
    read_part,
    write_part,
)
from rl_gym_actors.core.checkpoint_report import CheckpointReport, V2EndpointScope
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.orchestrator import Orchestrator
from rl_gym_actors.outcome import Outcome

RUN = "grpo-after"


def sealed(rid: str, attempt: int = 0) -> Outcome:
    return Outcome(
        rollout_id=rid,
        status="sealed",
        attempt_index=attempt,
        reply={"r": rid},
        reward=1.0,
        result_digest="ab" * 32,
    )


def part(tmp_path, name, *, run_id=RUN, handed=(), undelivered=(), ids=()):
    d = tmp_path / name
    record = SealedIds()
    record.add(ids)
    write_part(
        d,
        run_id=run_id,
        checkpoint_id=f"{run_id}-{name}",
        handed=[sealed(r) for r in handed],
        undelivered=[sealed(r) for r in undelivered],
        sealed=record,
    )
    return d


def restored(restore_from) -> Orchestrator:
    return Orchestrator(
        ["http://127.0.0.1:9"], start=False, check_endpoints=False, restore_from=restore_from
    )


def test_a_restore_from_an_older_dir_gets_the_newer_parts_results(tmp_path):
    """Restored from step-1 (the trainer's state), the rows of step-2 (whose checkpoint
    released them: its part holds them, handed or not) get their results with their replies,
    as new results (the state never saw them); step-1's handed one stays ``repeated``; an id
    step-1's record sealed stays forgotten; another run's part and a torn one give nothing."""
    one = part(tmp_path, "step-1", handed=["s1-0"], ids=["s0-0"])
    part(tmp_path, "step-2", handed=["s2-0", "s1-0", "s0-0"], undelivered=["s2-1"])
    part(tmp_path, "step-3", run_id="other-run", handed=["x-0"])
    torn = part_dir(tmp_path / "step-4")
    torn.mkdir(parents=True)
    (torn / SEALED_FILE).write_bytes(SealedIds().to_bytes())  # killed before part.json
    orch = restored(one)
    try:
        plan = orch._memory.plan
        for rid in ("s2-0", "s2-1"):
            ready = plan(rid).ready
            assert ready is not None and ready.status == "sealed", rid
            assert (ready.reply, ready.repeated) == ({"r": rid}, False), rid
        again = plan("s1-0").ready
        assert again is not None and again.repeated  # handed before step-1: repeated
        assert plan("s0-0").ready is not None and plan("s0-0").ready.failure is not None
        assert plan("x-0").ready is None  # another run's: unknown here, dispatched
    finally:
        orch.close()


def test_the_readme_layout_finds_the_newer_part_one_level_down(tmp_path):
    """``checkpoint(id, root/step-N/gym)``, the trainer's state in ``root/step-N``: the newer
    part is ``root/step-2/gym``, the same name in a sibling of the restored dir's parent."""

    def nested(step: str, name: str, handed: list[str]) -> object:
        d = tmp_path / step / name
        args = dict(undelivered=[], sealed=SealedIds())
        write_part(d, run_id=RUN, checkpoint_id=step, handed=[sealed(r) for r in handed], **args)
        return d

    one = nested("step-1", "gym", [])
    nested("step-2", "gym", ["s2-0"])
    nested("step-3", "other", ["s3-0"])  # not where this run's parts are: not read
    assert own_open_ids(one, RUN, "step-1") == ["step-1", "step-2"]
    orch = restored(one)
    try:
        ready = orch._memory.plan("s2-0").ready
        assert ready is not None and (ready.reply, ready.repeated) == ({"r": "s2-0"}, False)
        assert orch._memory.plan("s3-0").ready is None
    finally:
        orch.close()


def test_a_newer_committed_part_answers_its_id_again_and_refuses_another_dir(tmp_path):
    one = part(tmp_path, "step-1")
    two = part(tmp_path, "step-2", handed=["s2-0"])
    report = CheckpointReport(checkpoint_id=f"{RUN}-step-2", checkpoint_dir=str(two), endpoints=[])
    add_report(two, report)
    orch = restored(one)
    try:
        assert orch.checkpoint(f"{RUN}-step-2", str(two)) == report  # no Gym asked
        with pytest.raises(ConfigError, match="cannot name another dir"):
            orch.checkpoint(f"{RUN}-step-2", str(tmp_path / "elsewhere"))
    finally:
        orch.close()


def test_v2_episodes_come_from_the_newest_part_under_its_gym_id(tmp_path):
    one = part(tmp_path, "step-1")
    scope = V2EndpointScope(endpoint="http://h:1", label="0", checkpoint_dir="d", exported=["k"])
    add_gym_v2(one, [scope])
    assert restored(one)._v2_part.checkpoint_id == f"{RUN}-step-1"  # no newer part
    two = tmp_path / "step-2"
    write_part(
        two,
        run_id=RUN,
        checkpoint_id=f"{RUN}-step-2",
        handed=[],
        undelivered=[],
        sealed=SealedIds(),
        gym_id=f"{RUN}-step-2-again-0a1b2c3d",
    )
    orch = restored(one)
    try:
        assert orch._v2_part is None  # Gym's last cut (step-2's) exported nothing known
    finally:
        orch.close()
    add_gym_v2(two, [scope])
    orch = restored(one)
    try:
        assert orch._v2_part.checkpoint_id == f"{RUN}-step-2-again-0a1b2c3d"
    finally:
        orch.close()


def test_a_rewritten_part_keeps_every_result_the_old_one_held(tmp_path):
    """The same id asked again under a fresh Gym id rewrites the part: what the old one held
    and the new one lacks is carried over, and the sealed-id record goes to the other name (a
    kill inside the rewrite leaves the old part whole)."""
    d = part(tmp_path, "step-2", handed=["s2-0"], undelivered=["s2-1"])
    write_part(
        d,
        run_id=RUN,
        checkpoint_id=f"{RUN}-step-2",
        handed=[sealed("s3-0")],
        undelivered=[],
        sealed=SealedIds(),
        gym_id=f"{RUN}-step-2-again-0a1b2c3d",
    )
    new, _ = read_part(d)
    assert {o.rollout_id for o in new.handed} == {"s3-0", "s2-0"}
    assert [o.rollout_id for o in new.undelivered] == ["s2-1"]
    assert new.sealed.name == SEALED_ALT and not (part_dir(d) / SEALED_FILE).exists()
    assert new.gym_checkpoint_id == f"{RUN}-step-2-again-0a1b2c3d"
