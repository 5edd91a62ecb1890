"""Subject, stream and consumer names for one sojourn deployment.

Everything hangs off one prefix (``sojourn`` by default) so several deployments, or every test in
a suite, can share one NATS server without seeing each other. Names users type (agents, run ids,
signal names) must be single subject tokens: a ``.`` would silently change which subject a
message lands on, and ``*``/``>`` would turn it into a wildcard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sojourn.schemas.errors import InvalidName

__all__ = ["TOKEN_PATTERN", "Names", "validate_signal_name", "validate_token"]

TOKEN_PATTERN = r"[A-Za-z0-9_-]{1,128}"
_TOKEN = re.compile(rf"^{TOKEN_PATTERN}$")


_WORKER_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_PREFIX = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_SIGNAL = re.compile(rf"^{TOKEN_PATTERN}(\.{TOKEN_PATTERN})*$")


def validate_signal_name(value: object) -> str:
    """Signal names are dot-separated tokens (``docs.signed``), at most 256 characters."""
    if not isinstance(value, str) or len(value) > 256 or not _SIGNAL.match(value):
        raise InvalidName(
            f"invalid signal name {value!r}: use dot-separated parts of A-Z a-z 0-9 _ - "
            "(for example 'docs.signed'), at most 256 characters"
        )
    return value


def validate_token(value: object, what: str) -> str:
    """Return ``value`` if it is a valid name token, else raise ``InvalidName`` saying why."""
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise InvalidName(
            f"invalid {what} {value!r}: use 1-128 characters from A-Z a-z 0-9 _ - "
            "(it becomes one NATS subject token)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Names:
    """All names derived from a deployment prefix."""

    prefix: str = "sojourn"

    def __post_init__(self) -> None:
        # Stream names are derived by upper-casing the prefix, so allow only one spelling of
        # each: "my-app" and "My_App" must not share streams by accident.
        if not _PREFIX.match(self.prefix):
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
        return "intake"

    @property
    def wake_consumer(self) -> str:
        return "workers"

    # subjects
    def events(self, run_id: str) -> str:
        return f"{self.prefix}.ev.{run_id}"

    @property
    def events_all(self) -> str:
        return f"{self.prefix}.ev.*"

    def start(self, agent: str) -> str:
        return f"{self.prefix}.start.{agent}"

    def signal(self, run_id: str, name: str) -> str:
        return f"{self.prefix}.signal.{run_id}.{name}"

    def cancel(self, run_id: str) -> str:
        return f"{self.prefix}.cancel.{run_id}"

    @property
    def inbox_subjects(self) -> list[str]:
        p = self.prefix
        return [f"{p}.start.*", f"{p}.signal.*.>", f"{p}.cancel.*"]

    def wake(self, run_id: str) -> str:
        return f"{self.prefix}.wake.{run_id}"

    def timer(self, run_id: str, timer_id: str) -> str:
        return f"{self.prefix}.timer.{run_id}.{timer_id}"

    @property
    def wake_subjects(self) -> list[str]:
        return [f"{self.prefix}.wake.*", f"{self.prefix}.timer.*.*"]

    def dlq(self, kind: str) -> str:
        return f"{self.prefix}.dlq.{kind}"

    def lease(self, run_id: str) -> str:
        return f"{self.prefix}.lease.{run_id}"

    def agent(self, name: str) -> str:
        return f"{self.prefix}.agent.{name}"

    def worker(self, worker_id: str) -> str:
        """The heartbeat subject of a worker (its id made one subject token)."""
        return f"{self.prefix}.worker.{_WORKER_UNSAFE.sub('_', worker_id)[:128]}"

    @property
    def workers_all(self) -> str:
        return f"{self.prefix}.worker.*"

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

    def signal_name(self, subject: str) -> str:
        """The signal name of ``<prefix>.signal.<run_id>.<name...>``."""
        return ".".join(subject[len(self.prefix) + 1 :].split(".")[2:])

    def subject_token(self, subject: str, index: int) -> str:
        """The ``index``-th token after the prefix (``sojourn.start.greeter`` -> 1 -> greeter)."""
        return subject[len(self.prefix) + 1 :].split(".")[index]
