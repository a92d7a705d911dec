"""The demo (``make demo``) plays each way a /run reply gets lost and checks every step itself."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_the_demo_holds_end_to_end(ray_session, load_example):
    lines: list[str] = []
    assert load_example("lost_replies").run_demo(lines.append), "\n".join(lines)
    text = "\n".join(lines)
    assert "NO!" not in text and "all expectations held" in text
    # the seven wire steps, in order
    steps = [
        line.strip()[:2]
        for line in lines
        if line.strip()[:2] in {"1.", "2.", "3.", "4.", "5.", "6.", "7."}
    ]
    assert steps == ["1.", "2.", "3.", "4.", "5.", "6.", "7."]
    assert "listed: [('rD', 0)]" in text and "replayed: {'id': 'r-rD', 'reward': 0.5}" in text
    for section in ("== 1.", "== 2.", "== 3.", "== 4.", "== 5."):
        assert section in text
    assert "demo-drop: sealed, attempt 0, tries 1, reward 0.5, adopted" in text
