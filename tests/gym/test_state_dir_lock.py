"""One server per --state-dir (issue 16): a second ``gym serve`` on a held state dir exits 2 with
one line naming the holder's pid; once the holder dies (SIGKILL too) the dir is free again."""

from __future__ import annotations

import pytest

from rl_gym_actors.gym.state_lock import StateDirHeld, lock_state_dir
from rl_gym_actors.testing.gym_process import GymServerError, GymServerProcess


def test_the_lock_is_exclusive_and_names_its_holder(tmp_path):
    held = lock_state_dir(tmp_path)
    with pytest.raises(StateDirHeld) as info:
        lock_state_dir(tmp_path)
    assert info.value.pid is not None and str(info.value.pid) in str(info.value)
    held.release()
    lock_state_dir(tmp_path).release()  # free again


@pytest.mark.slow
def test_a_second_server_on_one_state_dir_is_refused_naming_the_holder(tmp_path):
    state = tmp_path / "state"
    first = GymServerProcess(state_dir=state).start()
    second = GymServerProcess(state_dir=state)
    try:
        with pytest.raises(GymServerError, match="before it was ready"):
            second.start()
        assert second.returncode == 2
        lines = [ln for ln in second.log_path.read_text().splitlines() if ln.strip()]
        assert len(lines) == 1, lines
        assert f"is held by pid {first.pid}" in lines[0] and str(state) in lines[0]
        first.kill()  # a crash frees the lock with the process
        second.start()
        assert second.running
    finally:
        first.kill()
        second.stop()
