"""The schedule metrics (issue 14): the names and labels Prometheus sees, what each function
counts, and the cap on schedule names (they come from data, not from code)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, generate_latest

from sojourn.actors.ops import metrics as _metrics
from sojourn.actors.ops.metrics import BoundedLabel, schedule_fired, schedule_run_ended
from sojourn.schemas.schedules import FIRE_OUTCOMES
from sojourn.schemas.vocabulary import TerminalStatus

_names = itertools.count()


def unique(kind: str) -> str:
    """A name no other test in this process counted under: the registry is global."""
    return f"t-{kind}-{next(_names)}"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_each_outcome_of_a_fire_is_counted_under_its_schedule() -> None:
    schedule, other, agent = unique("s"), unique("s"), unique("a")
    for n, outcome in enumerate(FIRE_OUTCOMES, start=1):
        for _ in range(n):
            schedule_fired(schedule, agent, outcome, 0.2 if outcome == "started" else None)
    schedule_fired(other, agent, "skipped", None)
    for n, outcome in enumerate(FIRE_OUTCOMES, start=1):
        assert sample("sojourn_schedule_fires_total", schedule=schedule, outcome=outcome) == n
    assert sample("sojourn_schedule_fires_total", schedule=other, outcome="skipped") == 1
    assert sample("sojourn_schedule_fires_total", schedule=other, outcome="started") == 0


def test_lateness_is_observed_for_started_fires_only_per_agent() -> None:
    agent, other_agent = unique("a"), unique("a")
    schedule_fired(unique("s"), agent, "started", 0.003)
    schedule_fired(unique("s"), agent, "started", 7.0)
    schedule_fired(unique("s"), agent, "started", 120.0)
    schedule_fired(unique("s"), agent, "started", -0.5)  # clocks apart: counts as on time
    schedule_fired(unique("s"), agent, "skipped", 3.0)  # no run, no start to be late
    schedule_fired(unique("s"), agent, "failed", 3.0)
    schedule_fired(unique("s"), other_agent, "started", None)  # nothing measured
    h = "sojourn_schedule_lateness_seconds"
    assert sample(f"{h}_count", agent=agent) == 4
    assert sample(f"{h}_sum", agent=agent) == pytest.approx(127.003)
    assert sample(f"{h}_bucket", agent=agent, le="0.005") == 2
    assert sample(f"{h}_bucket", agent=agent, le="5.0") == 2
    assert sample(f"{h}_bucket", agent=agent, le="10.0") == 3
    assert sample(f"{h}_bucket", agent=agent, le="60.0") == 3
    assert sample(f"{h}_bucket", agent=agent, le="+Inf") == 4
    assert REGISTRY.get_sample_value(f"{h}_count", {"agent": other_agent}) is None


def test_the_lateness_buckets_span_5ms_to_a_minute() -> None:
    agent = unique("a")
    schedule_fired(unique("s"), agent, "started", 1.0)
    text = generate_latest(REGISTRY).decode()
    les = [
        line.split('le="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("sojourn_schedule_lateness_seconds_bucket{") and f'"{agent}"' in line
    ]
    assert les[0] == "0.005"
    assert les[-2:] == ["60.0", "+Inf"]
    assert len(les) >= 12


def test_scheduled_runs_that_ended_are_counted_by_status() -> None:
    schedule = unique("s")
    statuses: list[TerminalStatus] = ["failed", "failed", "failed", "completed", "cancelled"]
    for status in statuses:
        schedule_run_ended(schedule, status)
    assert sample("sojourn_schedule_runs_total", schedule=schedule, status="failed") == 3
    assert sample("sojourn_schedule_runs_total", schedule=schedule, status="completed") == 1
    assert sample("sojourn_schedule_runs_total", schedule=schedule, status="cancelled") == 1


def test_exposed_names_and_types_are_the_documented_ones() -> None:
    schedule_fired(unique("s"), unique("a"), "started", 0.1)
    schedule_run_ended(unique("s"), "completed")
    text = generate_latest(REGISTRY).decode()
    assert "# TYPE sojourn_schedule_fires_total counter" in text
    assert "# TYPE sojourn_schedule_runs_total counter" in text
    assert "# TYPE sojourn_schedule_lateness_seconds histogram" in text
    names = {"sojourn_schedule_fires_total", "sojourn_schedule_runs_total"}
    labelled = {
        line.split("{")[0]: line.split("{")[1].split("}")[0]
        for line in text.splitlines()
        if line.split("{")[0] in names
    }
    assert set(labelled) == names
    assert {kv.split("=")[0] for kv in labelled["sojourn_schedule_fires_total"].split(",")} == {
        "schedule",
        "outcome",
    }
    assert {kv.split("=")[0] for kv in labelled["sojourn_schedule_runs_total"].split(",")} == {
        "schedule",
        "status",
    }


def test_schedule_names_past_the_cap_are_counted_as_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process-wide cap is 1,000 names; a small one stands in for it here, so this test
    does not use up the real one for the others."""
    assert _metrics.schedule_label.limit == 1000
    monkeypatch.setattr(_metrics, "schedule_label", BoundedLabel(2))
    first, second, third, fourth = (unique("s") for _ in range(4))
    schedule_fired(first, "a", "started", None)
    schedule_fired(second, "a", "started", None)
    schedule_fired(third, "a", "started", None)
    schedule_run_ended(fourth, "failed")
    schedule_run_ended(first, "failed")  # a name seen before the cap keeps its label
    fires = "sojourn_schedule_fires_total"
    assert sample(fires, schedule=first, outcome="started") == 1
    assert sample(fires, schedule=second, outcome="started") == 1
    assert REGISTRY.get_sample_value(fires, {"schedule": third, "outcome": "started"}) is None
    assert sample(fires, schedule="other", outcome="started") >= 1
    runs = "sojourn_schedule_runs_total"
    assert REGISTRY.get_sample_value(runs, {"schedule": fourth, "status": "failed"}) is None
    assert sample(runs, schedule="other", status="failed") >= 1
    assert sample(runs, schedule=first, status="failed") == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="abcdef", min_size=1, max_size=3), max_size=60), st.integers(0, 8))
def test_a_bounded_label_keeps_the_first_names_and_maps_the_rest_to_other(
    names: list[str], limit: int
) -> None:
    label = BoundedLabel(limit)
    kept = list(dict.fromkeys(names))[:limit]
    for name in names:
        assert label(name) == (name if name in kept else "other")
    assert len({label(name) for name in names} - {"other"}) <= limit
