"""The Prometheus rules and the Grafana dashboard in deploy/ are valid, and name only metrics
the code exports.

promtool comes with the Debian package ``prometheus`` (``.ci/run`` installs it). Without it
these tests fail rather than skip, so CI can never pass them silently; set
``SOJOURN_SKIP_PROMTOOL=1`` to skip them on a machine that cannot have it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "sojourn.json"

METRIC = re.compile(r"\bsojourn_[a-z0-9_]+\b")
EXPR_KEY = re.compile(r"^(?P<indent>\s*)(?:-\s+)?expr:\s*(?P<rest>.*)$")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("SOJOURN_SKIP_PROMTOOL") == "1":
            pytest.skip("promtool is not installed and SOJOURN_SKIP_PROMTOOL=1")
        pytest.fail(
            "promtool is not installed: install the Debian package prometheus (see .ci/run), "
            "or set SOJOURN_SKIP_PROMTOOL=1 to skip the promtool tests"
        )
    return path


def run_promtool(*args: str) -> None:
    proc = subprocess.run(
        [promtool(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}{proc.stderr}"


def rule_exprs(text: str) -> list[str]:
    """The ``expr:`` values of a rules file, including multi-line block scalars (``|``, ``>``),
    read as text: PyYAML is not a dependency."""
    exprs: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = EXPR_KEY.match(lines[i])
        i += 1
        if m is None:
            continue
        rest = m["rest"].strip()
        if rest[:1] not in ("|", ">"):
            exprs.append(rest)
            continue
        indent = len(m["indent"])
        block: list[str] = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
        ):
            block.append(lines[i].strip())
            i += 1
        exprs.append(" ".join(block))
    return exprs


def exported_metrics() -> set[str]:
    """Every series name the code exports, as PromQL sees it (``_total`` on counters,
    ``_bucket``/``_sum``/``_count`` on histograms)."""
    import prometheus_client

    import sojourn.actors.ops.metrics  # noqa: F401  (registers every collector with REGISTRY)

    text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    names: set[str] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[:2] == ["#", "TYPE"]:
            name, kind = parts[2], parts[3]
            if kind == "counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
            elif kind == "histogram":
                names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
            else:
                names.add(name)
        elif len(parts) >= 3 and parts[:2] == ["#", "HELP"]:
            names.add(parts[2])
    return {n for n in names if n.startswith("sojourn_")}


def named_metrics(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in METRIC.findall(expr)}


def assert_exported(names: set[str], where: str) -> None:
    exported = exported_metrics()
    missing = sorted(names - exported)
    assert not missing, (
        f"{where} names metrics the code does not export: {', '.join(missing)}\n"
        f"exported: {', '.join(sorted(exported))}"
    )


def strings_under(node: Any, keys: tuple[str, ...]) -> Iterator[str]:
    """Every string value under one of ``keys``, anywhere in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in keys and isinstance(value, str):
                yield value
            else:
                yield from strings_under(value, keys)
    elif isinstance(node, list):
        for item in node:
            yield from strings_under(item, keys)


def test_promtool_accepts_the_rules(processes: None) -> None:
    run_promtool("check", "rules", str(RULES.relative_to(ROOT)))


def test_promtool_unit_tests(processes: None) -> None:
    run_promtool("test", "rules", str(RULE_TESTS.relative_to(ROOT)))


def test_promtool_accepts_the_example_config(processes: None) -> None:
    run_promtool("check", "config", str(CONFIG.relative_to(ROOT)))


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    text = RULES.read_text()
    alerts = re.split(r"^\s*- alert:", text, flags=re.M)[1:]
    assert len(alerts) >= 10
    for block in alerts:
        name = block.split()[0]
        assert re.search(r"^\s+severity: (page|ticket)$", block, flags=re.M), name
        for key in ("summary", "description", "runbook"):
            assert re.search(rf"^\s+{key}:", block, flags=re.M), f"{name}: no {key}"
        assert "docs/operations.md#" in block, f"{name}: runbook outside docs/operations.md"


def test_every_metric_in_the_rules_is_exported() -> None:
    exprs = rule_exprs(RULES.read_text())
    names = named_metrics(exprs)
    assert len(names) >= 10, f"the rules name only {sorted(names)}"
    assert_exported(names, str(RULES.relative_to(ROOT)))


def test_dashboard_is_valid_json_and_uses_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    exprs = list(strings_under(dashboard["panels"], ("expr",)))
    assert len(exprs) >= 15
    # Template variables (the agent list) query metrics too.
    queries = list(strings_under(dashboard.get("templating", {}), ("query", "definition")))
    names = named_metrics(exprs + queries)
    assert len(names) >= 15, f"the dashboard names only {sorted(names)}"
    assert_exported(names, str(DASHBOARD.relative_to(ROOT)))


def test_dashboard_queries_parse(processes: None, tmp_path: Path) -> None:
    """promtool parses every panel query, with Grafana's variables replaced by values."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = list(strings_under(dashboard["panels"], ("expr",)))
    rules = ["groups:", "  - name: dashboard", "    rules:"]
    for i, expr in enumerate(exprs):
        expr = expr.replace("$__rate_interval", "5m").replace("$agent", ".*")
        rules += [f"      - record: dashboard_query_{i}", f"        expr: {json.dumps(expr)}"]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text("\n".join(rules) + "\n")
    run_promtool("check", "rules", str(path))


def test_every_runbook_link_points_at_a_section_of_the_operations_guide() -> None:
    rules = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    links = set(re.findall(r"docs/operations\.md#([a-z0-9-]+)", rules))
    headings = (ROOT / "docs" / "operations.md").read_text().splitlines()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lstrip("#").strip().lower()).replace(" ", "-")
        for h in headings
        if h.startswith("#")
    }
    assert len(links) >= 10
    assert links <= anchors, sorted(links - anchors)
