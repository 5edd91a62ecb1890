"""The liveness model, pure: which runs are flagged, and that waiting ones never are."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.projections.liveness import Thresholds, classify
from sojourn.projections.summary import CHILD_SIGNAL, PendingSignal, RunSummary
from sojourn.schemas.health import WedgeRecord
from sojourn.schemas.wire import LeaseHolder

LIMITS = Thresholds(stall_after=15.0, overdue_after=60.0)
NOW = 1_000_000.0


def run(**fields: object) -> RunSummary:
    base = {"run_id": "r", "agent": "a", "status": "running", "last_event_at": NOW - 100}
    return RunSummary(**{**base, **fields})  # type: ignore[arg-type]


def lease(owner: str | None = "w1.1", beat_ago: float = 1.0, ttl_left: float = 25.0) -> LeaseHolder:
    return LeaseHolder(
        owner=owner,
        expires_at=NOW + ttl_left if owner else 0.0,
        acquired_at=NOW - 500,
        heartbeat_at=NOW - beat_ago,
        step="fetch" if owner else None,
        details=msgspec.Raw(b'{"done":3}') if owner else msgspec.Raw(b"null"),
    )


@pytest.mark.parametrize(
    ("summary", "holder", "state", "words"),
    [
        (run(), lease(), "running", None),
        (run(), lease(beat_ago=16.0, ttl_left=14.0), "stalled", "silent for 16.0s"),
        (run(), lease(beat_ago=40.0, ttl_left=-10.0), "stalled", "ran out 10.0s ago"),
        (run(), None, "orphaned", "no worker holds it"),
        (run(), lease(owner=None, beat_ago=200.0), "orphaned", "no worker holds it"),
        (run(last_event_at=NOW - 2), None, "pending", None),
        (run(status="pending", last_event_at=NOW - 1), None, "pending", None),
        (run(status="waiting", waiting_on=("timer",), deadline=NOW + 5), None, "waiting", None),
        (
            run(status="waiting", waiting_on=("timer",), deadline=NOW - 61),
            None,
            "overdue",
            "due 61.0s ago",
        ),
        (
            run(
                status="waiting",
                waiting_on=("signal:go",),
                signals=(PendingSignal("s1", "go", NOW - 70),),
            ),
            None,
            "overdue",
            "signal 'go' arrived",
        ),
        (
            run(
                status="waiting",
                waiting_on=("run:c1",),
                signals=(PendingSignal("s1", f"{CHILD_SIGNAL}.c1", NOW - 70),),
            ),
            None,
            "overdue",
            "has not woken",
        ),
        (
            run(
                status="waiting",
                waiting_on=("signal:go",),
                signals=(PendingSignal("s1", "other", NOW - 7000),),
            ),
            None,
            "waiting",
            None,
        ),
        (run(status="suspended", suspended_reason="cap", suspended_detail="poll cap"), None,
         "suspended", "cap: poll cap"),
        (run(status="suspended", suspended_reason="nondeterminism", suspended_detail="step 0"),
         None, "wedged", "nondeterminism: step 0"),
        (run(status="completed"), None, "ended", None),
    ],
)  # fmt: skip
def test_classify(
    summary: RunSummary, holder: LeaseHolder | None, state: str, words: str | None
) -> None:
    liv = classify(summary, holder, NOW, LIMITS)
    assert liv.state == state, liv
    if words is not None:
        assert liv.reason is not None and words in liv.reason, liv.reason
    if state in ("running", "stalled"):
        assert liv.owner == "w1.1" and liv.step == "fetch" and liv.details is not None


def test_a_wedge_record_holds_until_history_moves_on_unless_permanent() -> None:
    wedge = WedgeRecord(run_id="r", code="max_deliveries", reason="10 failed", seq=7, at=NOW)
    assert classify(run(last_seq=7), None, NOW, LIMITS, wedge).state == "wedged"
    assert classify(run(last_seq=8), None, NOW, LIMITS, wedge).state == "orphaned"
    poison = msgspec.structs.replace(wedge, code="poison", permanent=True)
    assert classify(run(last_seq=8), None, NOW, LIMITS, poison).state == "wedged"


leases = st.one_of(
    st.none(),
    st.builds(
        lease,
        owner=st.sampled_from(["w1.1", None]),
        beat_ago=st.floats(0, 1e6),
        ttl_left=st.floats(-1e6, 1e6),
    ),
)


@settings(max_examples=500)
@given(
    holder=leases,
    since=st.floats(0, 1e6),
    wait_for=st.floats(0, 1e7),
    on=st.sampled_from([("timer",), ("signal:go", "timer"), ("signal:go",), ("run:c",)]),
    buffered=st.lists(st.sampled_from(["other", "x.y", f"{CHILD_SIGNAL}.d"]), max_size=3),
)
def test_a_waiting_run_with_nothing_late_is_never_flagged(
    holder: LeaseHolder | None,
    since: float,
    wait_for: float,
    on: tuple[str, ...],
    buffered: list[str],
) -> None:
    deadline = NOW - LIMITS.overdue_after + wait_for if "timer" in on else None
    signals = tuple(PendingSignal(f"s{i}", n, NOW - 1e6) for i, n in enumerate(buffered))
    s = run(status="waiting", waiting_on=on, deadline=deadline, waiting_since=NOW - since,
            last_event_at=NOW - since, signals=signals)  # fmt: skip
    liv = classify(s, holder, NOW, LIMITS)
    assert liv.state in ("waiting", "running")
    assert not liv.flagged


@settings(max_examples=500)
@given(holder=leases, idle=st.floats(0, 1e6), status=st.sampled_from(["pending", "running"]))
def test_a_run_with_work_is_flagged_exactly_when_nobody_is_heard_from(
    holder: LeaseHolder | None, idle: float, status: str
) -> None:
    liv = classify(run(status=status, last_event_at=NOW - idle), holder, NOW, LIMITS)
    owner = holder.owner if holder else None
    beat = holder.heartbeat_at if holder else 0.0
    heard = NOW - max(NOW - idle, beat) <= LIMITS.stall_after
    if owner is not None and NOW - beat <= LIMITS.stall_after:
        assert liv.state == "running"
    elif owner is not None:
        assert liv.state == "stalled"
    else:
        assert liv.state == ("pending" if heard else "orphaned")
