"""Diagnostics: which broker operations a run performs, how long each takes, and where the
Python time goes. Untimed; runs after the measured sections on its own deployment prefix.

``TracedBroker`` wraps one ``Broker`` *instance* (nothing in the runtime is patched): every
``nc.request`` (a round trip the caller awaits), every batched direct get (history load) and
every fire-and-forget ``nc.publish`` (acks, pull requests, replies) is recorded with its
subject category, start time and duration. To see those it reaches inside the façade on
purpose (``Broker._nc``, the nats-py connection, and ``Broker._direct.batch``, its batched
direct gets): a diagnostic, not a pattern.
"""

from __future__ import annotations

import asyncio
import contextvars
import cProfile
import io
import pstats
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sojourn.broker.connection import Broker

__all__ = ["Op", "TracedBroker", "categorize", "profile_summary"]

_nested: contextvars.ContextVar[bool] = contextvars.ContextVar("bench_nested", default=False)


@dataclass(slots=True)
class Op:
    t0: float
    dt: float
    kind: str  # "rt" (awaited round trip) or "pub" (fire-and-forget publish)
    cat: str
    subject: str


def categorize(prefix: str, subject: str) -> str:
    if subject.startswith("$JS.API.DIRECT.GET"):
        return "direct get"
    if subject.startswith("$JS.API.CONSUMER.MSG.NEXT"):
        return "pull request (fetch)"
    if subject.startswith("$JS.ACK"):
        return "ack / nak / in-progress"
    if subject.startswith("$JS.API"):
        return "JetStream API"
    if subject.startswith("_INBOX") or subject.startswith(f"{prefix}-reply"):
        return "reply to client"
    head = subject[len(prefix) + 1 :].split(".")[0] if subject.startswith(prefix + ".") else ""
    return {
        "ev": "event append (CAS)",
        "lease": "lease write (CAS)",
        "wake": "wake publish",
        "start": "trigger publish",
        "dlq": "dead letter",
        "agent": "registry",
    }.get(head, "other")


class TracedBroker:
    """Record the broker traffic of one ``Broker`` instance."""

    def __init__(self, broker: Broker, prefix: str) -> None:
        self.broker = broker
        self.prefix = prefix
        self.ops: list[Op] = []
        self.enabled = False
        # Deliberately reaching inside the opaque façade: the nats-py connection is private
        # to sojourn.broker, but only at that level is every round trip and publish visible.
        nc = broker._nc
        orig_request = nc.request
        orig_publish = nc.publish
        orig_batch = broker._direct.batch

        async def request(
            subject: str,
            payload: bytes = b"",
            timeout: float = 0.5,
            old_style: bool = False,
            headers: Any = None,
        ) -> Any:
            tok = _nested.set(True)
            t0 = time.perf_counter()
            try:
                return await orig_request(
                    subject, payload, timeout=timeout, old_style=old_style, headers=headers
                )
            finally:
                _nested.reset(tok)
                self._record(t0, "rt", subject)

        async def publish(
            subject: str, payload: bytes = b"", reply: str = "", headers: Any = None
        ) -> None:
            if _nested.get():
                return await orig_publish(subject, payload, reply=reply, headers=headers)
            t0 = time.perf_counter()
            try:
                return await orig_publish(subject, payload, reply=reply, headers=headers)
            finally:
                self._record(t0, "pub", subject)

        async def direct_batch(
            stream: str, subject: str, seq: int, batch: int, timeout: float
        ) -> Any:
            tok = _nested.set(True)
            t0 = time.perf_counter()
            try:
                return await orig_batch(stream, subject, seq, batch, timeout)
            finally:
                _nested.reset(tok)
                self._record(t0, "rt", "$JS.API.DIRECT.GET (batch: history load)")

        orig_pull = broker.pull

        async def pull(stream: str, consumer: str) -> Any:
            pc = await orig_pull(stream, consumer)
            orig_fetch = pc.fetch

            async def fetch(batch: int, timeout: float) -> Any:
                t0 = time.perf_counter()
                msgs = await orig_fetch(batch, timeout)
                if msgs:  # an idle long poll that returns nothing is not interesting
                    self._record(t0, "fetch", f"fetch {consumer}: {len(msgs)} msg(s)")
                return msgs

            pc.fetch = fetch  # type: ignore[method-assign]
            return pc

        broker.pull = pull  # type: ignore[method-assign]
        nc.request = request  # type: ignore[method-assign]
        nc.publish = publish  # type: ignore[method-assign]
        broker._direct.batch = direct_batch  # type: ignore[method-assign]

    def _record(self, t0: float, kind: str, subject: str) -> None:
        if self.enabled:
            cat = subject if kind == "fetch" else categorize(self.prefix, subject)
            if "history load" in subject:
                cat = "history load (batch direct get)"
            self.ops.append(Op(t0, time.perf_counter() - t0, kind, cat, subject))

    def start(self) -> None:
        self.ops.clear()
        self.enabled = True

    def stop(self) -> list[Op]:
        self.enabled = False
        return list(self.ops)

    @staticmethod
    def by_category(ops: list[Op]) -> dict[tuple[str, str], tuple[int, float]]:
        """(kind, category) -> (count, total seconds)."""
        agg: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        for o in ops:
            a = agg[(o.kind, o.cat)]
            a[0] += 1
            a[1] += o.dt
        return {k: (int(v[0]), v[1]) for k, v in sorted(agg.items())}


def profile_summary(prof: cProfile.Profile, top: int = 18) -> str:
    """Top functions by own time, plus own time grouped by library."""
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(top)
    groups: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _line, _fn), (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        total += tt
        f = filename.replace("\\", "/")
        if "/nats/" in f and "site-packages" in f:  # before ours: a venv may sit in the tree
            g = "nats-py"
        elif (
            "/bench/" not in f
            and "site-packages" not in f
            and ("/sojourn/" in f or "/work/main/" in f)
        ):
            g = "sojourn"
        elif "/asyncio/" in f or "uvloop" in f:
            g = "asyncio/uvloop"
        elif "msgspec" in f:
            g = "msgspec"
        elif "/bench/" in f:
            g = "bench"
        elif f.startswith("~") or f == "":
            g = "builtins (C)"
        else:
            g = "other stdlib"
        groups[g] += tt
    lines = ["own time by library (cProfile, inflated by profiling overhead):"]
    for g, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {g:<16} {t:8.3f} s  {100 * t / total if total else 0:5.1f} %")
    return "\n".join(lines) + "\n\n" + s.getvalue()


async def gather_limited(coros: list[Any], limit: int = 50) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))
