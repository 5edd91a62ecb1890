"""The liveness model, pure: which runs are flagged, and that waiting ones never are."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.projections.liveness import Thresholds, claim, classify, holders
from sojourn.projections.summary import CHILD_SIGNAL, PendingSignal, RunSummary
from sojourn.schemas.health import ActiveRun, WedgeRecord, WorkerBeat
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


def beat(worker: str, at: float, *runs: tuple[str, float], stopped: bool = False) -> WorkerBeat:
    return WorkerBeat(
        worker_id=worker,
        at=at,
        started_at=NOW - 1000,
        stopped=stopped,
        runs=tuple(ActiveRun(r, "a", since) for r, since in runs),
    )


def test_the_holder_of_a_run_is_the_beat_that_lists_it_and_began_it_last() -> None:
    old = beat("w1", NOW - 20, ("r", NOW - 60), ("q", NOW - 50))  # silent: died holding r
    new = beat("w2", NOW - 0.1, ("r", NOW - 10))  # took r over
    gone = beat("w3", NOW - 0.1, ("s", NOW - 5), stopped=True)
    index = holders([old, new, gone])
    assert index["r"] == (new, NOW - 10) and index["q"] == (old, NOW - 50) and "s" not in index
    # A progress record counts for the activation the beat lists, and only for it.
    progress = LeaseHolder(owner="w2.7", worker="w2", acquired_at=NOW - 10, step="fetch")
    assert claim(index["r"], progress) == progress
    stale = LeaseHolder(owner="w2.3", worker="w2", acquired_at=NOW - 99, step="old")
    synth = claim(index["r"], stale)
    assert synth is not None and (synth.owner, synth.worker, synth.step) == ("w2", "w2", None)
    assert claim(None, stale) is None
    # A lease written by an older version (no worker) still counts on its own.
    legacy = LeaseHolder(owner="x.1", expires_at=NOW + 10)
    assert claim(None, legacy) == legacy


def test_a_run_held_by_a_silent_worker_is_stalled_and_one_listed_by_nobody_orphaned() -> None:
    s = run()
    fresh = beat("w1", NOW - 1.0, ("r", NOW - 30))
    listed = holders([fresh])["r"]
    assert classify(s, claim(listed, None), NOW, LIMITS, None, fresh).state == "running"
    silent = beat("w1", NOW - 16.0, ("r", NOW - 30))
    listed = holders([silent])["r"]
    liv = classify(s, claim(listed, None), NOW, LIMITS, None, silent)
    assert liv.state == "stalled" and "w1 has not heartbeat" in (liv.reason or "")
    assert classify(s, claim(None, None), NOW, LIMITS, None, None).state == "orphaned"


def test_a_parked_run_still_listed_by_the_beat_before_it_parked_is_waiting() -> None:
    parked = run(
        status="waiting", waiting_on=("signal:go",), last_event_at=NOW - 0.2, deadline=None
    )
    before = beat("w1", NOW - 0.3, ("r", NOW - 1))  # written while the run executed
    listed = holders([before])["r"]
    assert classify(parked, claim(listed, None), NOW, LIMITS, None, before).state == "waiting"
    after = beat("w1", NOW - 0.05, ("r", NOW - 0.1))  # woken again since it parked
    listed = holders([after])["r"]
    assert classify(parked, claim(listed, None), NOW, LIMITS, None, after).state == "running"
