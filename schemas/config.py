"""Deployment settings shared by workers, clients and tools (closed: unknown keys are errors)."""

from __future__ import annotations

import msgspec

__all__ = ["VALUE_ENVELOPE", "Settings"]

VALUE_ENVELOPE = 64 * 1024
"""Bytes an event, a decision or a child's end notice may need besides the one stored value it
carries (names, timestamps, a truncated error): a value of ``max_value`` bytes plus this fits."""


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Knobs of one sojourn deployment.

    Attributes:
        prefix: subject/stream prefix; several deployments can share one NATS server.
        max_payload: largest accepted trigger or signal body in bytes (default 1 MiB).
        max_value: largest single value stored in a run's history, in bytes of JSON (default
            1 MiB): a step's result, a journaled value, a run's output (and so a child's
            output, which its parent receives). Checked before the value is appended: a larger
            step result fails the step (``StepFailed`` with error type ``PayloadTooLarge``, not
            retried), a larger output fails the run (``RunFailed``, ``PayloadTooLarge``). The
            limit in effect is also at most the server's ``max_payload`` less 64 KiB
            (``VALUE_ENVELOPE``), so that the event carrying the value always fits in a
            message. From 1 KiB to 64 MiB.
        lease_ttl: seconds a worker owns a run without renewing; after it another worker
            may take the run over. Renewed every third of it while the run executes.
        dedup_window: seconds the broker remembers ``Nats-Msg-Id`` values.
        append_timeout: seconds an event append keeps retrying through a broker outage before
            the worker gives the run up (it is re-woken later, nothing is lost).
        heartbeat_interval: seconds between heartbeats of a worker and of every run it
            executes (the run's heartbeat is its lease renewal). Default: ``lease_ttl / 3``,
            at most 5 s. Must leave room for three heartbeats per lease period.
        stall_after: seconds of silence after which a worker, or the owner of a run, counts as
            stalled. Default: three heartbeats, but at most two thirds of ``lease_ttl``, so that
            a stall shows before another worker may take the run over.
        overdue_after: seconds past its due time after which a wake that has not happened (a
            timer that did not fire, a signal that did not wake its run) counts as lost.
        max_activation_failures: consecutive failed activations of one run (errors outside
            the agent's code, such as a worker bug) after which the worker stops retrying and
            dead-letters the run: the watchdog then reports it as wedged.
        crash_loop_limit: attempts of one step cut off in a row after which the run is
            suspended for a human (reason ``crash_loop``) instead of running the step again: a
            step that kills its worker (a segfault, running out of memory) would otherwise take
            down worker after worker. Off (0) by default: broker restarts and worker kills
            during a step count as cut-offs too, so under a flapping broker healthy runs would
            stop as well (the chaos harness hits 5 in a row). Set it where steps can crash
            their process, e.g. 3.
        max_deliveries: deliveries of one inbox message or wake after which it is given up:
            dead-lettered (code ``max_deliveries``), answered, and never retried again. A
            message handed back on purpose (a trigger for an agent another worker serves, a
            wake for a run another activation holds) counts too, with delays growing to 30 s,
            so a trigger for an agent no worker serves is dead-lettered after some hours.
        max_buffered_signals: signals a run may hold unconsumed; more are refused
            (``too_many_signals``), so no sender can grow a run's state without bound.
        output_max_age: seconds a run's output chunks (``ctx.stream``, ``ctx.progress``) are
            kept: a reader can resume a stream from an offset for this long (default 7 days).
        changes_max_age: seconds the projector's change messages are kept: ``sojourn watch``
            shows a run's timeline from them for this long (default 1 day).
    """

    prefix: str = "sojourn"
    max_payload: int = 1024 * 1024
    max_value: int = 1024 * 1024
    lease_ttl: float = 30.0
    dedup_window: float = 120.0
    append_timeout: float = 60.0
    heartbeat_interval: float | None = None
    stall_after: float | None = None
    overdue_after: float = 60.0
    max_activation_failures: int = 10
    crash_loop_limit: int = 0
    max_deliveries: int = 1000
    max_buffered_signals: int = 1_000
    output_max_age: float = 7 * 86_400.0
    changes_max_age: float = 86_400.0

    def __post_init__(self) -> None:
        if not 1024 <= self.max_value <= 64 * 1024 * 1024:
            raise ValueError(
                f"max_value must be from 1 KiB to 64 MiB (the most a NATS message can hold), "
                f"not {self.max_value}"
            )
        if self.lease_ttl <= 0:
            raise ValueError(f"lease_ttl must be positive, not {self.lease_ttl}")
        hb = self.heartbeat_interval
        if hb is not None and not 0 < hb <= self.lease_ttl / 3:
            raise ValueError(
                f"heartbeat_interval {hb} must be positive and at most lease_ttl / 3 "
                f"({self.lease_ttl / 3:g}): a lease must survive two missed heartbeats"
            )
        if self.stall_after is not None and self.stall_after <= self.heartbeat_every:
            raise ValueError(
                f"stall_after {self.stall_after} must exceed the heartbeat interval "
                f"({self.heartbeat_every:g})"
            )
        if self.overdue_after <= 0:
            raise ValueError(f"overdue_after must be positive, not {self.overdue_after}")
        if self.max_activation_failures < 1:
            raise ValueError("max_activation_failures must be at least 1")
        if self.crash_loop_limit < 0:
            raise ValueError("crash_loop_limit must be 0 (never) or more")
        if self.max_deliveries < 10:
            raise ValueError("max_deliveries must be at least 10")
        if self.max_buffered_signals < 1:
            raise ValueError("max_buffered_signals must be at least 1")
        for name in ("output_max_age", "changes_max_age"):
            if not getattr(self, name) >= 60:
                raise ValueError(f"{name} must be at least 60 seconds")

    @property
    def max_child_notice(self) -> int:
        """Largest end notice a child run sends its parent, in bytes: its output (at most
        ``max_value``) or its error (message truncated), plus ``VALUE_ENVELOPE``. The intake
        must accept a child notice up to this size whatever ``max_payload`` says, or the
        parent would never learn that its child ended."""
        return self.max_value + VALUE_ENVELOPE

    @property
    def heartbeat_every(self) -> float:
        """The heartbeat period in effect."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        return min(5.0, self.lease_ttl / 3)

    @property
    def stall_threshold(self) -> float:
        """Seconds of silence after which an owner counts as stalled."""
        if self.stall_after is not None:
            return self.stall_after
        return min(3 * self.heartbeat_every, self.lease_ttl * 2 / 3)
