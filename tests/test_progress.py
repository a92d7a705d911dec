"""The run_batch progress bar: drawn on a terminal only, and off by environment."""

from __future__ import annotations

import io

from rl_gym_actors.progress import ProgressBar, progress_wanted


def test_progress_bar_draws_only_on_a_tty():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    clock = iter(float(i) for i in range(100))
    tty = Tty()
    bar = ProgressBar(4, stream=tty, clock=lambda: next(clock), min_interval_s=0)
    for status in ("sealed", "sealed", "failed"):
        bar.update(status, adopted=status == "failed")
    bar.update("sealed")
    bar.close()
    out = tty.getvalue()
    assert out.endswith("\n")
    last = out.strip().split("\r")[-1]
    assert "4/4" in last and "failed 1" in last and "sealed 3" in last and "adopted 1" in last
    assert "#" * 24 in last

    plain = io.StringIO()
    quiet = ProgressBar(2, stream=plain)
    quiet.update()
    quiet.close()
    assert plain.getvalue() == "" and not quiet.enabled


def test_progress_can_be_turned_off_by_environment(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert progress_wanted(Tty())
    monkeypatch.setenv("RLGA_PROGRESS", "0")
    assert not progress_wanted(Tty())
    assert progress_wanted(io.StringIO(), enabled=True)
