"""The ledger actor on a real local Ray: reports from many callers in any order, its snapshot,
owners' liveness, and argument checks."""

from __future__ import annotations

import random
import time

import pytest

from rl_gym_actors.config import GymEndpoint, LedgerConfig, TryPolicy
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.attempt_reports import AttemptReport, AttemptState
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.testing.polling import load_factor

pytestmark = pytest.mark.ray

EP = GymEndpoint(url="http://127.0.0.1:9", token="t")  # never contacted by these tests
STATES = list(AttemptState)


@pytest.fixture(scope="module")
def ledger(ray_session):
    from rl_gym_actors.actors.ledger_actor import LedgerActor
    from rl_gym_actors.actors.runtime import RAY_NAMESPACE

    actor = LedgerActor.options(name="rlga-ledger-test-actor", namespace=RAY_NAMESPACE).remote(
        [EP], TryPolicy(), LedgerConfig()
    )
    yield actor
    ray_session.kill(actor)


@pytest.mark.slow
def test_reports_in_any_order_from_many_callers_fold_like_the_book(ray_session, ledger):
    rnd = random.Random(7)
    reports = [
        AttemptReport(
            f"order-{i % 40}",
            i % 3,
            EP.url,
            rnd.choice(STATES),
            f"owner-{i % 4}",
            adopted=rnd.random() < 0.2,
            released=rnd.random() < 0.1,
        )
        for i in range(1200)
    ]
    batches = [reports[i : i + 100] for i in range(0, len(reports), 100)]
    rnd.shuffle(batches)
    for batch in batches:
        rnd.shuffle(batch)
    # all batches in flight at once: the async actor may run them in any order
    ray_session.get([ledger.report.remote(b) for b in batches])
    expected = AttemptBook([EP.url])
    expected.apply_all(reports)
    snap = ray_session.get(ledger.snapshot.remote())
    assert snap.invariant_ok
    assert snap.model_dump(exclude={"live_owners"}) == expected.snapshot().model_dump(
        exclude={"live_owners"}
    )


@pytest.mark.slow
def test_report_throughput_in_batches_of_100(ray_session, ledger):
    """The ledger absorbs tens of thousands of events/s from a handful of senders."""
    batches = [
        [
            AttemptReport(f"tp-{b}-{i}", 0, EP.url, AttemptState.RUNNING, f"tp-owner-{b % 8}")
            for i in range(100)
        ]
        for b in range(300)
    ]
    ray_session.get(ledger.report.remote(batches[0]))  # warm
    start = time.perf_counter()
    ray_session.get([ledger.report.remote(b) for b in batches[1:]])
    rate = 299 * 100 / (time.perf_counter() - start)
    print(f"ledger.report: {rate:,.0f} events/s in batches of 100")
    assert rate > 10_000 / load_factor(), rate  # a quiet machine's floor, lowered by load
    snap = ray_session.get(ledger.snapshot.remote())
    assert snap.endpoints[EP.url].dispatched >= 30_000 and snap.invariant_ok


def test_checkpoint_refuses_bad_arguments_with_config_errors(ray_session, ledger):
    for args in (
        ("bad id!", "/tmp/x", 5.0),
        ("ok", "/tmp/x", 0),
        ("ok", "", 5.0),
        ("ok", "/tmp/x", float("nan")),
    ):
        with pytest.raises(ConfigError):
            ray_session.get(ledger.checkpoint.remote(*args))
    assert ray_session.get(ledger.ping.remote()) == "rlga-ledger-test-actor"


def test_the_restart_check_warns_nothing(ray_session):
    """Ray's was_current_actor_reconstructed reads a deprecated property; the ledger asks it
    without a RayDeprecationWarning reaching the driver's terminal."""

    @ray_session.remote(num_cpus=0)
    class Probe:
        def ask(self) -> tuple[bool, list[str]]:
            import warnings

            from rl_gym_actors.actors.ledger_actor import _was_restarted

            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                restarted = _was_restarted()
            return restarted, [str(w.category.__name__) for w in seen]

    probe = Probe.remote()
    try:
        assert ray_session.get(probe.ask.remote()) == (False, [])
    finally:
        ray_session.kill(probe)
