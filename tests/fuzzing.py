"""A worker to fuzz: a real worker and an attacker's raw NATS connection on an event loop in a
thread of their own, driven synchronously (by Hypothesis in tests/actors/worker/test_fuzz_intake.py,
by ``python -m bench.fuzz`` for the long run)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS

from sojourn.actors import Client, Context, Worker, agent
from sojourn.broker import Names
from sojourn.broker import headers as h
from sojourn.schemas.config import Settings

T = TypeVar("T")

KINDS = [
    "start",
    "start-id",
    "signal",
    "cancel",
    "resume",
    "budget",
    "decide",
    "child",
    "spawn",
    "schedule",
]
"""Every kind of inbox subject (``Names.inbox_subjects``)."""


@agent("fuzzed")
async def fuzzed(ctx: Context, x: Any) -> Any:
    return x


@agent("fuzz-parked")
async def fuzz_parked(ctx: Context) -> Any:
    return await ctx.wait_for("never")


class FuzzTarget:
    """``send(kind, body, headers)`` publishes one message on the deployment's subject of that
    kind (aimed at a parked run) and returns the intake's answer, waiting at most 5 s."""

    ANSWER_TIMEOUT = 5.0

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.settings = settings
        self.names = Names(settings.prefix)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._worker: Worker | None = None
        self._client: Client | None = None
        self._nc: NATS | None = None
        self.sent = 0

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __enter__(self) -> FuzzTarget:
        self._thread.start()
        self._run(self._start())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._run(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    async def _start(self) -> None:
        self._worker = Worker([fuzzed, fuzz_parked], nats=self.url, settings=self.settings)
        await self._worker.start()
        self._client = await Client.connect(self.url, settings=self.settings)
        self._nc = await nats.connect(self.url)
        await self._client.start("fuzz-parked", None, run_id="parked", wait=True)

    async def _stop(self) -> None:
        if self._nc is not None:
            await self._nc.close()
        if self._client is not None:
            await self._client.close()
        if self._worker is not None:
            await self._worker.stop()

    def subject(self, kind: str) -> str:
        n = self.names
        return {
            "start": n.start("fuzzed"),
            "start-id": n.start("fuzzed", run_id=f"f{self.sent}"),
            "signal": n.signal("parked", "other"),  # buffered: the run stays parked
            "cancel": n.cancel(f"gone{self.sent}"),  # never the parked run: it must stay
            "resume": n.resume("parked", "eve"),
            "budget": n.budget("parked", "eve"),
            "decide": n.decide("parked", 1, 1, "eve"),
            "child": n.child_end("parked", "parked-c1", "eve"),
            "spawn": n.spawn("fuzzed", "eve"),
            "schedule": n.schedule(f"s{self.sent}", "eve"),
        }[kind]

    def send(self, kind: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
        self.sent += 1
        return self._run(self._send(self.subject(kind), body, headers))

    async def _send(self, subject: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
        assert self._nc is not None
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox, max_msgs=1)
        try:
            # The reply header is ours (a wrong one is tests/actors/worker/test_trust.py's); the
            # rest are the fuzzer's, "Nats-Msg-Id" included (a repeat is deduplicated: no answer).
            given = {k: v for k, v in headers.items() if k not in (h.REPLY_TO, h.MSG_ID)}
            await self._nc.publish(subject, body, headers={**given, h.REPLY_TO: inbox})
            msg = await sub.next_msg(timeout=self.ANSWER_TIMEOUT)
        finally:
            await sub.unsubscribe()
        answer: dict[str, Any] = json.loads(msg.data)
        return answer

    def check_settled(self, timeout: float = 30.0) -> None:
        """Wait until the intake settled every message; fail if any was delivered twice."""
        self._run(self._settled(timeout), timeout + 10)

    async def _settled(self, timeout: float) -> None:
        assert self._nc is not None
        js = self._nc.jetstream()
        deadline = self._loop.time() + timeout
        while True:
            info = await js.consumer_info(self.names.inbox_stream, self.names.intake_consumer)
            assert info.num_redelivered == 0, f"{info.num_redelivered} messages redelivered"
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            if self._loop.time() > deadline:
                raise AssertionError(f"the intake did not settle: {info}")
            await asyncio.sleep(0.05)

    def good_start_works(self) -> bool:
        return bool(self._run(self._good_start()) == {"ok": 1})

    async def _good_start(self) -> Any:
        assert self._client is not None
        run_id = await self._client.start("fuzzed", {"ok": 1})
        return await self._client.result(run_id, timeout=10)
