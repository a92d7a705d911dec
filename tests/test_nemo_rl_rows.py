"""The pure half of the NeMo RL drop-in: identity, the rollout book, failures, message logs."""

from __future__ import annotations

import pickle

import pytest

from rl_gym_actors.core.rollout_record import RolloutState
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.integrations.nemo_rl.rows import (
    ClaimAction,
    RolloutBook,
    RolloutDataError,
    RolloutTimeoutError,
    RolloutTransportError,
    StreamTimer,
    failure_class,
    failure_for,
    row_digest,
)
from rl_gym_actors.protocol import is_valid_rollout_id


def rows(*specs):
    return [{"_rowidx": i, **spec} for i, spec in enumerate(specs)]


def test_digest_ignores_volatile_fields_only():
    a = {"_rowidx": 1, "prompt": "x", "_ng_task_index": 3}
    b = {"_rowidx": 7, "prompt": "x", "_ng_task_index": 3, "_ng_attempt_index": 2}
    assert row_digest(a) == row_digest(b)
    assert row_digest(a) != row_digest({**a, "_ng_task_index": 4})
    assert row_digest({"_rowidx": 0, "obj": object}) == row_digest({"_rowidx": 1, "obj": object})


def test_identical_rows_get_distinct_valid_ids_and_start_at_try_zero():
    book = RolloutBook("run-a")
    claims = book.claim(rows({"p": 1}, {"p": 1}, {"p": 2}), stream=1, now=0.0)
    ids = [c.rollout_id for c in claims]
    assert len(set(ids)) == 3 and all(is_valid_rollout_id(i) for i in ids)
    assert all(c.action is ClaimAction.START for c in claims)
    assert all(i.startswith("run-a-") for i in ids)


def test_redispatch_prefers_finished_then_running_then_failed_and_never_a_delivered_one():
    book = RolloutBook("run")
    first = book.claim(rows({"p": 1}, {"p": 1}, {"p": 1}, {"p": 1}), stream=1, now=0.0)
    done, running, failed, delivered = (c.rollout_id for c in first)
    book.settle(done, ok=True, now=1.0)
    book.settle(failed, ok=False, now=1.0)
    book.settle(delivered, ok=True, now=1.0)
    book.deliver(delivered, now=1.0)
    book.release(1)

    again = book.claim(rows({"p": 1}, {"p": 1}, {"p": 1}, {"p": 1}), stream=2, now=2.0)
    assert [c.rollout_id for c in again[:3]] == [done, running, failed]
    assert [c.action for c in again[:3]] == [
        ClaimAction.REUSE,
        ClaimAction.REUSE,
        ClaimAction.START,
    ]
    assert again[3].rollout_id not in first and again[3].action is ClaimAction.START
    assert again[3].rollout_id != delivered
    assert book.stats.reused == 2


def test_free_rollouts_are_preferred_and_a_watched_one_is_shared_not_rerun():
    book = RolloutBook("run")
    (a,) = book.claim(rows({"p": 1}), stream=1, now=0.0)
    book.settle(a.rollout_id, ok=False, now=0.0)
    book.release(1)
    (b,) = book.claim(rows({"p": 1}), stream=2, now=0.0)  # the free, failed one: next try
    assert (b.rollout_id, b.action) == (a.rollout_id, ClaimAction.START)
    (c,) = book.claim(rows({"p": 1}), stream=3, now=0.0)  # watched by stream 2: shared
    assert (c.rollout_id, c.action) == (a.rollout_id, ClaimAction.REUSE)
    book.settle(a.rollout_id, ok=True, now=1.0)
    assert book.available(a.rollout_id)
    assert book.deliver(a.rollout_id, now=1.0)  # stream 3 hands it out first
    assert not book.deliver(a.rollout_id, now=1.0) and book.stats.lost_races == 1
    d = book.reclaim({"_rowidx": 0, "p": 1}, stream=2, now=1.0)
    assert d.rollout_id != a.rollout_id and d.action is ClaimAction.START
    assert book.state(a.rollout_id) is RolloutState.SEALED


def test_a_stream_never_watches_one_rollout_for_two_rows_and_release_frees_its_rollouts():
    book = RolloutBook("run")
    a, b = book.claim(rows({"p": 1}, {"p": 1}), stream=1, now=0.0)
    assert a.rollout_id != b.rollout_id
    book.settle(a.rollout_id, ok=True, now=0.0)
    book.release(1)  # cancelled before it yielded
    first, second = book.claim(rows({"p": 1}, {"p": 1}), stream=2, now=0.0)
    assert (first.rollout_id, first.action) == (a.rollout_id, ClaimAction.REUSE)  # finished first
    assert (second.rollout_id, second.action) == (b.rollout_id, ClaimAction.REUSE)


def test_explicit_identity_is_kept_and_a_failed_one_starts_again():
    # which try it starts at is the orchestrator's rollout memory's to say (test_rollout_memory)
    book = RolloutBook("run")
    row = {"_rowidx": 5, "_ng_rollout_id": "rD", "_ng_attempt_index": 3}
    (claim,) = book.claim([row], stream=1, now=0.0)
    assert (claim.rowidx, claim.rollout_id, claim.action) == (5, "rD", ClaimAction.START)
    book.settle("rD", ok=False, now=0.0)
    book.release(1)
    (claim,) = book.claim([{**row, "_ng_attempt_index": 0}], stream=2, now=0.0)
    assert (claim.rollout_id, claim.action) == ("rD", ClaimAction.START)


@pytest.mark.parametrize(
    "bad",
    [
        [{"p": 1}],  # no _rowidx
        [{"_rowidx": "0"}],
        [{"_rowidx": 0}, {"_rowidx": 0}],
        [{"_rowidx": 0, "_ng_rollout_id": "bad id"}],
        [{"_rowidx": 0, "_ng_rollout_id": "ok", "_ng_attempt_index": -1}],
        [{"_rowidx": 0, "_ng_rollout_id": "r"}, {"_rowidx": 1, "_ng_rollout_id": "r"}],
        ["not a dict"],
    ],
)
def test_bad_rows_are_a_data_failure_and_claim_nothing(bad):
    book = RolloutBook("run")
    with pytest.raises(RolloutDataError):
        book.claim(bad, stream=1, now=0.0)
    assert len(book) == 0


def test_bad_prefix_is_a_config_error():
    with pytest.raises(ConfigError):
        RolloutBook("has space")


def test_expire_forgets_old_unclaimed_results_and_caps_the_book():
    book = RolloutBook("run", hold_s=10.0, max_entries=2)
    claims = book.claim(rows({"p": 1}, {"p": 2}, {"p": 3}, {"p": 4}), stream=1, now=0.0)
    for c in claims:
        book.settle(c.rollout_id, ok=True, now=1.0)
    book.deliver(claims[0].rollout_id, now=1.0)
    book.release(1)
    dropped = book.expire(now=5.0)  # nothing is old yet; the cap drops two
    assert len(book) == 2
    assert claims[0].rollout_id not in dropped  # delivered ones go first and need no cleanup
    assert book.state(claims[0].rollout_id) is None
    dropped = book.expire(now=100.0)
    assert len(book) == 0 and len(dropped) == 2 and book.stats.expired == 3


def test_running_rollouts_are_never_expired():
    book = RolloutBook("run", hold_s=0.0, max_entries=0)
    (c,) = book.claim(rows({"p": 1}), stream=1, now=0.0)
    book.release(1)
    assert book.expire(now=1e9) == [] and book.state(c.rollout_id) is RolloutState.RUNNING


def test_failure_classes_are_what_nemo_rl_classifies_and_pickle_with_one_argument():
    assert failure_class(FailureKind.REJECTED) is RolloutDataError  # a 4xx
    assert failure_class(FailureKind.PROTOCOL) is RolloutDataError
    assert failure_class(FailureKind.INVALID_REPLY) is RolloutDataError
    assert failure_class(FailureKind.AGENT_FAILED) is RolloutTransportError  # a 5xx
    assert failure_class(FailureKind.DEADLINE) is RolloutTimeoutError
    assert failure_class(FailureKind.LOST) is RolloutTransportError
    assert failure_class(None) is RolloutTransportError
    assert issubclass(RolloutTransportError, ConnectionError)
    assert issubclass(RolloutTimeoutError, TimeoutError)
    assert not issubclass(RolloutDataError, (ConnectionError, TimeoutError))
    for cls in (RolloutDataError, RolloutTimeoutError, RolloutTransportError):
        err = pickle.loads(pickle.dumps(cls("why")))
        assert type(err) is cls and err.args == ("why",)


def test_failure_for_lets_a_data_failure_win_and_summarises():
    lost, late, bad = FailureKind.LOST, FailureKind.DEADLINE, FailureKind.REJECTED
    infra = failure_for([(1, lost, "connection_lost"), (2, late, "deadline_exceeded")], 8)
    assert isinstance(infra, RolloutTransportError) and "2 of 8" in str(infra)
    mixed = failure_for([(1, lost, "lost")] + [(i, bad, "invalid_request") for i in range(2, 9)], 9)
    assert isinstance(mixed, RolloutDataError) and "and 3 more" in str(mixed)
    assert isinstance(failure_for([(0, late, "deadline_exceeded")], 1), RolloutTimeoutError)
    # the reason's words decide nothing: a data word in an infrastructure failure stays infra
    assert isinstance(
        failure_for([(0, lost, "invalid_request protocol config")], 1), RolloutTransportError
    )


def test_stream_timer_reports_the_postprocess_share():
    t = StreamTimer("gym")
    t.add("await_results", 3.0)
    t.add("postprocess_results", 1.0)
    m = t.metrics(total_s=4.0)
    assert m == {
        "gym/await_results": 3.0,
        "gym/postprocess_results": 1.0,
        "gym/postprocess_results_pct": 25.0,
    }


# ---------------------------------------------------------------- ids without NeMo RL's help


def nemo_rl_rows(n, **fields):
    """Rows as NeMo RL main's _prepare_nemo_gym_rows leaves them: _rowidx, no rollout id."""
    return [
        {"_rowidx": i, "responses_create_params": {"input": f"q{i}"}, **fields} for i in range(n)
    ]


def test_ids_of_rows_without_one_are_derived_from_run_call_rowidx_and_digest():
    book = RolloutBook("run7")
    first = book.claim(nemo_rl_rows(3), stream=1, now=0.0)
    second = book.claim(nemo_rl_rows(3, epoch=2), stream=2, now=0.0)
    assert [c.rollout_id.split("-")[:3] for c in first] == [
        ["run7", "c1", f"r{i}"] for i in range(3)
    ]
    assert all(c.rollout_id.startswith("run7-c2-") for c in second)
    assert all(is_valid_rollout_id(c.rollout_id) for c in first + second)
    assert book.durable_state() == {"prefix": "run7", "calls": 2}


def test_a_restored_book_mints_the_ids_its_dead_instance_minted_and_a_changed_row_never():
    dead = RolloutBook("run7-a1b2c3d4")
    dead.claim(nemo_rl_rows(2), stream=1, now=0.0)
    saved = dead.durable_state()  # what the checkpoint after call 1 keeps
    after = [c.rollout_id for c in dead.claim(nemo_rl_rows(4, step=2), stream=2, now=0.0)]

    restored = RolloutBook("run7-ffffffff")  # a new instance: another suffix until restored
    restored.restore(saved)
    again = [c.rollout_id for c in restored.claim(nemo_rl_rows(4, step=2), stream=9, now=0.0)]
    assert again == after  # the same ids: the dead instance's results are adopted, not rerun

    changed = RolloutBook("x")
    changed.restore(saved)
    other = changed.claim(nemo_rl_rows(4, step=2, temperature=0.5), stream=1, now=0.0)
    assert not {c.rollout_id for c in other} & set(after)


def test_a_bad_checkpointed_counter_is_a_config_error():
    with pytest.raises(ConfigError):
        RolloutBook("r").restore({"prefix": "r", "calls": -1})
    with pytest.raises(ConfigError):
        RolloutBook("r").restore({"prefix": "bad id", "calls": 1})
