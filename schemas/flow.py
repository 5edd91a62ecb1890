"""Keyed starts (decision 0047): singleton starts and debounced starts.

A start may name a **singleton key**: while a run started with that key (for that agent) is
live, a start with the same key attaches to it instead of starting another. It may instead ask
to be **debounced** under a key: a burst of such starts starts one run, ``seconds`` after the
last of them, with the last input (``inputs="last"``) or the list of all of them (``"all"``).

Keys are hostile data: at most ``KEY_MAX_BYTES`` bytes of UTF-8 without control characters,
never put in a subject (``key_token`` hashes them). Pure: the bodies, the records the broker
keeps, and the rules; no I/O.
"""

from __future__ import annotations

import hashlib
import math
import re
import typing
from datetime import timedelta
from typing import Literal, TypedDict

import msgspec

from .events import Budget

__all__ = [
    "DEBOUNCED_RUN_ID",
    "DEBOUNCE_INPUTS",
    "DEBOUNCE_INPUTS_MAX",
    "DEBOUNCE_MAX",
    "DEBOUNCE_MIN",
    "KEY_MAX_BYTES",
    "RECORDED_MAX",
    "DebounceBody",
    "DebounceEntry",
    "DebounceInputs",
    "DebounceRecord",
    "KeyedOptions",
    "SingletonRecord",
    "burst_fault",
    "debounce_fault",
    "debounced_run_id",
    "key_fault",
    "key_token",
    "parse_window",
    "singleton_fault",
]

KEY_MAX_BYTES = 256
"""The longest singleton or debounce key, in UTF-8 bytes."""

DEBOUNCE_MIN = 0.1
"""The shortest debounce window, in seconds (the broker fires message schedules on a tick of
about 250 ms: shorter would only be that)."""

DEBOUNCE_MAX = 7 * 86_400.0
"""The longest debounce window, in seconds (a week)."""

DEBOUNCE_INPUTS_MAX = 1000
"""The most inputs one burst of ``inputs="all"`` carries: the trigger that would add one more
(or whose input would make the burst's inputs larger than a trigger may be) closes the burst
at once, starting its run now, and opens the next burst with its own input. Nothing is
dropped."""

RECORDED_MAX = 1024
"""The inbox sequences of the latest triggers recorded under a debounce key, kept in its
record, so that a trigger redelivered after its worker died is not recorded twice."""

DebounceInputs = Literal["last", "all"]
"""What the run of a burst gets as its input: the last trigger's, or the list of every
trigger's, in the order the inbox stored them."""

DEBOUNCE_INPUTS: tuple[DebounceInputs, ...] = typing.get_args(DebounceInputs)

DEBOUNCED_RUN_ID = re.compile(r"d[0-9a-f]{20}-b[1-9][0-9]{0,19}")
"""Run ids of this form are started by debounced bursts (``debounced_run_id``): only a burst
makes them, so no client can take one before its burst ends."""


class KeyedOptions(TypedDict, total=False):
    """The keyword arguments of ``Client.start`` and ``Client.trigger`` that make a start
    keyed (a part of ``StartOptions``): what the CLI and the gateway pass on."""

    singleton_key: str | None
    debounce: float | timedelta | None
    debounce_key: str | None
    debounce_inputs: DebounceInputs


class DebounceBody(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """``StartTrigger.debounce``: start one run ``seconds`` after the last of a burst of starts
    of the agent with the same ``key``."""

    seconds: float
    key: str
    inputs: DebounceInputs = "last"


class SingletonRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The one message on ``<prefix>.schedule.flow.single.<agent>.<key_token>``: the run a
    singleton key names, written by compare-and-set before that run is created."""

    agent: str
    key: str
    run_id: str
    """The run the key names: live until its chain's current run's last event is an end."""
    inbox_seq: int
    """The inbox sequence of the start that wrote this record: while that message is still in
    the inbox (not yet acknowledged), the run it names may still be created."""
    at: float


class DebounceEntry(msgspec.Struct, frozen=True, array_like=True):
    """One trigger of a burst: its inbox sequence and its input."""

    seq: int
    input: msgspec.Raw


class DebounceRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The one message on ``<prefix>.schedule.flow.burst.<agent>.<key_token>``: a debounce
    key's current (or last) burst, rewritten by compare-and-set by every trigger and closed by
    the fire that starts its run (or by the trigger that finds it full)."""

    agent: str
    key: str
    burst: int
    """The inbox sequence of the burst's first trigger: it names the burst's run
    (``debounced_run_id``)."""
    inputs: DebounceInputs
    seconds: float
    deadline: float
    """When the burst's run starts (Unix seconds): the last trigger's inbox time plus
    ``seconds``."""
    entries: tuple[DebounceEntry, ...]
    """The inputs the run gets: the last trigger's (``last``), or every trigger's in inbox
    order (``all``)."""
    count: int
    """Triggers in the burst."""
    recorded: tuple[int, ...] = ()
    """The inbox sequences of the latest ``RECORDED_MAX`` triggers recorded under the key
    (this burst's and earlier ones'), ascending."""
    budget: Budget | None = None
    attributes: dict[str, str | int | float | bool] | None = None
    sent_by: str | None = None
    """Of the burst's last trigger: its run is started with them."""
    closed: bool = False
    """The burst is over: its run is (or is being) created; the next trigger opens a new one."""
    updated_at: float = 0.0

    @property
    def run_id(self) -> str:
        return debounced_run_id(self.agent, self.key, self.burst)


def key_fault(key: object) -> str | None:
    """Why ``key`` cannot be a singleton or debounce key, ``None`` when it can."""
    if not isinstance(key, str):
        return f"a key is a string, not {type(key).__name__}"
    if not key:
        return "a key is not empty"
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "a key is text (it holds a lone surrogate)"
    if size > KEY_MAX_BYTES:
        return f"a key is at most {KEY_MAX_BYTES} bytes of UTF-8, not {size}"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in key):
        return "a key holds no control characters"
    return None


def debounce_fault(body: DebounceBody) -> str | None:
    """Why ``body`` cannot debounce a start, ``None`` when it can."""
    why = key_fault(body.key)
    if why is not None:
        return f"debounce key: {why}"
    s = body.seconds
    if not math.isfinite(s) or not DEBOUNCE_MIN <= s <= DEBOUNCE_MAX:
        return f"debounce seconds must be from {DEBOUNCE_MIN} to {DEBOUNCE_MAX:g}, not {s!r}"
    return None


_WINDOW = re.compile(
    r"(?:([0-9]{1,6})h)?(?:([0-9]{1,6})m(?!s))?(?:([0-9]{1,9}(?:\.[0-9]{1,3})?)s)?"
)
_MILLIS = re.compile(r"([0-9]{1,9})ms")
_PLAIN = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,3})?")


def parse_window(text: str) -> float:
    """Seconds from a debounce window as a person writes it: ``"30s"``, ``"1.5s"``,
    ``"500ms"``, ``"2m"``, ``"1h30m"`` or ``"45"`` (seconds), within ``DEBOUNCE_MIN`` and
    ``DEBOUNCE_MAX``.

    Raises:
        ValueError: anything else.
    """
    seconds: float | None = None
    if len(text) <= 32:
        if _PLAIN.fullmatch(text):
            seconds = float(text)
        elif m := _MILLIS.fullmatch(text):
            seconds = int(m.group(1)) / 1000
        elif (m := _WINDOW.fullmatch(text)) and any(m.groups()):
            h, mins, s = m.groups()
            seconds = int(h or 0) * 3600 + int(mins or 0) * 60 + float(s or 0)
    if seconds is None or not DEBOUNCE_MIN <= seconds <= DEBOUNCE_MAX:
        raise ValueError(
            f"{text[:40]!r} is not a debounce window: a duration from 100ms to 7 days, like "
            "500ms, 30s, 2m, 1h30m"
        )
    return seconds


_RUN_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")
_TIME_MAX = 253_402_300_799.0
"""9999-12-31T23:59:59Z: the last time a message schedule can be armed for."""
_SEQ_MAX = 2**63


def singleton_fault(rec: SingletonRecord) -> str | None:
    """Why a stored singleton record cannot be acted on (anyone may publish on its subject
    on a deployment without authentication), ``None`` when it can."""
    if not _RUN_TOKEN.fullmatch(rec.run_id) or not 0 <= rec.inbox_seq < _SEQ_MAX:
        return "it names no run"
    return key_fault(rec.key)


def burst_fault(rec: DebounceRecord) -> str | None:
    """Why a stored burst record cannot be acted on, ``None`` when it can: nothing it holds
    may make a trigger or a fire fail on every delivery (a time that cannot be armed, no
    input)."""
    if not 0 < rec.burst < _SEQ_MAX or not rec.entries or not 0 <= rec.count < _SEQ_MAX:
        return "its burst is out of range"
    if not (math.isfinite(rec.deadline) and 0 <= rec.deadline <= _TIME_MAX):
        return "its deadline cannot be armed"
    if not all(0 <= e.seq < _SEQ_MAX for e in rec.entries) or len(rec.recorded) > RECORDED_MAX:
        return "its entries are out of range"
    return key_fault(rec.key) or debounce_fault(
        DebounceBody(seconds=rec.seconds, key=rec.key, inputs=rec.inputs)
    )


def key_token(key: str) -> str:
    """The subject token a key stands for: 32 hex digits of its BLAKE2b digest (the agent is
    another token of the subject)."""
    return hashlib.blake2b(key.encode("utf-8"), digest_size=16).hexdigest()


def debounced_run_id(agent: str, key: str, burst: int) -> str:
    """The run id of ``agent``'s burst under ``key`` that began with the trigger at inbox
    sequence ``burst``: the same wherever and however often it is computed."""
    digest = hashlib.blake2b(f"{agent}\0{key}".encode(), digest_size=10).hexdigest()
    return f"d{digest}-b{burst}"
