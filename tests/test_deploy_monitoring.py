"""deploy/grafana/: the dashboard and the alert rules load, and every metric they name is one the
package exports (the Gym server's registry, or a Ray metric of rl_gym_actors.metrics as Ray
exports it: ``ray_`` prefix, histogram suffixes)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rl_gym_actors import metrics

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "grafana"
DASHBOARD = DEPLOY / "rl_gym_actors.json"
RULES = DEPLOY / "rl_gym_actors_alerts.yml"
# labels Prometheus or Ray add to every series: the scrape's own, and Ray's per-process ones
TARGET_LABELS = {"job", "instance", "SessionName", "NodeAddress", "Component", "WorkerId"}
BUILTIN = {"up": set()}  # Prometheus's own series per scrape target
METRIC_NAME = re.compile(r"\b((?:gym|ray)_[a-zA-Z0-9_]+|up)\b\s*(\{[^}]*\})?")
LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")

pytestmark = pytest.mark.skipif(
    not DEPLOY.is_dir(), reason="deploy/ is not in this tree (an sdist without it)"
)


def exported() -> dict[str, set[str]]:
    """Every series name the package exports, with its label names."""
    gym = metrics.GymServerMetrics(dict)
    gym.observe("/run", "POST", 200, 0.01, replayed=True)
    gym.observe(metrics.RETIRE_ROUTE, "POST", 200, 0.01, body=b'{"tombstoned": true}')
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(gym.registry).decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    for ray_metric in vars(metrics).values():
        if not isinstance(ray_metric, metrics.RayMetric):
            continue
        base = f"ray_{ray_metric.name}"
        suffixes = ("_bucket", "_sum", "_count") if ray_metric.kind == "histogram" else ("",)
        for suffix in suffixes:
            labels = set(ray_metric.tag_keys) | ({"le"} if suffix == "_bucket" else set())
            names[base + suffix] = labels
    return {**names, **BUILTIN}


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every query in the dashboard and the rules."""
    found = []
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r}", target["expr"]))
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            found.append((f"rule {rule['alert']}", rule["expr"]))
    return found


def test_the_dashboard_is_a_grafana_dashboard():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert "datasource" in variables
    graphs = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(graphs) >= 8
    for panel in graphs:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval", "__range"}
            assert used <= variables, (panel["title"], used - variables)


def test_the_rules_are_prometheus_alerting_rules():
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {
        "RlgaGymUnackedGrowing",
        "RlgaCheckpointFailing",
        "RlgaGymEndpointDown",
    }
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]


def test_promtool_accepts_the_rules_when_installed():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on the PATH (the structure is checked above)")
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_metric_and_label_named_is_exported():
    known = exported()
    seen = set()
    for where, expr in expressions():
        named = METRIC_NAME.findall(expr)
        assert named, f"{where} names no metric: {expr}"
        for name, matchers in named:
            assert name in known, f"{where}: {name} is not exported by rl_gym_actors"
            seen.add(name)
            labels = set(LABEL.findall(matchers))
            unknown = labels - known[name] - TARGET_LABELS
            assert not unknown, f"{where}: {name} has no label {sorted(unknown)}"
    # the dashboard covers the package's metrics, each of its families at least once
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in known} - {"up"}
    covered = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in seen}
    assert families <= covered, sorted(families - covered)
