"""Child runs: ``ctx.start_child``, ``ctx.child`` and the ``ChildHandle`` whose result a run
awaits (durably: it parks until the child has ended).

A child's run id is ``<run_id>-c<position>``, so a replay or a retry starts it once; its end
comes to the parent as a signal (``wire.child_signal``) or, when that was missed, is looked up
in the child's history.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

from sojourn.schemas import wire as _wire
from sojourn.schemas.codec import encode, from_raw, to_raw
from sojourn.schemas.errors import ChildRunError, PayloadTooLarge
from sojourn.schemas.vocabulary import WaitKey
from sojourn.schemas.wire import ChildOutcome, child_signal

from ..core.actions import Return
from .gather import ChildCall, ChildResult
from .waits import Waits

__all__ = ["ChildHandle", "Children"]

T = TypeVar("T")


class Children(Waits):
    """``Context``'s child runs: ``start_child``, ``child``."""

    async def start_child(self, agent: str | Any, input: Any = None) -> ChildHandle:
        """Start a run of another agent as this run's child; returns a handle to await.

        The child's run id is ``<run_id>-c<position>``, so a replay or a retry starts it
        once. Cancelling this run cancels its children.

        Raises:
            PayloadTooLarge: the child's input does not fit in one message.
        """
        self._driver.check_live()
        name = agent if isinstance(agent, str) else str(agent.name)
        got = self._m.child(name)
        if isinstance(got, Return):
            return ChildHandle(self, from_raw(got.result, str), name)
        body = encode(
            _wire.StartTrigger(input=to_raw(input), run_id=got.child_id, parent_run_id=self.run_id)
        )
        if len(body) > self._max_payload:
            raise PayloadTooLarge(
                f"child run input is {len(body)} bytes; the limit is {self._max_payload}",
                run_id=self.run_id,
            )
        await self._driver.start_child(name, body, got.child_id)
        self._m.child_started(got, name, self._driver.time())
        return ChildHandle(self, got.child_id, name)

    @overload
    def child(self, agent: str | Any, input: Any = None) -> ChildCall[Any]: ...

    @overload
    def child(self, agent: str | Any, input: Any = None, *, type: type[T]) -> ChildCall[T]: ...

    def child(self, agent: str | Any, input: Any = None, *, type: Any = None) -> ChildCall[Any]:
        """Run another agent as a child: await this for its output (the run parks meanwhile),
        or pass it to ``ctx.gather`` with others to run them at once. Nothing starts until
        it is awaited or gathered."""
        return ChildCall(lambda: self.start_child(agent, input), Any if type is None else type)

    async def _await_child(self, handle: ChildHandle, tp: Any) -> Any:
        got = await self._wait(
            WaitKey.child(handle.run_id),
            signals=(child_signal(handle.run_id),),
            children=(handle.run_id,),
        )
        assert got is not None
        outcome: ChildOutcome = from_raw(got.payload, ChildOutcome)
        if outcome.status != "completed":
            detail = f": {outcome.error.code}: {outcome.error.message}" if outcome.error else ""
            raise ChildRunError(
                f"child run {handle.run_id} ({handle.agent}) {outcome.status}{detail}",
                run_id=self.run_id,
                child_run_id=handle.run_id,
                status=outcome.status,
            )
        return from_raw(outcome.output, tp)


class ChildHandle:
    """A child run started with ``ctx.start_child``; await ``result()`` for its output."""

    def __init__(self, ctx: Children, run_id: str, agent: str) -> None:
        self._ctx = ctx
        self.run_id = run_id
        self.agent = agent

    @overload
    def result(self) -> ChildResult[Any]: ...

    @overload
    def result(self, *, type: type[T]) -> ChildResult[T]: ...

    def result(self, *, type: Any = None) -> ChildResult[Any]:
        """Wait (durably: the run parks) until the child ends; return its output. Await it, or
        pass it to ``ctx.gather`` with others.

        Raises:
            ChildRunError: the child failed, was cancelled, or its trigger was rejected.
        """
        tp = Any if type is None else type
        return ChildResult(lambda: self._ctx._await_child(self, tp))

    def __repr__(self) -> str:
        return f"ChildHandle({self.agent!r}, {self.run_id!r})"
