"""The ledger's pure core: the book folds reports in any order; the prepare plan covers every
attempt Gym lists and never touches what a live owner holds as its current try."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rl_gym_actors.core.attempt_book import AttemptBook, GateAck, LedgerSnapshot, merge_reports
from rl_gym_actors.core.attempt_reports import AttemptReport, AttemptState
from rl_gym_actors.core.prepare_plan import PrepareAction, orphan_step, plan_endpoint
from rl_gym_actors.protocol import AttemptInfo, CompletionReceipt, StatusReport

EPS = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
OWNERS = ["o-a", "o-b", "o-c"]
RIDS = ["r0", "r1", "r2", "r3"]
STRENGTH = {
    AttemptState.RUNNING: 0,
    AttemptState.SEALED: 1,
    AttemptState.TOMBSTONED: 2,
    AttemptState.ACKED: 3,
}

reports_st = st.builds(
    AttemptReport,
    rollout_id=st.sampled_from(RIDS),
    attempt_index=st.integers(0, 2),
    endpoint=st.sampled_from(EPS),
    state=st.sampled_from(list(AttemptState)),
    owner=st.sampled_from(OWNERS),
    adopted=st.booleans(),
    released=st.sampled_from([False, False, True]),
)


def one_endpoint(reports: list[AttemptReport]) -> list[AttemptReport]:
    """Real reports keep a rollout's tries on one endpoint (chosen by rollout id)."""
    return [
        AttemptReport(
            r.rollout_id,
            r.attempt_index,
            EPS[RIDS.index(r.rollout_id) % 2],
            r.state,
            r.owner,
            r.adopted,
            r.released,
        )
        for r in reports
    ]


def reference(reports: list[AttemptReport]) -> dict:
    """The book, computed declaratively from the whole set of reports at once."""
    keys = {(r.rollout_id, r.attempt_index) for r in reports}
    of = {k: [r for r in reports if (r.rollout_id, r.attempt_index) == k] for k in keys}
    state = {k: max((r.state for r in rs), key=STRENGTH.__getitem__) for k, rs in of.items()}
    endpoint = {k: min(r.endpoint for r in rs) for k, rs in of.items()}
    adopted = {k: any(r.adopted for r in rs) for k, rs in of.items()}
    owner = {k: max(r.owner for r in rs) for k, rs in of.items()}
    current = {rid: max(a for r_, a in keys if r_ == rid) for rid, _ in keys}
    released_at = {
        rid: max(
            [r.attempt_index for r in reports if r.rollout_id == rid and r.released], default=-1
        )
        for rid in current
    }
    counts: dict[str, dict[str, int]] = {}
    bucket = {
        AttemptState.RUNNING: "running",
        AttemptState.SEALED: "completed_unacked",
        AttemptState.ACKED: "acked",
        AttemptState.TOMBSTONED: "tombstoned",
    }
    for k in keys:
        c = counts.setdefault(
            endpoint[k],
            dict.fromkeys(
                ["dispatched", "running", "completed_unacked", "acked", "tombstoned", "adopted"], 0
            ),
        )
        c["dispatched"] += 1
        c[bucket[state[k]]] += 1
        c["adopted"] += adopted[k]
    held: dict[str, int] = {}
    for rid, cur in current.items():
        if released_at[rid] < cur:
            held[owner[(rid, cur)]] = held.get(owner[(rid, cur)], 0) + 1
    return {
        "state": state,
        "owner": owner,
        "current": current,
        "released_at": released_at,
        "counts": counts,
        "held": held,
    }


def counts_of(snap: LedgerSnapshot) -> dict[str, dict[str, int]]:
    return {
        ep: e.model_dump(exclude={"endpoint", "invariant_ok"}) for ep, e in snap.endpoints.items()
    }


def book_of(reports: list[AttemptReport]) -> AttemptBook:
    book = AttemptBook()
    book.apply_all(reports)
    return book


def assert_same_book(reports: list[AttemptReport], other: list[AttemptReport]) -> None:
    """Both lists fold into the same book (the report count apart)."""
    a, b = book_of(reports), book_of(other)
    assert a.snapshot().model_dump(exclude={"reports"}) == b.snapshot().model_dump(
        exclude={"reports"}
    )
    for r in reports:
        assert a.attempt(r.rollout_id, r.attempt_index) == b.attempt(r.rollout_id, r.attempt_index)


# ---------------------------------------------------------------------------- the book


@pytest.mark.slow  # seconds: out of make test-fast
@settings(max_examples=150, deadline=None)
@given(st.lists(reports_st, max_size=30), st.randoms(use_true_random=False))
def test_any_order_and_repetition_give_the_same_book(reports, rnd):
    shuffled = list(reports) + rnd.sample(reports, k=len(reports) // 2)  # some arrive twice
    rnd.shuffle(shuffled)
    assert_same_book(reports, shuffled)


@pytest.mark.slow  # seconds: out of make test-fast
@settings(max_examples=150, deadline=None)
@given(st.lists(reports_st, max_size=30), st.integers(1, 7), st.data())
def test_an_outbox_that_merges_waiting_reports_gives_the_same_book(reports, batch_size, data):
    """The rollout actor's outbox merges a report into a waiting one of the same attempt (never
    into one already in flight): the ledger's book comes out the same, from fewer reports."""
    import asyncio

    from rl_gym_actors.actors.reports import ReportOutbox

    sent: list[AttemptReport] = []

    async def go() -> None:
        gate = asyncio.Event()

        async def send(batch: list[AttemptReport]) -> None:
            await gate.wait()  # a batch stays in flight while more arrive
            sent.extend(batch)

        outbox = ReportOutbox(send, batch_size=batch_size, interval_s=3600)
        flushing = None
        for i, r in enumerate(reports):
            outbox.add(r)
            if flushing is None and data.draw(st.booleans(), label=f"start a flush at {i}"):
                flushing = asyncio.ensure_future(outbox.flush())
                await asyncio.sleep(0)  # its first batch is now in flight
        gate.set()
        if flushing is not None:
            await flushing
        await outbox.flush()
        outbox.close()

    asyncio.run(go())
    assert len(sent) <= len(reports)
    assert_same_book(reports, sent)


@settings(max_examples=150, deadline=None)
@given(st.lists(reports_st, max_size=30))
def test_book_matches_the_declarative_reference(reports):
    book, ref = book_of(reports), reference(reports)
    snap = book.snapshot()
    assert counts_of(snap) == ref["counts"]
    assert snap.owners == ref["held"]
    assert snap.invariant_ok and all(e.invariant_ok for e in snap.endpoints.values())
    for (rid, att), state in ref["state"].items():
        view = book.attempt(rid, att)
        assert view is not None and view.state is state and view.owner == ref["owner"][(rid, att)]
        assert view.current == (ref["current"][rid] == att)
        assert view.released == (ref["released_at"][rid] >= att)


class BookMachine(RuleBasedStateMachine):
    """Reports and the ledger's own findings interleave; the counters always match a recount."""

    def __init__(self) -> None:
        super().__init__()
        self.book = AttemptBook()
        self.folded: list[AttemptReport] = []

    @rule(report=reports_st)
    def report(self, report):
        self.book.apply(report)
        self.folded.append(report)

    @rule(
        rid=st.sampled_from(RIDS),
        att=st.integers(0, 2),
        ep=st.sampled_from(EPS),
        state=st.sampled_from([AttemptState.ACKED, AttemptState.TOMBSTONED]),
    )
    def ledger_finding(self, rid, att, ep, state):
        self.book.record(ep, rid, att, state)
        self.folded.append(AttemptReport(rid, att, ep, state, ""))

    @invariant()
    def counters_match_a_recount(self):
        snap = self.book.snapshot()
        assert snap.invariant_ok
        ref = reference(self.folded)
        assert counts_of(snap) == ref["counts"]
        assert snap.owners == {o: n for o, n in ref["held"].items() if o}
        assert snap.attempts == len(ref["state"])


TestBookMachine = BookMachine.TestCase
TestBookMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_state_only_moves_up_and_acked_beats_tombstoned():
    book = AttemptBook()
    ep = EPS[0]
    for state in (
        AttemptState.ACKED,
        AttemptState.RUNNING,
        AttemptState.SEALED,
        AttemptState.TOMBSTONED,
    ):
        book.apply(AttemptReport("r", 0, ep, state, "o-a"))
    assert book.attempt("r", 0).state is AttemptState.ACKED
    snap = book.snapshot().endpoints[ep]
    assert (snap.dispatched, snap.acked, snap.running, snap.tombstoned) == (1, 1, 0, 0)


def test_a_later_try_takes_the_rollout_back_after_a_release():
    book = AttemptBook()
    ep = EPS[0]
    book.apply(AttemptReport("r", 0, ep, AttemptState.TOMBSTONED, "o-a", released=True))
    assert book.owners() == {}
    book.apply(AttemptReport("r", 1, ep, AttemptState.RUNNING, "o-b"))
    assert book.owners() == {"o-b": 1}
    assert book.claimant("r", 1, ep, {"o-b"}) == "o-b"
    assert book.claimant("r", 0, ep, {"o-a", "o-b"}) is None


@pytest.mark.slow
def test_snapshot_stays_cheap_at_100k_attempts():
    book = AttemptBook()
    reports = [
        AttemptReport(f"r{i}", 0, EPS[i % 2], AttemptState.RUNNING, f"o-{i % 64}")
        for i in range(100_000)
    ]
    start = time.perf_counter()
    book.apply_all(reports)
    fold_s = time.perf_counter() - start
    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        snap = book.snapshot()
        best = min(best, time.perf_counter() - start)
    assert snap.attempts == 100_000 and snap.invariant_ok
    assert sum(e.dispatched for e in snap.endpoints.values()) == 100_000
    # O(endpoints + owners), not O(attempts): far below one per-attempt pass
    assert best < fold_s / 50, (best, fold_s)


# ---------------------------------------------------------------------------- the plan


def receipt_for(rid: str, att: int) -> CompletionReceipt:
    return CompletionReceipt.for_reply(rid, att, 1, {"id": f"r-{rid}", "reward": 0.5})


gym_states = st.sampled_from(["running", "parked", "completed", "acknowledged", "tombstoned"])
listing_st = st.dictionaries(
    st.tuples(st.sampled_from([*RIDS, "zz"]), st.integers(0, 2)),
    st.tuples(gym_states, st.booleans(), st.booleans()),
    max_size=12,
)


def status_of(listing) -> StatusReport:
    """A status with each attempt in ``executions`` and/or its own list (a real Gym may omit
    either), completed ones with or without their receipt."""
    executions, blocking, completed = [], [], []
    for (rid, att), (state, in_list, with_receipt) in listing.items():
        receipt = receipt_for(rid, att) if state == "completed" and with_receipt else None
        info = AttemptInfo(
            rollout_id=rid, attempt_index=att, state=state, completion_receipt=receipt
        )
        if not in_list or state not in ("running", "parked", "completed"):
            executions.append(info)
        elif state == "completed":
            completed.append(info)
        else:
            blocking.append(info)
    return StatusReport(
        state="preparing",
        executions=executions,
        blocking_attempts=blocking,
        completed_unacknowledged_attempts=completed,
    )


@pytest.mark.slow  # seconds: out of make test-fast
@settings(max_examples=200, deadline=None)
@given(
    st.lists(reports_st, max_size=25), listing_st, st.sets(st.sampled_from(OWNERS)), st.booleans()
)
def test_plan_covers_every_attempt_and_never_takes_a_live_current_try(
    reports, listing, live, retire_unknown
):
    reports = one_endpoint(reports)
    ep = EPS[0]
    book, ref = book_of(reports), reference(reports)
    steps = plan_endpoint(status_of(listing), book, ep, live, retire_unknown=retire_unknown)
    by_key = {s.key: s for s in steps}
    assert len(by_key) == len(steps), "one step per attempt"

    def held_by_live_owner(rid, att):  # the reference's answer, independent of AttemptBook.claimant
        return (
            ref["current"].get(rid) == att
            and ref["released_at"][rid] < att
            and EPS[RIDS.index(rid) % 2] == ep
            and ref["owner"][(rid, att)] in live
        )

    for (rid, att), (state, _, with_receipt) in listing.items():
        step = by_key.get((rid, att))
        known = (rid, att) in ref["state"]
        if state == "completed":
            assert step is not None, "a completed un-ACKed attempt is never left alone"
            if held_by_live_owner(rid, att):
                assert step.action is PrepareAction.ADOPT and step.owner == ref["owner"][(rid, att)]
            else:
                assert step.action is PrepareAction.ORPHAN_ACK
            assert (step.receipt is not None) == with_receipt
        elif state in ("running", "parked"):
            assert step is not None
            if held_by_live_owner(rid, att):
                assert step.action is PrepareAction.WAIT and step.owner in live
            elif known or retire_unknown:
                assert step.action is PrepareAction.RETIRE, "an unowned run is never waited on"
            else:
                assert step.action is PrepareAction.WAIT and step.owner is None
        else:
            assert step is None
    for step in steps:
        if step.action is PrepareAction.ADOPT:
            assert ref["current"][step.rollout_id] == step.attempt_index
        if step.action is PrepareAction.RETIRE:
            assert not held_by_live_owner(step.rollout_id, step.attempt_index)


def test_seed_scenario_plan():
    """(rD, 0) finished but its reply was lost and the rollout moved on to try 1: ACK the orphan;
    try 1 still runs for its live owner: wait; (rT, 0) runs for nobody: retire."""
    ep = EPS[0]
    book = book_of(
        [
            AttemptReport("rD", 0, ep, AttemptState.RUNNING, "o-a"),
            AttemptReport("rD", 0, ep, AttemptState.TOMBSTONED, "o-a"),
            AttemptReport("rD", 1, ep, AttemptState.RUNNING, "o-a"),
        ]
    )
    status = status_of(
        {
            ("rD", 0): ("completed", True, True),
            ("rD", 1): ("running", True, False),
            ("rT", 0): ("running", True, False),
        }
    )
    steps = {s.key: s for s in plan_endpoint(status, book, ep, {"o-a"})}
    assert steps[("rD", 0)].action is PrepareAction.ORPHAN_ACK
    assert steps[("rD", 0)].receipt == receipt_for("rD", 0)
    assert steps[("rD", 1)].action is PrepareAction.WAIT
    assert steps[("rT", 0)].action is PrepareAction.RETIRE and not steps[("rT", 0)].known
    # the owner dies: its current try is forgotten too
    steps = {s.key: s for s in plan_endpoint(status, book, ep, set())}
    assert steps[("rD", 1)].action is PrepareAction.RETIRE
    # a refused adoption becomes an orphan ACK, keeping the receipt it was given
    adopt = plan_endpoint(status_of({("rD", 1): ("completed", True, True)}), book, ep, {"o-a"})[0]
    assert adopt.action is PrepareAction.ADOPT
    orphan = orphan_step(adopt, receipt_for("rD", 1))
    assert orphan.action is PrepareAction.ORPHAN_ACK and orphan.receipt == receipt_for("rD", 1)


def test_park_requested_counts_as_running_in_the_plan_and_the_blockers():
    """A real Gym lists a running attempt as park_requested while a prepare is in progress: a
    live owner's try is waited for, a forgotten one retired, and both block."""
    from rl_gym_actors.core.prepare_plan import blockers

    ep = EPS[0]
    book = book_of([AttemptReport("live", 0, ep, AttemptState.RUNNING, "o-a")])
    status = status_of(
        {
            ("live", 0): ("park_requested", False, False),
            ("gone", 0): ("park_requested", False, False),
        }
    )
    steps = {s.key: s for s in plan_endpoint(status, book, ep, {"o-a"})}
    assert steps[("live", 0)].action is PrepareAction.WAIT and steps[("live", 0)].owner == "o-a"
    assert steps[("gone", 0)].action is PrepareAction.RETIRE
    assert [(b["rollout_id"], b["state"]) for b in blockers(status)] == [
        ("gone", "park_requested"),
        ("live", "park_requested"),
    ]


def test_a_committed_checkpoint_prunes_settled_rollouts_and_keeps_the_counters():
    ep = EPS[0]
    book = book_of(
        [
            AttemptReport("done", 0, ep, AttemptState.TOMBSTONED, "o-a"),
            AttemptReport("done", 1, ep, AttemptState.ACKED, "o-a", released=True),
            AttemptReport("sealed", 0, ep, AttemptState.SEALED, "o-a", released=True),
            AttemptReport("held", 0, ep, AttemptState.ACKED, "o-b"),  # not released
            AttemptReport("live", 0, ep, AttemptState.RUNNING, "o-b"),
        ]
    )
    before = book.snapshot().endpoints[ep]
    book.record_checkpoint("c1", committed=False)
    assert book.snapshot().attempts == 5  # a failed checkpoint keeps all
    book.record_checkpoint("c2", committed=True)
    snap = book.snapshot()
    assert (snap.rollouts, snap.attempts, snap.pruned) == (3, 3, 2)
    assert book.attempt("done", 1) is None and book.attempt("sealed", 0) is not None
    assert snap.endpoints[ep] == before and snap.invariant_ok
    assert snap.owners == {"o-b": 2}
    book.record_gate_acked(ep, "sealed", 0)
    book.record_checkpoint("c3", committed=True)
    assert book.snapshot().attempts == 2 and book.snapshot().endpoints[ep].acked == 3


def test_the_gate_acks_by_the_thousand_count_as_one_by_one():
    ep = EPS[0]
    reports = [
        AttemptReport("r", 0, ep, AttemptState.ACKED, "o-a"),
        AttemptReport("s", 0, ep, AttemptState.SEALED, "o-a", result_digest="d" * 64),
        AttemptReport("t", 0, ep, AttemptState.RUNNING, "o-a"),
    ]
    keys = [("r", 0), ("s", 0), ("t", 0), ("t", 1), *((f"never-{i}", 0) for i in range(5))]
    one, many = book_of(reports), book_of(reports)
    kinds = [one.record_gate_acked(ep, rid, att) for rid, att in keys]
    assert (
        many.record_gate_acks(ep, keys)
        == (
            kinds.count(GateAck.ORPHAN),
            kinds.count(GateAck.SEALED),
        )
        == (7, 1)
    )
    assert many.snapshot() == one.snapshot() and many.snapshot().invariant_ok
    assert many.sealed_digest("s", 0) is None  # ACKed: no longer checked against a receipt
    assert many.record_gate_acks(ep, []) == (0, 0)


def test_the_gate_counts_only_orphans_the_book_did_not_know_as_acked():
    ep = EPS[0]
    book = book_of(
        [
            AttemptReport("r", 0, ep, AttemptState.ACKED, "o-a"),
            AttemptReport("s", 0, ep, AttemptState.SEALED, "o-a"),
        ]
    )
    assert book.record_orphan_acked(ep, "r", 0) is False  # its owner got there first
    assert book.record_orphan_acked(ep, "s", 0) is True
    assert book.record_orphan_acked(ep, "never-reported", 0) is True
    book.record_retired(ep, "gone", 3)
    book.record_checkpoint("c1", committed=True)
    book.record_checkpoint("c2", committed=False)
    snap = book.snapshot()
    assert (
        snap.orphans_acked,
        snap.sealed_acked,
        snap.retired,
        snap.checkpoints_committed,
        snap.checkpoints_failed,
        snap.last_checkpoint_id,
    ) == (1, 1, 1, 1, 1, "c1")
    counts = snap.endpoints[ep]
    assert (counts.dispatched, counts.acked, counts.tombstoned) == (4, 3, 1)
    assert snap.owners == {"o-a": 2} and snap.invariant_ok  # not released: still held


def test_attempt_states_have_one_total_order_that_the_fold_follows():
    S = AttemptState
    assert sorted(S, key=lambda s: s.rank) == [S.RUNNING, S.SEALED, S.TOMBSTONED, S.ACKED]
    assert len({s.rank for s in S}) == len(S)  # total: no ties for the fold to break
    acked, tombstoned = (
        AttemptReport("r", 0, "http://e", s, "a0") for s in (S.ACKED, S.TOMBSTONED)
    )
    for first, then in ((acked, tombstoned), (tombstoned, acked)):
        book = AttemptBook()
        book.apply(first)
        book.apply(then)
        assert book.snapshot().endpoints["http://e"].acked == 1
        assert merge_reports(first, then).state is S.ACKED
