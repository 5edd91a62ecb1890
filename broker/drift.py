"""How a live stream or durable consumer differs from sojourn's config, and whether sojourn can
live with the difference. Pure: no I/O (``topology`` and ``Broker.ensure_*`` do the reading).

sojourn creates what is missing and never rewrites what exists: an operator may have tuned a
stream (more replicas, a shorter DLQ retention, compression), and a worker that restored its own
config on every start would undo that behind their back. So every key sojourn sets is one of:

- **relied on**: sojourn's behaviour depends on the exact value, and another value breaks a
  guarantee, usually silently. ``subjects`` (a message on a subject no stream holds is lost),
  ``retention`` (workqueue deletes the inbox message on ack; limits keeps every history),
  ``storage`` (memory loses everything on a restart), ``discard`` (``old`` on a full stream
  drops the oldest messages: histories; ``new`` refuses writes: the KV's views stay consistent),
  ``max_msgs_per_subject`` (1 makes leases, wakes and views last-value subjects), the
  ``allow_*`` features sojourn uses (direct get, schedules, per-message TTL, rollups, atomic
  batches), and for consumers ``filter_subject(s)``, ``ack_policy``, ``deliver_policy``,
  ``replay_policy``.
- **a protection**: ``deny_delete`` and ``deny_purge``. Where sojourn turns one on, it relies
  on it (history is immutable); where sojourn leaves it off, an operator may turn it on (it
  only stops sojourn's own clean-up, e.g. retention purging ended runs, which then fails
  loudly). JetStream cannot turn either off on an existing stream.
- **a floor**: ``duplicate_window`` must be at least sojourn's (idempotent publishes are
  promised for that long); a longer one is a tunable difference.
- **a limit**: ``max_age``, ``max_msgs``, ``max_bytes`` and a consumer's ``max_deliver``.
  Where sojourn sets the unlimited value (0 or -1) it relies on it: the events stream must never
  expire a history, a wedge record must outlive any outage, a wake must be redelivered until it
  is acked. Where sojourn sets a finite value (the DLQ's 30 days, the changes' and output
  streams' ages) it is a default an operator may tune.
- **tunable**: everything else, such as ``num_replicas``, ``placement``, ``compression``,
  ``max_msg_size``, and a consumer's ``ack_wait`` and ``max_ack_pending`` (timing and flow
  control: the run fence, not the consumer, keeps a run from executing twice).

Keys sojourn does not set are not compared at all. ``name`` and ``durable_name`` identify.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Finding",
    "KeyDiff",
    "State",
    "compare_consumer",
    "compare_stream",
    "consumer_finding",
    "reconciled",
    "stream_finding",
]

State = Literal["missing", "created", "ok", "drift", "incompatible"]
"""What the live object is compared with sojourn's config: ``missing`` (not there),
``created`` (just made, as configured), ``ok`` (as configured), ``drift`` (differs only in
tunable keys: left alone), ``incompatible`` (differs in a key sojourn relies on)."""

Kind = Literal["stream", "consumer"]

_IDENTITY = frozenset({"name", "durable_name"})
_STREAM_EXACT = frozenset(
    {
        "subjects",
        "retention",
        "storage",
        "discard",
        "max_msgs_per_subject",
        "allow_direct",
        "allow_msg_schedules",
        "allow_msg_ttl",
        "allow_rollup_hdrs",
        "allow_atomic",
    }
)
_PROTECTIONS = frozenset({"deny_delete", "deny_purge"})
_CAPABILITIES = frozenset({"allow_atomic"})
"""Features of a stream that ``sojourn topology --apply`` turns on wherever sojourn's config
has them, even where sojourn can do without (``optional``: the events stream's atomic
publish, which only makes appends faster)."""
_CONSUMER_EXACT = frozenset(
    {"filter_subject", "filter_subjects", "ack_policy", "deliver_policy", "replay_policy"}
)
_FLOORS = frozenset({"duplicate_window"})
_UNLIMITED: Mapping[str, int] = {"max_age": 0, "max_msgs": -1, "max_bytes": -1, "max_deliver": -1}
_SETS = frozenset({"subjects", "filter_subjects"})

# What the server means when it leaves a key out of a config it reports (Go's omitempty).
_STREAM_DEFAULTS: Mapping[str, Any] = {
    "subjects": [],
    "retention": "limits",
    "storage": "file",
    "discard": "old",
    "max_msgs": -1,
    "max_bytes": -1,
    "max_age": 0,
    "max_msgs_per_subject": -1,
    "num_replicas": 1,
    "duplicate_window": 0,
    "compression": "none",
}
_CONSUMER_DEFAULTS: Mapping[str, Any] = {
    "filter_subject": "",
    "filter_subjects": [],
    "deliver_policy": "all",
    "ack_policy": "none",
    "replay_policy": "instant",
    "max_deliver": -1,
    "num_replicas": 0,
}


@dataclass(frozen=True, slots=True)
class KeyDiff:
    """One key whose live value (``theirs``) is not sojourn's (``ours``).

    Attributes:
        relied: sojourn relies on the key: the object is incompatible until it is fixed.
    """

    key: str
    ours: Any
    theirs: Any
    relied: bool

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "ours": self.ours, "theirs": self.theirs, "relied": self.relied}


@dataclass(frozen=True, slots=True)
class Finding:
    """A stream (``consumer`` None) or a durable consumer, compared with sojourn's config."""

    kind: Kind
    stream: str
    consumer: str | None
    state: State
    diffs: tuple[KeyDiff, ...] = ()

    @property
    def what(self) -> str:
        """``stream NAME`` or ``consumer STREAM/NAME``, for messages."""
        if self.consumer is None:
            return f"stream {self.stream}"
        return f"consumer {self.stream}/{self.consumer}"

    @property
    def relied(self) -> tuple[KeyDiff, ...]:
        return tuple(d for d in self.diffs if d.relied)

    @property
    def tunable(self) -> tuple[KeyDiff, ...]:
        return tuple(d for d in self.diffs if not d.relied)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "stream": self.stream,
            "consumer": self.consumer,
            "state": self.state,
            "diffs": [d.to_json() for d in self.diffs],
        }


def _norm(key: str, value: Any) -> Any:
    if key in _SETS and isinstance(value, list):
        return sorted(map(str, value))
    return value


def _relied(key: str, ours: Any, theirs: Any, exact: frozenset[str]) -> bool:
    """Whether a difference in ``key`` breaks something sojourn relies on."""
    if key in exact:
        return True
    if key in _PROTECTIONS:
        return ours is True  # a protection sojourn asks for; one it does not, may be added
    if key in _FLOORS:
        return not (isinstance(theirs, int) and isinstance(ours, int) and theirs >= ours)
    unlimited = _UNLIMITED.get(key)
    return unlimited is not None and ours == unlimited  # sojourn relies on "no limit"


def _compare(
    ours: Mapping[str, Any],
    theirs: Mapping[str, Any],
    exact: frozenset[str],
    defaults: Mapping[str, Any],
    optional: frozenset[str] = frozenset(),
) -> tuple[KeyDiff, ...]:
    diffs = []
    for key in sorted(ours):
        if key in _IDENTITY:
            continue
        mine = ours[key]
        live = theirs.get(key, defaults.get(key))
        if _norm(key, mine) == _norm(key, live):
            continue
        relied = key not in optional and _relied(key, mine, live, exact)
        diffs.append(KeyDiff(key, mine, live, relied))
    return tuple(diffs)


def compare_stream(
    ours: Mapping[str, Any], theirs: Mapping[str, Any], optional: frozenset[str] = frozenset()
) -> tuple[KeyDiff, ...]:
    """The keys of sojourn's stream config ``ours`` whose live value in ``theirs`` differs;
    a difference in an ``optional`` key is never relied on (sojourn works without it)."""
    return _compare(ours, theirs, _STREAM_EXACT, _STREAM_DEFAULTS, optional)


def compare_consumer(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> tuple[KeyDiff, ...]:
    """The keys of sojourn's consumer config ``ours`` whose live value in ``theirs`` differs."""
    return _compare(ours, theirs, _CONSUMER_EXACT, _CONSUMER_DEFAULTS)


def stream_finding(
    ours: Mapping[str, Any],
    theirs: Mapping[str, Any] | None,
    optional: frozenset[str] = frozenset(),
) -> Finding:
    """The finding for sojourn's stream config ``ours`` and the live one (``None``: missing);
    ``optional``: keys sojourn can do without on this stream (``compare_stream``)."""
    return _finding("stream", str(ours["name"]), None, ours, theirs, optional)


def consumer_finding(
    stream: str, ours: Mapping[str, Any], theirs: Mapping[str, Any] | None
) -> Finding:
    """The finding for sojourn's durable consumer config ``ours`` on ``stream``."""
    return _finding("consumer", stream, str(ours["durable_name"]), ours, theirs)


def _finding(
    kind: Kind,
    stream: str,
    consumer: str | None,
    ours: Mapping[str, Any],
    theirs: Mapping[str, Any] | None,
    optional: frozenset[str] = frozenset(),
) -> Finding:
    if theirs is None:
        return Finding(kind, stream, consumer, "missing")
    if kind == "stream":
        diffs = compare_stream(ours, theirs, optional)
    else:
        diffs = compare_consumer(ours, theirs)
    state: State = "incompatible" if any(d.relied for d in diffs) else "drift" if diffs else "ok"
    return Finding(kind, stream, consumer, state, diffs)


def reconciled(
    ours: Mapping[str, Any], theirs: Mapping[str, Any], diffs: tuple[KeyDiff, ...]
) -> dict[str, Any]:
    """The live config ``theirs`` with every key sojourn relies on set to ``ours`` (and every
    capability it uses turned on), and the tunable ones left as the operator has them: what
    ``sojourn topology --apply`` writes."""
    out = dict(theirs)
    for d in diffs:
        if d.relied or (d.key in _CAPABILITIES and d.ours is True):
            out[d.key] = ours[d.key]
    return out
