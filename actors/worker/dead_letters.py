"""Dead letters: the records a worker keeps of what it gives up on.

A message the intake refuses, a wake delivered too often or naming no run, a fire that is not
one sojourn armed, a run whose activations keep failing: each is given up on once, with a
``DeadLetter`` on ``<prefix>.dlq.<kind>`` that keeps the reason and the original bytes (an
operator can fix and republish), counted in ``sojourn_dead_letters_total{code}``. A run given
up on is also marked wedged (a ``WedgeRecord``, which the watchdog reports) until its history
changes. ``FailureCounts`` counts the failed activations that lead there.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from typing import Literal

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery
from sojourn.broker.names import Names
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.health import WedgeRecord
from sojourn.schemas.wire import DeadLetter

from ..ops import metrics
from .tenancy import times_delivered

__all__ = [
    "DlqKind",
    "FailureCounts",
    "activation_failed",
    "dead_letter",
    "drop_bad_wake",
    "drop_wake",
    "give_up",
    "send_dead_letter",
]

log = logging.getLogger("sojourn.worker")

DlqKind = Literal["start", "signal", "cancel", "other"]
"""The dead-letter subjects a worker writes on (``<prefix>.dlq.<kind>``)."""

DEAD_LETTER_HEADERS_MAX = 16 * 1024
"""Header bytes a dead-letter record keeps; beyond it the headers are summarised."""

_RECORD_OVERHEAD = 64 * 1024
"""Room left in a dead-letter message for everything but the body."""


def dead_letter(msg: Delivery, kind: DlqKind, code: str, message: str, *, limit: int) -> DeadLetter:
    """A dead-letter record of ``msg`` that fits in a message of ``limit`` bytes.

    The body is kept whole when its base64 fits; otherwise its head is kept, marked
    ``truncated``, with the size and SHA-256 of the whole. Oversized headers are summarised.
    """
    data = bytes(msg.data)
    room = max(0, (limit - _RECORD_OVERHEAD) * 3 // 4)  # base64 grows 4/3
    headers = dict(msg.headers)
    if sum(len(k) + len(v) for k, v in headers.items()) > DEAD_LETTER_HEADERS_MAX:
        headers = {k[:256]: v[:256] for k, v in list(headers.items())[:32] if isinstance(v, str)}
        headers[h.DLQ_NOTE] = "headers truncated"
    return DeadLetter(
        code=code,
        message=message,
        subject=msg.subject[:1024],
        data=data[:room],
        headers=headers,
        inbox_seq=msg.stream_seq,
        rejected_at=time.time(),
        kind=kind,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        truncated=len(data) > room,
    )


async def send_dead_letter(broker: Broker, names: Names, record: DeadLetter) -> None:
    """Store ``record`` on the dead-letter subject of its kind, and count it by its code."""
    await broker.publish(names.dlq(record.kind), encode(record))
    metrics.DEAD_LETTERS.labels(record.code).inc()


async def drop_wake(
    broker: Broker, names: Names, settings: Settings, msg: Delivery, run_id: str
) -> None:
    """A wake delivered ``max_deliveries`` times is given up (dead-lettered, not retried
    forever); a run left waiting for it is flagged and re-woken by the watchdog."""
    reason = (
        f"wake for run {run_id} delivered {times_delivered(msg)} times without being settled "
        f"(Settings.max_deliveries = {settings.max_deliveries})"
    )
    log.error("%s; dead-lettered", reason)
    limit = broker.max_payload or (1024 * 1024)
    await send_dead_letter(
        broker, names, dead_letter(msg, "other", "max_deliveries", reason, limit=limit)
    )
    await msg.ack()


async def drop_bad_wake(broker: Broker, names: Names, msg: Delivery, error: InvalidName) -> None:
    """A message on a wake subject that names no valid run (only a deployment without
    authentication lets anyone publish there): dead-lettered, never executed."""
    log.error("dropped a wake on %r: %s", msg.subject[:200], error)
    limit = broker.max_payload or (1024 * 1024)
    await send_dead_letter(
        broker, names, dead_letter(msg, "other", "invalid_run_id", str(error), limit=limit)
    )
    await msg.ack()


async def give_up(
    broker: Broker,
    names: Names,
    run_id: str,
    code: str,
    reason: str,
    seq: int,
    *,
    permanent: bool = False,
) -> None:
    """Stop retrying a run: mark it wedged (the watchdog reports it) and keep a dead-letter
    record for operators."""
    now = time.time()
    wedge = WedgeRecord(
        run_id=run_id, code=code, reason=reason, seq=seq, permanent=permanent, at=now
    )
    await broker.publish(names.wedge(run_id), encode(wedge))
    record = DeadLetter(
        code=code,
        message=reason,
        subject=names.events(run_id),
        data=b"",
        rejected_at=now,
        inbox_seq=seq,
    )
    await send_dead_letter(broker, names, record)


class FailureCounts:
    """Consecutive failed activations per run, for at most ``limit`` runs: the runs failed
    longest ago are forgotten, so runs another worker finished, or that never came back here,
    do not stay in memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: OrderedDict[str, int] = OrderedDict()

    def add(self, run_id: str) -> int:
        """Count one more failure of ``run_id``; return its count."""
        n = self._counts.pop(run_id, 0) + 1
        self._counts[run_id] = n  # most recent last
        while len(self._counts) > self.limit:
            self._counts.popitem(last=False)
        return n

    def clear(self, run_id: str) -> None:
        self._counts.pop(run_id, None)

    def __len__(self) -> int:
        return len(self._counts)


async def activation_failed(
    e: Exception,
    broker: Broker,
    names: Names,
    wake: Delivery,
    *,
    run_id: str,
    stored: bool,
    failures: FailureCounts,
    limit: int,
    agent: str,
    last_seq: int,
) -> None:
    """Settle ``wake`` after an activation of ``run_id`` (agent label ``agent``) failed with
    ``e``: handed back for another try in a second, unless this is the run's ``limit``-th
    failure in a row, when the run is given up on (wedged until its history changes, the
    wake acked). A run not ``stored`` yet (opened in memory) has nothing to give up on: its
    trigger is handed back, and its redelivery creates the run."""
    if not stored:
        log.warning("run %s: activation error before the run was stored: %s", run_id, e)
        with contextlib.suppress(Exception):
            await wake.nak(delay=1.0)
        return
    n = failures.add(run_id)
    if n >= limit:
        log.error(
            "run %s: activation failed %d times in a row (%s: %s); giving up: the run is "
            "wedged until its history changes",
            run_id, n, type(e).__name__, e,
        )  # fmt: skip
        metrics.ACTIVATIONS.labels(agent, "wedged").inc()
        failures.clear(run_id)
        with contextlib.suppress(Exception):
            text = f"{n} activations failed, the last with {type(e).__name__}: {e}"
            await give_up(broker, names, run_id, "max_deliveries", text, last_seq)
            await wake.ack()
        return
    log.warning("run %s: activation error %s: %s; retrying later", run_id, type(e).__name__, e)
    metrics.ACTIVATIONS.labels(agent, "error").inc()
    with contextlib.suppress(Exception):
        await wake.nak(delay=1.0)
