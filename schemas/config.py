"""Deployment settings shared by workers, clients and tools (closed: unknown keys are errors)."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["ARCHIVE_POLICIES", "VALUE_ENVELOPE", "ArchivePolicy", "Settings"]

ArchivePolicy = Literal["object_store", "discard"]
"""What retention does with an ended run's history before removing it from the hot streams:
``object_store`` keeps a verified copy in the deployment's archive bucket (``sojourn history``
still reads it); ``discard`` keeps nothing (the history is gone for good)."""
ARCHIVE_POLICIES: tuple[ArchivePolicy, ...] = ("object_store", "discard")

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
        lease_ttl: the ack deadline of wakes and triggers (kept alive every
            ``heartbeat_interval`` while their run executes), and how long a lease written by
            an older version counts as held. A run itself is held by its worker's heartbeats,
            which list it (``worker_dead_after``), however long it executes.
        dedup_window: seconds the broker remembers ``Nats-Msg-Id`` values.
        append_timeout: seconds an event append keeps retrying through a broker outage before
            the worker gives the run up (it is re-woken later, nothing is lost).
        heartbeat_interval: seconds between keepalives of the wake (or trigger) of a run that
            executes: each restarts its ack deadline. Default: ``lease_ttl / 3``, at most 5 s.
            Must leave room for three per ``lease_ttl``.
        worker_beat_interval: seconds between a worker's heartbeats (``<prefix>.worker.<id>``),
            each listing the runs it executes: one write per worker, however many runs.
        worker_dead_after: seconds without a new heartbeat after which other workers count a
            worker as dead, take over its runs and wake them (default 1.5 s: six missed
            beats). An async step that blocks the event loop this long makes its worker look
            dead: its run is then taken over, and the blocked worker is fenced at its next
            append.
        stall_after: seconds of silence after which a worker, or the owner of a run, counts as
            stalled. Default: ``worker_dead_after``.
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
        replicas: copies JetStream keeps of every sojourn stream (its ``num_replicas``), from
            1 to 5. 1 (default) suits the embedded single-node server; 3 is the production
            choice on a cluster (deploy/nats/): any one node may fail, and no acknowledged
            write is lost while a quorum of two holds it. NATS does not require an odd count,
            but an even one tolerates no more failures than the odd count below it. Used when
            a stream is created; an existing stream keeps its replica count (``sojourn
            topology --apply --replicas N`` changes it).
        retain_ended: seconds an ended run (completed, failed, cancelled) stays in the hot
            streams after its end; then retention (``sojourn archive``, or the watchdog when
            this is set) archives it per ``archive`` and removes its events, wakes, timers,
            lease and output. ``None`` (the default): forever, nothing is ever removed. 30 days
            (``2_592_000``) is a typical choice. Runs that have not ended are never touched.
        archive: what happens to an ended run's history when it leaves the hot streams
            (``ArchivePolicy``): ``object_store`` (the default) or ``discard``.
        timer_backstop: seconds after a timer's deadline at which the broker's copy of it
            fires, when the worker that parked the run keeps the timer in process (deadlines
            up to ``IN_PROCESS_HORIZON`` ahead) and wakes the run itself at the deadline. The
            broker's copy is the durable one: it wakes the run if that worker died (this
            much late) and is removed when the run wakes in time. 0: no timers in process;
            every timer fires from the broker at its deadline. Default 2 s. Keep it under
            ``overdue_after``: a run whose worker died is flagged overdue (and woken by the
            watchdog) if its backstop is later than that.
        value_inline_max: bytes of JSON above which a value is stored by reference: a step's
            result, a journaled value, a run's output, the input ``ctx.continue_as_new``
            passes on. Such a value goes to the values stream (``<PREFIX>_VALUES``) in
            content-addressed pieces, each stored once and shared with every value that holds
            it (a conversation state that grows by a message per step stores the new message,
            not the whole state again), and the history holds a small reference. From 1 KiB
            to 64 MiB (at or above ``max_value``: every value inline). Default 16 KiB.
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
    worker_beat_interval: float = 0.25
    worker_dead_after: float = 1.5
    replicas: int = 1
    retain_ended: float | None = None
    archive: ArchivePolicy = "object_store"
    timer_backstop: float = 2.0
    value_inline_max: int = 16 * 1024

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
                f"({self.lease_ttl / 3:g}): a wake's ack deadline must outlast two missed "
                "keepalives"
            )
        if not 0 < self.worker_beat_interval <= self.worker_dead_after / 2:
            raise ValueError(
                f"worker_beat_interval {self.worker_beat_interval} must be positive and at "
                f"most worker_dead_after / 2 ({self.worker_dead_after / 2:g}): a live worker "
                "must never look dead for one late beat"
            )
        if self.stall_after is not None and self.stall_after <= self.worker_beat_interval:
            raise ValueError(
                f"stall_after {self.stall_after} must exceed the worker heartbeat interval "
                f"({self.worker_beat_interval:g})"
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
        if not 1 <= self.replicas <= 5:
            raise ValueError(
                f"replicas must be from 1 to 5 (JetStream's limit), not {self.replicas}"
            )
        for name in ("output_max_age", "changes_max_age"):
            if not getattr(self, name) >= 60:
                raise ValueError(f"{name} must be at least 60 seconds")
        if self.retain_ended is not None and not self.retain_ended >= 60:
            raise ValueError(
                f"retain_ended must be at least 60 seconds (or None: forever), "
                f"not {self.retain_ended}"
            )
        if not 0 <= self.timer_backstop <= 3600:
            raise ValueError(f"timer_backstop must be from 0 to 3600 s, not {self.timer_backstop}")
        if not 1024 <= self.value_inline_max <= 64 * 1024 * 1024:
            raise ValueError(
                f"value_inline_max must be from 1 KiB to 64 MiB, not {self.value_inline_max}"
            )
        if self.archive not in ARCHIVE_POLICIES:
            raise ValueError(f"archive must be one of {', '.join(ARCHIVE_POLICIES)}")

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
        return self.worker_dead_after
