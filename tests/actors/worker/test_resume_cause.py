"""``resume_cause`` (``actors/worker/wakes.py``): why a run was due and how long ago, the figure
of ``sojourn_resume_latency_seconds``. A start's or a plain wake's lateness runs from when the
broker stored its message (the ack subject's stamp); a local wake has none."""

from __future__ import annotations

from nats.aio.msg import Msg

from sojourn.actors.core.state import RunState
from sojourn.actors.worker.wakes import resume_cause
from sojourn.broker.delivery import Delivery, LocalWake

STORED_NS = 1_796_000_000_123_456_789


def delivered(reply: str = f"$JS.ACK.S.C.1.10.7.{STORED_NS}.0") -> Delivery:
    return Delivery(Msg(_client=None, subject="p.start.a.r1", reply=reply, data=b""))  # type: ignore[arg-type]


def test_a_starts_lateness_runs_from_when_the_broker_stored_it() -> None:
    now = STORED_NS / 1e9 + 0.25
    cause, late = resume_cause(RunState(), delivered(), "start", now)
    assert cause == "start" and abs(late - 0.25) < 1e-6


def test_a_wake_stored_in_the_future_of_this_clock_is_not_late() -> None:
    cause, late = resume_cause(RunState(), delivered(), "wake", STORED_NS / 1e9 - 5.0)
    assert (cause, late) == ("wake", 0.0)


def test_a_local_wake_or_a_message_of_no_consumer_has_no_lateness() -> None:
    assert resume_cause(RunState(), LocalWake("p.wake.r1"), "wake", 1e9) == ("wake", 0.0)
    assert resume_cause(RunState(), delivered("_INBOX.x.1"), "wake", 1e9) == ("wake", 0.0)
