"""The parked time a rollout's /run deadline does not count (actors/park_watch.py): spans seen
with a checkpoint open, counted from the last idle status to the first idle one after (never
less than the checkpoint held), clipped to the /run's own time; a watch polls only while a
/run is in flight and records nothing for a status it cannot read."""

from __future__ import annotations

import asyncio

import pytest

from rl_gym_actors.actors.park_watch import ParkedTime, ParkWatch, poll_interval
from rl_gym_actors.testing.polling import until


def test_a_span_runs_from_the_last_idle_read_to_the_first_idle_one_after():
    t = ParkedTime(since=0.0, grace_s=1.0)
    t.saw(1.0, parked=False)
    t.saw(2.0, parked=True)  # opened somewhere in (1, 2]: counted from 1
    assert t.parked and t.within(0.0, 3.0) == pytest.approx(2.0)  # still open: up to now
    t.saw(5.0, parked=True)
    t.saw(6.0, parked=False)  # closed somewhere in [5, 6): counted to 6
    assert not t.parked
    assert t.within(0.0, 10.0) == pytest.approx(5.0)
    assert t.within(4.0, 10.0) == pytest.approx(2.0)  # a /run that started at 4: its part
    assert t.within(7.0, 10.0) == 0.0


def test_a_checkpoint_seen_first_counts_from_the_runs_start():
    # a /run admitted at `since` found admission open: a checkpoint seen at the first read
    # counts from then
    t = ParkedTime(since=10.0, grace_s=1.0)
    t.saw(12.0, parked=True)
    assert t.within(10.0, 13.0) == pytest.approx(3.0)


def test_an_open_span_counts_only_as_far_as_reads_saw_it():
    t = ParkedTime(since=0.0, grace_s=1.0)
    t.saw(2.0, parked=True)
    assert t.within(0.0, 2.5) == pytest.approx(2.5)
    # no read since (the status cannot be read): one interval past the last read, no more
    assert t.within(0.0, 50.0) == pytest.approx(3.0)
    t.saw(50.0, parked=True)
    assert t.within(0.0, 50.0) == pytest.approx(50.0)


def test_spans_before_every_run_in_flight_are_dropped():
    t = ParkedTime(since=0.0)
    t.saw(1.0, parked=True)
    t.saw(2.0, parked=False)
    t.saw(5.0, parked=True)
    t.saw(6.0, parked=False)
    t.forget_before(3.0)
    assert t.within(0.0, 10.0) == pytest.approx(4.0)  # only (2, 6) is left


def test_the_poll_interval_follows_rollout_s_within_bounds():
    assert poll_interval(60.0) == 1.0 and poll_interval(2.0) == pytest.approx(0.1)
    assert poll_interval(0.5) == 0.1


async def test_a_watch_polls_while_runs_are_in_flight_and_stops_after():
    reads: list[bool] = []
    state = {"parked": False, "fail": False}
    clock = {"now": 100.0}

    async def is_parked(deadline_ts: float) -> bool:
        if state["fail"]:
            raise ConnectionError("status unreadable")
        reads.append(state["parked"])
        return state["parked"]

    watch = ParkWatch(is_parked, lambda: clock["now"], interval_s=0.01)
    token = watch.enter(100.0)
    await until(lambda: len(reads) >= 2, timeout_s=5.0, what="idle reads")
    state["parked"], clock["now"] = True, 101.0
    await until(lambda: watch.time.parked, timeout_s=5.0, what="a parked read")
    state["fail"] = True  # an unreadable status changes nothing, and extends nothing
    seen = watch.reads
    clock["now"] = 103.0
    await asyncio.sleep(0.05)
    assert watch.reads == seen and watch.time.parked
    assert watch.parked_since(100.0) == pytest.approx(1.01)  # since 100, read at 101 (+0.01)
    state["fail"], state["parked"], clock["now"] = False, False, 104.0
    await until(lambda: not watch.time.parked, timeout_s=5.0, what="an idle read")
    assert watch.parked_since(100.0) == pytest.approx(watch.time.within(100.0, 104.0))
    watch.leave(token)
    stopped = len(reads)
    await asyncio.sleep(0.05)
    assert len(reads) == stopped  # no /run in flight: no polling


async def test_reads_under_way_are_shared():
    calls = 0
    gate = asyncio.Event()

    async def is_parked(deadline_ts: float) -> bool:
        nonlocal calls
        calls += 1
        await gate.wait()
        return True

    watch = ParkWatch(is_parked, lambda: 5.0, interval_s=1.0)
    readers = [asyncio.ensure_future(watch.read()) for _ in range(50)]  # 50 deadlines at once
    await until(lambda: calls == 1, timeout_s=5.0, what="the one status read")
    gate.set()
    await asyncio.gather(*readers)
    assert calls == 1 and watch.reads == 1 and watch.time.parked
    await watch.read()  # a later read is a new one
    assert calls == 2
