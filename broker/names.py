"""Subject, stream and consumer names for one sojourn deployment.

Everything hangs off one prefix (``sojourn`` by default) so several deployments, or every test in
a suite, can share one NATS server without seeing each other. The rules of names users type
(agents, run ids, signal names: single subject tokens) are ``sojourn.schemas.names``; the
broker's own modules import them from here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sojourn.schemas.errors import InvalidName
from sojourn.schemas.limits import validate_limit_name
from sojourn.schemas.names import (
    REPLY_PREFIX,
    TOKEN_PATTERN,
    inbox_prefix,
    user_inboxes,
    validate_schedule_name,
    validate_signal_name,
    validate_token,
)
from sojourn.schemas.priority import (
    LANED,
    PRIORITY_DEFAULT,
    Priority,
    lane_token,
    parse_lane_token,
)
from sojourn.schemas.wire import InboxKind

__all__ = [
    "REPLY_PREFIX",
    "TOKEN_PATTERN",
    "InboxSubject",
    "Names",
    "inbox_prefix",
    "user_inboxes",
    "validate_token",
]

_WORKER_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,31}")
_POSITION = re.compile(r"0|[1-9][0-9]{0,8}")


@dataclass(frozen=True, slots=True)
class InboxSubject:
    """What an inbox subject says, parsed and validated (``Names.parse_inbox``).

    ``target`` is the agent of a start, else the run id; ``name`` the signal name of a signal,
    ``<position>.<attempt>`` of a decision, the child run id of a child notice, the run id of a
    start that names one in its subject, else "".
    ``sender`` is the ``as.<sender>`` token: under authentication the broker lets a user
    publish only on its own, so it is who sent the message; ``None`` on the anonymous forms.
    ``priority`` is the lane of a start or spawn (its ``p<n>`` token; 3 without one).
    """

    kind: InboxKind
    target: str
    name: str = ""
    sender: str | None = None
    priority: Priority = PRIORITY_DEFAULT


@dataclass(frozen=True, slots=True)
class Names:
    """All names derived from a deployment prefix."""

    prefix: str = "sojourn"

    def __post_init__(self) -> None:
        # Stream names are derived by upper-casing the prefix, so allow only one spelling of
        # each: "my-app" and "My_App" must not share streams by accident.
        if not _PREFIX.fullmatch(self.prefix):
            raise InvalidName(
                f"invalid prefix {self.prefix!r}: use 1-32 characters from a-z 0-9 _, "
                "starting with a letter"
            )

    def _stream(self, kind: str) -> str:
        return f"{self.prefix.upper()}_{kind}"

    # streams
    @property
    def events_stream(self) -> str:
        return self._stream("EVENTS")

    @property
    def inbox_stream(self) -> str:
        return self._stream("INBOX")

    @property
    def wake_stream(self) -> str:
        return self._stream("WAKE")

    @property
    def dlq_stream(self) -> str:
        return self._stream("DLQ")

    @property
    def leases_stream(self) -> str:
        return self._stream("LEASES")

    @property
    def agents_stream(self) -> str:
        return self._stream("AGENTS")

    @property
    def health_stream(self) -> str:
        return self._stream("HEALTH")

    # durable consumers
    @property
    def intake_consumer(self) -> str:
        """The consumer of the inbox's default lane: priority 3's starts and every message
        that is not a start (signals, cancels, control subjects)."""
        return "intake"

    def intake_lane_consumer(self, priority: Priority) -> str:
        """The consumer of the starts and spawns of ``priority`` (``intake`` for 3)."""
        lane = lane_token(priority)
        return f"intake-{lane}" if lane else self.intake_consumer

    @property
    def wake_consumer(self) -> str:
        """The shared consumer of unrouted wakes (``wake(run_id)`` without an agent): wakes
        published before routing existed, or by a process that does not know the run's agent."""
        return "workers"

    def agent_wake_consumer(self, agent: str, priority: Priority = PRIORITY_DEFAULT) -> str:
        """The consumer of ``agent``'s wakes of ``priority``, shared by the workers that serve
        it: a worker receives only wakes of runs it can execute. ``wake-<agent>`` for 3,
        ``wakep<n>-<agent>`` for the others (a fixed head per lane: no agent name can make one
        lane's name another's)."""
        lane = lane_token(priority)
        return f"wake{lane}-{agent}"

    # subjects
    def events(self, run_id: str) -> str:
        return f"{self.prefix}.ev.{run_id}"

    @property
    def events_all(self) -> str:
        return f"{self.prefix}.ev.*"

    def _inbox(self, sender: str | None) -> str:
        return self.prefix if sender is None else f"{self.prefix}.as.{sender}"

    def _lane(self, sender: str | None, priority: Priority) -> str:
        lane = lane_token(priority)
        head = self._inbox(sender)
        return f"{head}.{lane}" if lane else head

    def start(
        self,
        agent: str,
        sender: str | None = None,
        run_id: str | None = None,
        priority: Priority = PRIORITY_DEFAULT,
    ) -> str:
        """A start trigger's subject, on the lane of ``priority``
        (``<prefix>[.as.<sender>][.p<n>].start.<agent>[.<run_id>]``). With ``run_id`` (the form
        clients use) a run whose start is stored and not yet taken can be found by its id: it
        shows ``pending``."""
        subject = f"{self._lane(sender, priority)}.start.{agent}"
        return subject if run_id is None else f"{subject}.{run_id}"

    def pending_starts(self, run_id: str) -> list[str]:
        """Filters matching the stored start of ``run_id`` in the inbox, in any form and lane."""
        p = self.prefix
        return [
            f"{p}.start.*.{run_id}",
            f"{p}.as.*.start.*.{run_id}",
            f"{p}.*.start.*.{run_id}",
            f"{p}.as.*.*.start.*.{run_id}",
        ]

    def signal(self, run_id: str, name: str, sender: str | None = None) -> str:
        return f"{self._inbox(sender)}.signal.{run_id}.{name}"

    def update(self, run_id: str, name: str, sender: str | None = None) -> str:
        """An update to a run (``client.update``): a signal that wants an answer."""
        return f"{self._inbox(sender)}.update.{run_id}.{name}"

    def cancel(self, run_id: str, sender: str | None = None) -> str:
        return f"{self._inbox(sender)}.cancel.{run_id}"

    def resume(self, run_id: str, sender: str) -> str:
        """Control subject: lift a suspension (only the admin role may publish it)."""
        return f"{self.prefix}.as.{sender}.resume.{run_id}"

    def pause(self, run_id: str, sender: str) -> str:
        """Control subject: hold a run at its next step (admin role only)."""
        return f"{self.prefix}.as.{sender}.pause.{run_id}"

    def budget(self, run_id: str, sender: str) -> str:
        """Control subject: change a run's budget limits (admin role only)."""
        return f"{self.prefix}.as.{sender}.budget.{run_id}"

    def decide(self, run_id: str, position: int, attempt: int, sender: str) -> str:
        """Control subject: an operator's decision on an in-doubt step (admin role only)."""
        return f"{self.prefix}.as.{sender}.decide.{run_id}.{position}.{attempt}"

    def hold_request(self, agent: str, sender: str) -> str:
        """Control subject: hold every run of ``agent``, or let them go on (admin role only)."""
        return f"{self.prefix}.as.{sender}.hold.{agent}"

    def limit_request(self, name: str, sender: str) -> str:
        """Control subject: set, block or unblock the shared rate limit ``name`` (admin role
        only)."""
        return f"{self.prefix}.as.{sender}.limit.{name}"

    def spawn(self, agent: str, sender: str, priority: Priority = PRIORITY_DEFAULT) -> str:
        """Control subject: a run starts a child run (worker role only), on the lane of the
        child's ``priority``. Only here may a trigger name a parent, and only here may a run id
        have the child form."""
        return f"{self._lane(sender, priority)}.spawn.{agent}"

    def child_end(self, parent_run_id: str, child_run_id: str, sender: str) -> str:
        """Control subject: a child run tells its parent it ended (worker role only)."""
        return f"{self.prefix}.as.{sender}.child.{parent_run_id}.{child_run_id}"

    @property
    def inbox_subjects(self) -> list[str]:
        """What the inbox stream captures: the anonymous client forms, the same with an
        ``as.<sender>`` token, and the control subjects, which exist only in that form."""
        p = self.prefix
        return [
            f"{p}.start.*",
            f"{p}.start.*.*",
            f"{p}.signal.*.>",
            f"{p}.cancel.*",
            f"{p}.update.*.>",
            f"{p}.as.*.start.*",
            f"{p}.as.*.start.*.*",
            f"{p}.as.*.signal.*.>",
            f"{p}.as.*.cancel.*",
            f"{p}.as.*.update.*.>",
            f"{p}.as.*.spawn.*",
            f"{p}.as.*.resume.*",
            f"{p}.as.*.pause.*",
            f"{p}.as.*.budget.*",
            f"{p}.as.*.decide.*.*.*",
            f"{p}.as.*.child.*.*",
            f"{p}.as.*.schedule.*",
            f"{p}.as.*.hold.*",
            f"{p}.as.*.limit.*",
            *(s for priority in LANED for s in self.lane_subjects(priority)),
        ]

    @property
    def default_lane_subjects(self) -> list[str]:
        """The filter of the default lane's consumer (``intake``): every inbox subject but the
        other lanes' starts and spawns."""
        laned = {s for priority in LANED for s in self.lane_subjects(priority)}
        return [s for s in self.inbox_subjects if s not in laned]

    def lane_subjects(self, priority: Priority) -> list[str]:
        """The starts and spawns of a laned ``priority``: what its consumer takes."""
        p, lane = self.prefix, lane_token(priority)
        assert lane, "priority 3's starts are on the default lane"
        return [
            f"{p}.{lane}.start.*",
            f"{p}.{lane}.start.*.*",
            f"{p}.as.*.{lane}.start.*",
            f"{p}.as.*.{lane}.start.*.*",
            f"{p}.as.*.{lane}.spawn.*",
        ]

    def parse_inbox(self, subject: str) -> InboxSubject:
        """Parse an inbox subject, validating every token with ``fullmatch``.

        Raises:
            InvalidName: the subject is not one of ``inbox_subjects`` with valid tokens (a
                signal name that is not dot-separated tokens, a position that is not a
                number, a sender, agent or run id that is not a token).
        """
        head = self.prefix + "."
        if not subject.startswith(head):
            raise InvalidName(f"subject {subject!r} is not under prefix {self.prefix!r}")
        parts = subject[len(head) :].split(".")
        sender: str | None = None
        if parts[0] == "as" and len(parts) >= 2:
            sender = validate_token(parts[1], "sender")
            parts = parts[2:]
        priority = parse_lane_token(parts[0]) if parts else None
        if priority is not None:  # a lane: only starts and spawns have one
            parts = parts[1:]
            if not parts or parts[0] not in ("start", "spawn"):
                raise InvalidName(f"subject {subject!r}: only starts and spawns have a lane")
        kind, rest = (parts[0], parts[1:]) if parts else ("", [])
        priority = priority or PRIORITY_DEFAULT
        if kind == "start" and len(rest) in (1, 2):
            agent = validate_token(rest[0], "agent name")
            run_id = validate_token(rest[1], "run_id") if len(rest) == 2 else ""
            return InboxSubject("start", agent, run_id, sender, priority)
        if kind == "cancel" and len(rest) == 1:
            return InboxSubject("cancel", validate_token(rest[0], "run_id"), "", sender)
        if kind == "signal" and len(rest) >= 2:
            run_id = validate_token(rest[0], "run_id")
            name = validate_signal_name(".".join(rest[1:]))
            return InboxSubject("signal", run_id, name, sender)
        if kind == "update" and len(rest) >= 2:
            run_id = validate_token(rest[0], "run_id")
            name = validate_signal_name(".".join(rest[1:]))
            return InboxSubject("update", run_id, name, sender)
        if sender is not None:
            if kind == "spawn" and len(rest) == 1:
                agent = validate_token(rest[0], "agent name")
                return InboxSubject("spawn", agent, "", sender, priority)
            if kind == "resume" and len(rest) == 1:
                return InboxSubject("resume", validate_token(rest[0], "run_id"), "", sender)
            if kind == "pause" and len(rest) == 1:
                return InboxSubject("pause", validate_token(rest[0], "run_id"), "", sender)
            if kind == "budget" and len(rest) == 1:
                return InboxSubject("budget", validate_token(rest[0], "run_id"), "", sender)
            if kind == "decide" and len(rest) == 3:
                run_id = validate_token(rest[0], "run_id")
                if not (_POSITION.fullmatch(rest[1]) and _POSITION.fullmatch(rest[2])):
                    raise InvalidName(f"decision subject {subject!r}: position.attempt")
                return InboxSubject("decide", run_id, f"{rest[1]}.{rest[2]}", sender)
            if kind == "child" and len(rest) == 2:
                parent = validate_token(rest[0], "run_id")
                return InboxSubject("child", parent, validate_token(rest[1], "run_id"), sender)
            if kind == "hold" and len(rest) == 1:
                return InboxSubject("hold", validate_token(rest[0], "agent name"), "", sender)
            if kind == "limit" and len(rest) == 1:
                return InboxSubject("limit", validate_limit_name(rest[0]), "", sender)
            if kind == "schedule" and len(rest) == 1:
                return InboxSubject("schedule", validate_schedule_name(rest[0]), "", sender)
        raise InvalidName(f"subject {subject!r} is not a sojourn inbox subject")

    # the archive (retention: ended runs' histories once they leave the events stream)
    @property
    def archive_bucket(self) -> str:
        """The object store bucket of archived run histories (one object per run id)."""
        return self._stream("ARCHIVE")

    @property
    def archive_stream(self) -> str:
        """The stream behind ``archive_bucket`` (NATS object stores are streams ``OBJ_<b>``)."""
        return f"OBJ_{self.archive_bucket}"

    # the run model's snapshots (the watchdog and the projector start from one)
    @property
    def snapshots_bucket(self) -> str:
        """The object store bucket of run-model snapshots (one object per role: ``model``)."""
        return self._stream("SNAPSHOTS")

    @property
    def snapshots_stream(self) -> str:
        """The stream behind ``snapshots_bucket``."""
        return f"OBJ_{self.snapshots_bucket}"

    # large values by reference (content-addressed pieces, ``sojourn.actors.history.values``)
    @property
    def values_stream(self) -> str:
        """The stream of value pieces: one message per piece, on ``value(<sha256>)``."""
        return self._stream("VALUES")

    def value(self, digest: str) -> str:
        """The subject of the value piece whose SHA-256 (hex) is ``digest``."""
        return f"{self.prefix}.val.{digest}"

    @property
    def values_all(self) -> str:
        return f"{self.prefix}.val.*"

    # schedules (docs/wire.md, "Schedules")
    @property
    def schedules_stream(self) -> str:
        """The stream of schedules: each one's record, its pending fire, its fired message."""
        return self._stream("SCHEDULES")

    @property
    def schedules_all(self) -> str:
        return f"{self.prefix}.schedule.>"

    def schedule_record(self, name: str) -> str:
        """The one message holding schedule ``name``'s spec and state."""
        return f"{self.prefix}.schedule.rec.{name}"

    @property
    def schedule_records_all(self) -> str:
        return f"{self.prefix}.schedule.rec.*"

    def schedule_timer(self, name: str) -> str:
        """Schedule ``name``'s next fire: a one-shot message schedule (``@at``)."""
        return f"{self.prefix}.schedule.timer.{name}"

    def schedule_fire(self, agent: str, name: str) -> str:
        """Where the broker stores schedule ``name``'s fire when it is due."""
        return f"{self.prefix}.schedule.fire.{agent}.{name}"

    def schedule_fires(self, agent: str) -> str:
        """The filter of ``agent``'s fire consumer."""
        return f"{self.prefix}.schedule.fire.{agent}.*"

    def fire_consumer(self, agent: str) -> str:
        """The consumer of ``agent``'s schedules' fires, shared by the workers serving it."""
        return f"fire-{agent}"

    def schedule(self, name: str, sender: str) -> str:
        """Control subject: add, pause, resume, trigger or delete schedule ``name``."""
        return f"{self.prefix}.as.{sender}.schedule.{name}"

    # the read side (docs/wire.md, "The read side")
    @property
    def runs_bucket(self) -> str:
        """The KV bucket of run views (key: run id), kept by the projector."""
        return self._stream("RUNS")

    @property
    def runs_kv_stream(self) -> str:
        """The stream behind ``runs_bucket`` (NATS KV buckets are streams named ``KV_<b>``)."""
        return f"KV_{self.runs_bucket}"

    def run_key(self, run_id: str) -> str:
        """The subject of ``run_id``'s entry in the runs bucket."""
        return f"$KV.{self.runs_bucket}.{run_id}"

    def run_steps_key(self, run_id: str) -> str:
        """The subject of ``run_id``'s step record (``RunSteps``, key ``<run_id>.steps``) in
        the runs bucket."""
        return f"$KV.{self.runs_bucket}.{run_id}.steps"

    @property
    def run_keys_all(self) -> str:
        return f"$KV.{self.runs_bucket}.>"

    @property
    def changes_stream(self) -> str:
        """Every view the projector writes, also as a message on ``change``."""
        return self._stream("CHANGES")

    def change(self, agent: str, run_id: str) -> str:
        """Where each new view of a run is published: watch one run, one agent
        (``<prefix>.runs.<agent>.*``) or all of them (``<prefix>.runs.>``)."""
        return f"{self.prefix}.runs.{agent}.{run_id}"

    def changes_of(self, run_id: str) -> str:
        """The filter matching ``run_id``'s change messages (its agent unknown)."""
        return f"{self.prefix}.runs.*.{run_id}"

    @property
    def changes_all(self) -> str:
        return f"{self.prefix}.runs.*.*"

    @property
    def output_stream(self) -> str:
        """Runs' output chunks (``ctx.stream``, ``ctx.progress``), kept for days."""
        return self._stream("OUTPUT")

    def output(self, run_id: str) -> str:
        return f"{self.prefix}.out.{run_id}"

    @property
    def outputs_all(self) -> str:
        return f"{self.prefix}.out.*"

    def interrupt(self, run_id: str) -> str:
        """Core NATS, never stored: the intake's notice that a cancel of ``run_id`` is
        recorded, so that the worker executing it interrupts its running step at once."""
        return f"{self.prefix}.interrupt.{run_id}"

    @property
    def interrupts_all(self) -> str:
        """What every worker subscribes to (no queue group: each looks for the run)."""
        return f"{self.prefix}.interrupt.*"

    def parse_interrupt(self, subject: str) -> str:
        """The run id of an interrupt notice's subject, validated.

        Raises:
            InvalidName: not an interrupt subject of this deployment, or not a valid run id.
        """
        head = f"{self.prefix}.interrupt."
        if not subject.startswith(head):
            raise InvalidName(f"not an interrupt subject: {subject[:200]!r}")
        return validate_token(subject[len(head) :], "run_id")

    @property
    def query_runs(self) -> str:
        """The run listing service (request/reply, answered by a projector)."""
        return f"{self.prefix}.query.runs"

    def leader(self, role: str) -> str:
        """Where the processes of ``role`` that elect one to act (projectors) hold the
        leadership, by compare-and-set, in the health stream."""
        return f"{self.prefix}.leader.{role}"

    def wake(
        self, run_id: str, agent: str | None = None, priority: Priority = PRIORITY_DEFAULT
    ) -> str:
        """Where a wake of ``run_id`` goes: ``<prefix>.wake.<agent>.<run_id>``, consumed only by
        workers serving ``agent``, or ``<prefix>.wake.p<n>.<agent>.<run_id>`` for a run of a
        laned priority; without the agent, ``<prefix>.wake.<run_id>`` (any worker, the default
        lane)."""
        if agent is None:
            return f"{self.prefix}.wake.{run_id}"
        lane = lane_token(priority)
        if lane:
            return f"{self.prefix}.wake.{lane}.{agent}.{run_id}"
        return f"{self.prefix}.wake.{agent}.{run_id}"

    def agent_wakes(self, agent: str, priority: Priority = PRIORITY_DEFAULT) -> str:
        """The filter of ``agent``'s wake consumer of ``priority``."""
        lane = lane_token(priority)
        if lane:
            return f"{self.prefix}.wake.{lane}.{agent}.*"
        return f"{self.prefix}.wake.{agent}.*"

    @property
    def unrouted_wakes(self) -> str:
        """The filter of the shared consumer of wakes that name no agent."""
        return f"{self.prefix}.wake.*"

    def parse_wake(self, subject: str) -> tuple[str | None, str]:
        """``(agent or None, run_id)`` of a wake subject, validated.

        Raises:
            InvalidName: not a wake subject of this deployment, or a token is not a valid name.
        """
        head = f"{self.prefix}.wake."
        if not subject.startswith(head):
            raise InvalidName(f"not a wake subject: {subject[:200]!r}")
        tokens = subject[len(head) :].split(".")
        if len(tokens) == 1:
            return None, validate_token(tokens[0], "run id")
        if len(tokens) == 3 and parse_lane_token(tokens[0]) is not None:
            tokens = tokens[1:]  # a laned wake: its lane is its consumer's business
        if len(tokens) == 2:
            return validate_token(tokens[0], "agent"), validate_token(tokens[1], "run id")
        raise InvalidName(f"not a wake subject: {subject[:200]!r}")

    def timer(self, run_id: str, timer_id: str) -> str:
        return f"{self.prefix}.timer.{run_id}.{timer_id}"

    @property
    def wake_subjects(self) -> list[str]:
        return [
            f"{self.prefix}.wake.*",
            f"{self.prefix}.wake.*.*",
            *(f"{self.prefix}.wake.{lane_token(p)}.*.*" for p in LANED),
            f"{self.prefix}.timer.*.*",
        ]

    def dlq(self, kind: str) -> str:
        return f"{self.prefix}.dlq.{kind}"

    def lease(self, run_id: str) -> str:
        return f"{self.prefix}.lease.{run_id}"

    def agent(self, name: str) -> str:
        return f"{self.prefix}.agent.{name}"

    def hold(self, agent: str) -> str:
        """An agent's hold (``AgentHold``; its last message is the agent's state), in the
        agents stream."""
        return f"{self.prefix}.hold.{agent}"

    @property
    def holds_all(self) -> str:
        return f"{self.prefix}.hold.*"

    def held(self, agent: str, run_id: str) -> str:
        """A run a hold of ``agent`` suspended (``HeldRun``), purged once it is resumed."""
        return f"{self.prefix}.held.{agent}.{run_id}"

    def limit(self, name: str) -> str:
        """A shared rate limit's record (``LimitRecord``; its last message is the limit's
        state, changed by compare-and-set only), in the agents stream."""
        return f"{self.prefix}.limit.{name}"

    @property
    def limits_all(self) -> str:
        return f"{self.prefix}.limit.*"

    def worker(self, worker_id: str) -> str:
        """The heartbeat subject of a worker (its id made one subject token)."""
        return f"{self.prefix}.worker.{_WORKER_UNSAFE.sub('_', worker_id)[:128]}"

    @property
    def workers_all(self) -> str:
        return f"{self.prefix}.worker.*"

    def presence(self, worker_id: str) -> str:
        """Core NATS, never stored: where a worker answers while its connection is up. A
        request there is answered "no responders" by the server the moment that connection is
        gone (the process was killed), long before its heartbeats are missed for long."""
        return f"{self.prefix}.presence.{_WORKER_UNSAFE.sub('_', worker_id)[:128]}"

    @property
    def presence_all(self) -> str:
        return f"{self.prefix}.presence.*"

    def watch(self, run_id: str) -> str:
        """Where watchdogs record (by compare-and-set) the last action taken on a run."""
        return f"{self.prefix}.watch.{run_id}"

    def wedge(self, run_id: str) -> str:
        """Where a worker records that it gave up on a run (poison, max deliveries)."""
        return f"{self.prefix}.wedge.{run_id}"

    @property
    def leases_all(self) -> str:
        return f"{self.prefix}.lease.*"

    @property
    def dlq_all(self) -> str:
        return f"{self.prefix}.dlq.*"

    def subject_token(self, subject: str, index: int) -> str:
        """The ``index``-th token after the prefix (``sojourn.start.greeter`` -> 1 -> greeter)."""
        return subject[len(self.prefix) + 1 :].split(".")[index]
