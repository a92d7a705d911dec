"""Which checkpoint's layer part a restarted SkyRL trainer restores from.

SkyRL writes ``<ckpt_path>/global_step_N/`` (then ``latest_ckpt_global_step.txt``) and the layer
writes its part into that folder (``rl_gym_actors/part.json``) right after. A crash between the two
leaves a newest SkyRL checkpoint without the layer's part, so the part restored is the newest one
at or below the step SkyRL resumes from: ``resume_mode=latest`` the step in
``latest_ckpt_global_step.txt``, ``from_path`` the step of ``resume_path``, ``none`` nothing.
Rollouts handed out after that part are then not in the layer's memory: their results are still
un-ACKed on Gym (no later commit released them), so a trajectory asked for again is adopted from
Gym, not rerun. Nothing here imports SkyRL.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rl_gym_actors.checkpoint_part import PART_DIR, PART_FILE

STEP_PREFIX = "global_step_"
LATEST_FILE = "latest_ckpt_global_step.txt"
_STEP_RE = re.compile(r"^global_step_(\d+)$")


def step_of(path: str | os.PathLike[str]) -> int | None:
    """N of a ``global_step_N`` folder (None for any other name)."""
    match = _STEP_RE.match(Path(path).name)
    return None if match is None else int(match.group(1))


def has_part(checkpoint_dir: str | os.PathLike[str]) -> bool:
    return (Path(checkpoint_dir) / PART_DIR / PART_FILE).is_file()


def resume_step(
    ckpt_path: str | os.PathLike[str], resume_mode: str, resume_path: str | None = None
) -> int | None:
    """The step SkyRL will resume from (None: it starts afresh)."""
    mode = str(getattr(resume_mode, "value", resume_mode)).lower()
    if mode == "none":
        return None
    if mode == "from_path":
        return None if resume_path is None else step_of(resume_path)
    latest = Path(ckpt_path) / LATEST_FILE
    try:
        return int(latest.read_text().strip())
    except (OSError, ValueError):
        return None


def restore_dir(ckpt_path: str | os.PathLike[str], at_most: int | None) -> Path | None:
    """The newest ``global_step_N`` under ``ckpt_path`` with the layer's part and ``N <=
    at_most`` (None when ``at_most`` is None or no such folder exists)."""
    if at_most is None:
        return None
    root = Path(ckpt_path)
    try:
        names = os.listdir(root)
    except OSError:
        return None
    best: tuple[int, Path] | None = None
    for name in names:
        step = step_of(name)
        if step is None or step > at_most or not has_part(root / name):
            continue
        if best is None or step > best[0]:
            best = (step, root / name)
    return None if best is None else best[1]
