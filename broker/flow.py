"""Keyed starts as broker-kept state (decision 0047): singleton keys' records, debounce keys'
bursts and their timers, in the schedules stream.

Under ``<prefix>.schedule.flow.``, per agent and key (the key hashed: ``key_token``):

- ``single.<agent>.<token>``: the run a singleton key names (``SingletonRecord``);
- ``burst.<agent>.<token>``: a debounce key's current or last burst (``DebounceRecord``);
- ``timer.<agent>.<token>``: the burst's pending fire, a one-shot message schedule (``@at``
  its deadline) the broker turns into a message on
- ``fire.<agent>.<token>``, taken by the agent's durable consumer ``debounce-<agent>``.

The stream keeps one message per subject, so a record's last message is the record, every
write a compare-and-set on the subject's sequence, and arming a timer again replaces it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import msgspec

from sojourn.schemas.codec import decode_debounce_record, decode_singleton_record, encode
from sojourn.schemas.errors import ConcurrencyConflict
from sojourn.schemas.flow import DebounceRecord, SingletonRecord, burst_fault, singleton_fault

from . import headers as h
from .connection import Broker, JetStreamError
from .names import Names
from .timers import rfc3339
from .topology import fire_consumer_config

__all__ = [
    "BURST",
    "DEADLINE",
    "FlowStore",
    "debounce_consumer_config",
]

BURST = "Sojourn-Debounce-Burst"
"""On a debounce fire: the burst it was armed for (its first trigger's inbox sequence)."""
DEADLINE = "Sojourn-Debounce-At"
"""On a debounce fire: the deadline it was armed for, Unix milliseconds."""

_FENCE_BROKEN = 10071

log = logging.getLogger("sojourn.flow")

RecordKind = Literal["single", "burst"]
"""The subject kind of a keyed start's record: a singleton key's, or a debounce key's burst."""

_RECORD_NAMES: dict[RecordKind, str] = {"single": "singleton", "burst": "debounce"}
"""What the log calls each kind of record."""

_Record = TypeVar("_Record", SingletonRecord, DebounceRecord)


def debounce_consumer_config(names: Names, settings: Any, agent: str) -> dict[str, Any]:
    """The durable consumer of ``agent``'s debounce fires (``debounce-<agent>``), created by
    the first worker serving the agent and shared by all that do; configured as its schedules'
    fire consumer is."""
    config = fire_consumer_config(names, settings, agent)
    config["durable_name"] = f"debounce-{agent}"
    config["filter_subject"] = FlowStore.subject(names, "fire", agent, "*")
    return config


class FlowStore:
    """Reads and writes keyed starts' records and debounce timers in ``<PREFIX>_SCHEDULES``."""

    def __init__(self, broker: Broker, names: Names) -> None:
        self.broker = broker
        self.names = names
        self.stream = names.schedules_stream

    @staticmethod
    def subject(names: Names, kind: str, agent: str, token: str) -> str:
        """``<prefix>.schedule.flow.<kind>.<agent>.<token>``."""
        return f"{names.prefix}.schedule.flow.{kind}.{agent}.{token}"

    def fire_prefix(self, agent: str) -> str:
        """What every debounce fire subject of ``agent`` starts with."""
        return f"{self.names.prefix}.schedule.flow.fire.{agent}."

    # --- singleton keys ------------------------------------------------------------------------

    async def singleton(self, agent: str, token: str) -> tuple[SingletonRecord | None, int]:
        """The record of ``agent``'s singleton key ``token`` and its sequence (0: none). A
        record that cannot be read (nothing a worker wrote: anyone may publish on a deployment
        without authentication) is ``None`` with its sequence, so it is written over."""
        return await self._record("single", agent, token, decode_singleton_record, singleton_fault)

    async def put_singleton(self, token: str, record: SingletonRecord, expected_seq: int) -> int:
        """Write ``record`` if the key's record is still at ``expected_seq`` (0: none).

        Raises:
            ConcurrencyConflict: written meanwhile (read it again).
        """
        return await self._put("single", token, record, expected_seq)

    # --- debounce keys -------------------------------------------------------------------------

    async def burst(self, agent: str, token: str) -> tuple[DebounceRecord | None, int]:
        """The burst record of ``agent``'s debounce key ``token`` and its sequence (0: none);
        one that cannot be read is ``None`` with its sequence, as ``singleton`` says."""
        return await self._record("burst", agent, token, decode_debounce_record, burst_fault)

    async def put_burst(self, token: str, record: DebounceRecord, expected_seq: int) -> int:
        """Write ``record`` if the key's record is still at ``expected_seq`` (0: none).

        Raises:
            ConcurrencyConflict: written meanwhile (read it again).
        """
        return await self._put("burst", token, record, expected_seq)

    async def arm(self, token: str, record: DebounceRecord) -> None:
        """Arm (or move) the burst's fire at its deadline; replaces the pending one."""
        headers = {
            h.SCHEDULE: f"@at {rfc3339(record.deadline)}",
            h.SCHEDULE_TARGET: self.subject(self.names, "fire", record.agent, token),
            BURST: str(record.burst),
            DEADLINE: str(round(record.deadline * 1000)),
        }
        await self.broker.publish(
            self.subject(self.names, "timer", record.agent, token), b"", headers
        )

    async def _record(
        self,
        kind: RecordKind,
        agent: str,
        token: str,
        decode: Callable[[bytes], _Record],
        fault: Callable[[_Record], str | None],
    ) -> tuple[_Record | None, int]:
        """The ``kind`` record of ``agent``'s key ``token``, read by ``decode`` and checked by
        ``fault``, and its sequence (0: none); ``None`` with its sequence when it cannot be read
        or used."""
        m = await self.broker.direct_get_last(
            self.stream, self.subject(self.names, kind, agent, token)
        )
        if m is None:
            return None, 0
        name = _RECORD_NAMES[kind]
        try:
            rec = decode(m.data)
        except msgspec.MsgspecError as e:
            log.warning("%s record %r cannot be read (%s): written over", name, m.subject, e)
            return None, m.seq
        why = fault(rec)
        if why is not None:
            log.warning("%s record %r cannot be used (%s): written over", name, m.subject, why)
            return None, m.seq
        return rec, m.seq

    async def _put(self, kind: RecordKind, token: str, record: _Record, expected_seq: int) -> int:
        """Write ``record`` on its ``kind`` subject if that is still at ``expected_seq``.

        Raises:
            ConcurrencyConflict: written meanwhile.
        """
        subject = self.subject(self.names, kind, record.agent, token)
        headers = {h.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected_seq)}
        result = await self.broker.try_publish(subject, encode(record), headers)
        if isinstance(result, JetStreamError):
            if result.err_code == _FENCE_BROKEN:
                raise ConcurrencyConflict(
                    f"{subject} changed meanwhile", run_id=record.run_id, expected=expected_seq
                )
            raise result
        return result.seq
