"""Runs' output streams: what ``ctx.stream`` / ``ctx.progress`` write, and how it is read back.

A step that streams (an LLM's tokens, a progress bar) publishes ``Chunk`` messages on the run's
output subject ``<prefix>.out.<run_id>`` in the stream ``<PREFIX>_OUTPUT``, kept for
``Settings.output_max_age`` (7 days). A reader's **offset** is a chunk message's stream
sequence: a reader that lost its connection, or its process, asks again with the last offset it
handled and gets exactly the chunks after it, hours later.

Writing (``StepOutput``): one writer per step execution, created once the execution's
``StepStarted`` is stored. Each chunk is a JetStream publish awaited for its ack, in call order,
with ``Nats-Msg-Id: out:<run_id>:<execution>:<index>`` so a publish retried through a broker
blip lands once. A failed write raises into the step (it fails the attempt like any error the
step raises): a reader is never told less than the step believes it wrote. Chunks are acked
before the step returns, hence before its result and the run's end are appended: once the run
has ended, every chunk it will ever have is stored.

A step executed again after a crash writes under a new ``execution`` (the events-stream sequence
of its ``StepStarted``) and restarts ``index`` at 0: a reader sees the superseded execution's
chunks and then the new ones, and can tell (``OutputChunk.restarted``). Nothing is withdrawn:
what the run finally produced is the step's result in the run's history.

Reading (``read_output``): stored chunks in order by batched direct gets (no server-side
consumer), then, following, a core subscription on the output subject as a *hint* that a new
chunk is stored: each hint is answered by a direct get after the last offset, so a chunk arrives
about one round trip after its publish, and the offsets are always the stream's. A hint is never
trusted as data (a core subscriber also sees publishes the stream deduplicated or refused), and
a periodic look covers hints lost while the connection was down. A core subscription on the
run's event subject says when to look whether the run has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from sojourn.broker.connection import Broker, JetStreamError
from sojourn.broker.delivery import Delivery, StoredMessage, Subscription
from sojourn.broker.headers import MSG_ID
from sojourn.broker.names import Names
from sojourn.schemas.codec import encode, from_raw, to_raw
from sojourn.schemas.errors import BrokerUnavailable, PayloadTooLarge
from sojourn.schemas.views import Chunk, ChunkKind

from .watching import end_in

__all__ = [
    "CHUNK_ENVELOPE",
    "OutputChunk",
    "OutputReader",
    "StepOutput",
    "chunk_limit",
    "read_output",
]

CHUNK_ENVELOPE: Final = 1024
"""Bytes of a chunk message that are not its text or value: the ``Chunk`` fields (a run id of
up to 128 characters) and the headers (``Nats-Msg-Id``). A chunk's encoded body may take the
rest of the message."""

PAGE: Final = 256
"""Chunks asked for per direct get."""

LOOK_EVERY: Final = 5.0
"""Seconds between looks when no hint comes: a core subscription misses what is published while
the connection is down, so a follower also looks on its own."""

_NULL = msgspec.Raw(b"null")


def chunk_limit(settings_max_payload: int, server_max_payload: int) -> int:
    """The largest encoded chunk body, in bytes: the smaller of ``Settings.max_payload`` and
    the server's ``max_payload``, less ``CHUNK_ENVELOPE``."""
    return min(settings_max_payload, server_max_payload) - CHUNK_ENVELOPE


class StepOutput:
    """Where one step execution writes its output chunks (``ctx.stream`` / ``ctx.progress``).

    Writes are serialized: concurrent calls (tasks the step spawned) are published one at a
    time, each taking the next ``index``, so the stream order is the call order.
    """

    def __init__(
        self,
        broker: Callable[[], Broker],
        names: Names,
        run_id: str,
        *,
        position: int,
        attempt: int,
        execution: int,
        limit: Callable[[Broker], int],
        retry_for: float = 30.0,
    ) -> None:
        # Made for every step attempt, used by few: the broker and the limit are looked up
        # at the first write, so a step that streams nothing costs almost nothing.
        self._broker_of = broker
        self._limit_of = limit
        self._names = names
        self.run_id = run_id
        self.position = position
        self.attempt = attempt
        self.execution = execution
        self._retry_for = retry_for
        self._index = 0
        self._lock: asyncio.Lock | None = None

    @functools.cached_property
    def _broker(self) -> Broker:
        return self._broker_of()

    @functools.cached_property
    def _subject(self) -> str:
        return self._names.output(self.run_id)

    @functools.cached_property
    def _chunk(self) -> functools.partial[Chunk]:
        """A chunk of this execution, from the fields that tell its chunks apart."""
        return functools.partial(
            Chunk,
            run_id=self.run_id,
            position=self.position,
            attempt=self.attempt,
            execution=self.execution,
        )

    @functools.cached_property
    def limit(self) -> int:
        """The largest encoded chunk this execution may store."""
        return self._limit_of(self._broker)

    @property
    def written(self) -> int:
        """How many chunks this execution has stored."""
        return self._index

    async def text(self, text: str) -> int:
        """Store a text chunk; returns its offset.

        Raises:
            TypeError: ``text`` is not a ``str``.
            PayloadTooLarge: its encoded chunk exceeds ``limit``.
            BrokerUnavailable / JetStreamError: it could not be stored.
        """
        if not isinstance(text, str):
            raise TypeError(f"ctx.stream takes a str, not {type(text).__name__}")
        return await self._write("text", text, _NULL)

    async def progress(self, value: Any) -> int:
        """Store a progress chunk (a JSON value); returns its offset.

        Raises:
            TypeError: ``value`` is not JSON-encodable.
            PayloadTooLarge: its encoded chunk exceeds ``limit``.
            BrokerUnavailable / JetStreamError: it could not be stored.
        """
        try:
            raw = to_raw(value)
        except msgspec.EncodeError as e:
            raise TypeError(f"ctx.progress takes a JSON-encodable value: {e}") from e
        return await self._write("progress", "", raw)

    async def _write(self, kind: ChunkKind, text: str, value: msgspec.Raw) -> int:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            index = self._index
            chunk = self._chunk(index=index, kind=kind, text=text, value=value, at=time.time())
            body = encode(chunk)
            if len(body) > self.limit:
                what = "ctx.stream text" if kind == "text" else "ctx.progress value"
                raise PayloadTooLarge(
                    f"{what} encodes to a {len(body)}-byte chunk; the limit is {self.limit} "
                    f"(the smaller of Settings.max_payload and the server's max_payload, "
                    f"less {CHUNK_ENVELOPE}): stream it in smaller pieces",
                    run_id=self.run_id,
                )
            seq = await self._publish(body, f"out:{self.run_id}:{self.execution}:{index}")
            self._index = index + 1
            return seq

    async def _publish(self, body: bytes, msg_id: str) -> int:
        """Publish until acked, through a short outage (the Msg-Id makes a retry land once);
        raise what the stream refused, or ``BrokerUnavailable`` once ``retry_for`` is spent."""
        deadline = time.monotonic() + self._retry_for
        pause = 0.05
        headers = {MSG_ID: msg_id}
        while True:
            try:
                ack = await self._broker.try_publish(self._subject, body, headers, timeout=2.0)
            except TimeoutError as e:
                if time.monotonic() > deadline:
                    raise BrokerUnavailable(
                        f"output chunk on {self._subject} not acknowledged in time",
                        run_id=self.run_id,
                    ) from e
            else:
                if not isinstance(ack, JetStreamError):
                    return ack.seq
                if ack.code != 503 or time.monotonic() > deadline:
                    raise ack
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """One chunk as a reader gets it.

    Attributes:
        offset: the chunk message's stream sequence: pass the last one handled as ``after``
            to resume right after it.
        chunk: the chunk (``kind``, ``text`` or ``value``, and which step execution wrote it).
        restarted: this chunk begins a step execution that supersedes an earlier one: the
            reader already returned chunks of the same step position from another execution,
            or (an ``index`` 0 chunk) its attempt is past the first. What the earlier
            execution streamed for that step is void; the new one streams from the start.
    """

    offset: int
    chunk: Chunk
    restarted: bool = False

    @property
    def kind(self) -> ChunkKind:
        return self.chunk.kind

    def as_json(self) -> dict[str, Any]:
        """The chunk as ``sojourn stream --json`` prints it and the gateway sends it: its
        offset, the chunk's fields, and ``restarted``."""
        return {
            "offset": self.offset,
            **msgspec.structs.asdict(self.chunk),
            "restarted": self.restarted,
        }

    @property
    def text(self) -> str:
        return self.chunk.text

    def value(self, type: Any = Any) -> Any:
        """A progress chunk's value decoded as ``type`` (``None`` for a text chunk)."""
        return None if self.chunk.kind == "text" else from_raw(self.chunk.value, type)


def _valid(chunk: Chunk, run_id: str) -> bool:
    """Whether a decoded chunk can be one this run's steps wrote (the body is not trusted)."""
    return (
        chunk.run_id == run_id
        and chunk.position >= 0
        and chunk.attempt >= 1
        and chunk.execution >= 1
        and chunk.index >= 0
    )


class OutputReader:
    """A run's output chunks after offset ``after``, in order, each once: an async iterator
    (``read_output(broker, names, run_id, ...)`` makes one).

    Returns every stored chunk after ``after``; then, with ``follow``, new ones as they are
    stored, ending once the run has ended and every chunk stored before its end has been
    returned (a run that has not started yet is waited for). Without ``follow`` it ends when
    the stored chunks are read. Chunk messages that cannot be decoded, or are not this run's,
    are passed over and counted (``skipped``).

    Use it in ``async for``; when leaving early, ``aclose()`` it (or use ``async with``) to
    drop its subscriptions at once.

    Example:
        >>> async for c in read_output(broker, names, run_id, after=last):   # doctest: +SKIP
        ...     if c.kind == "text":
        ...         print(c.text, end="", flush=True)
        ...     last = c.offset

    Raises:
        ValueError: ``after`` is negative.
        TimeoutError: (from the iteration) the output did not end within ``timeout`` seconds.

    Attributes:
        offset: the offset of the last chunk returned (``after`` until one is).
        skipped: chunk messages that could not be decoded or were not this run's, passed over.
        ended: the run has ended and every chunk stored before its end has been returned.
    """

    def __init__(
        self,
        broker: Broker,
        names: Names,
        run_id: str,
        *,
        after: int = 0,
        follow: bool = True,
        timeout: float | None = None,
    ) -> None:
        if after < 0:
            raise ValueError("after is an offset: 0 or more")
        self._broker = broker
        self._names = names
        self.run_id = run_id
        self.offset = after
        self.follow = follow
        self.timeout = timeout
        self.skipped = 0
        self.ended = False
        self._executions: dict[int, int] = {}
        self._wake = asyncio.Event()
        self._chunk_hint = False
        self._end_hint = False
        self._gen = self._chunks()

    def __aiter__(self) -> OutputReader:
        return self

    async def __anext__(self) -> OutputChunk:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        """Stop reading and drop the subscriptions."""
        await self._gen.aclose()

    async def __aenter__(self) -> OutputReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _on_chunk(self, _msg: Delivery) -> None:
        self._chunk_hint = True
        self._wake.set()

    async def _on_event(self, _msg: Delivery) -> None:
        self._end_hint = True
        self._wake.set()

    async def _chunks(self) -> AsyncGenerator[OutputChunk, None]:
        broker, names = self._broker, self._names
        subject = names.output(self.run_id)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        subs: list[Subscription] = []
        try:
            if self.follow:
                # Subscribe before the first read: a chunk stored after the read is hinted.
                subs.append(await broker.subscribe(subject, cb=self._on_chunk))
                subs.append(await broker.subscribe(names.events(self.run_id), cb=self._on_event))
                await broker.flush()
            look_for_end = True
            ended = False
            fast = 0  # > 0: a hint's chunk was not visible yet; look again in 2**(fast-2) ms
            while True:
                msgs, pending = await broker.direct_get_batch(
                    names.output_stream, subject, self.offset + 1, PAGE
                )
                for m in msgs:
                    got = self._take(m, subject)
                    if got is not None:
                        yield got
                if msgs and pending:
                    continue
                if not self.follow or ended:
                    self.ended = ended
                    return
                if msgs:
                    fast = 0
                elif fast:
                    fast = fast + 1 if fast < 8 else 0
                if look_for_end or self._end_hint:
                    look_for_end = self._end_hint = False
                    if await self._run_ended():
                        ended = True  # one more read to the stream's end, then stop
                        continue
                wait = LOOK_EVERY if not fast else 0.001 * 2 ** (fast - 2)
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(
                            f"the output of run {self.run_id} did not end within {self.timeout}s"
                        )
                    wait = min(wait, left)
                if not self._wake.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait)
                if self._wake.is_set():
                    self._wake.clear()
                    if self._chunk_hint:
                        self._chunk_hint = False
                        fast = 1
                elif not fast:
                    look_for_end = True  # a quiet while: the end's hint may have been lost
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    def _take(self, m: StoredMessage, subject: str) -> OutputChunk | None:
        if m.seq <= self.offset:
            return None  # never twice
        self.offset = m.seq
        if m.subject != subject:
            self.skipped += 1
            return None
        try:
            chunk: Chunk = from_raw(m.data, Chunk)
        except msgspec.MsgspecError:
            self.skipped += 1
            return None
        if not _valid(chunk, self.run_id):
            self.skipped += 1
            return None
        raw = bytes(chunk.value)
        if b"\n" in raw or b"\r" in raw:
            # Whitespace between a forged value's elements (in a string a line break is
            # escaped): the same value on one line, so a line-oriented reader (an event
            # stream, ``sojourn stream --json``) gets one line per chunk.
            flat = msgspec.Raw(raw.replace(b"\r", b" ").replace(b"\n", b" "))
            chunk = msgspec.structs.replace(chunk, value=flat)
        seen = self._executions.get(chunk.position)
        restarted = (seen is not None and seen != chunk.execution) or (
            seen is None and chunk.index == 0 and chunk.attempt > 1
        )
        self._executions[chunk.position] = chunk.execution
        return OutputChunk(offset=m.seq, chunk=chunk, restarted=restarted)

    async def _run_ended(self) -> bool:
        """Whether the run's last event is its end (read back: a hint is not the stored
        copy)."""
        last = await self._broker.direct_get_last(
            self._names.events_stream, self._names.events(self.run_id)
        )
        return last is not None and end_in(last.data) is not None


read_output = OutputReader
"""A run's output chunks after offset ``after``: ``read_output(broker, names, run_id, *,
after=0, follow=True, timeout=None)`` (see ``OutputReader``)."""
