"""``ctx.gather``: several journaled operations at once, in positions that replay.

Positions are handed out by the journal in call order, and the order of completions must
never change them. The rules that make that so:

- **Children first.** Every ``ctx.child(...)`` among the arguments is started, one after the
  other in argument order, before anything else: a child's start is recorded only after its
  trigger is published, so it cannot race a step that opens the next position.
- **Then the steps, concurrently.** Every other argument is a *branch*, run as a task of its
  own. A branch makes exactly one journaled call, a step (``ctx.step``, ``ctx.llm``), before it
  first awaits anything: tasks run their first segments in creation order, which is argument
  order, and a step takes its position (and asks to store its ``StepStarted``, appends being
  serialized in order) in that segment. A second call, or a first one made after an await,
  would take a position that depends on timing: it is refused with ``GatherError``, the same
  way live and on replay (a replayed step returns without awaiting, so only the count of calls
  can tell, and it does). ``limit`` starts branches in argument order as others end: each still
  takes its position in its own first segment, so positions stay in argument order.
- **Then the child results, one after the other** in argument order: the run parks on the
  first child that has not ended, and takes one that ended meanwhile at once when it comes to
  it (its end notice is buffered), so the outcome is the same as if they were awaited at once.

When a branch parks (a retry backoff too long to sleep, a suspension) or the run is being
cancelled, no further branch is started; those already running finish and their results are
stored before the run parks (nothing recorded twice, nothing lost). A failure raises only once
every branch has settled: the first in argument order, or each in its place with
``return_exceptions=True``.

``sojourn replay`` drives the agent's coroutine by hand, without an event loop: the branches
are then driven by hand too, one first segment each, in the same order (a replayed step
returns without suspending; the first one history lacks stops the replay).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..core.actions import Parked
from ..core.machine import Machine

__all__ = ["GATHER_MAX", "ChildCall", "ChildResult", "GatherError", "gather"]

GATHER_MAX = 1000
"""Arguments of one ``ctx.gather`` call, at most: each becomes a task, a position, and (for a
step) its own append."""

T = TypeVar("T")


class GatherError(TypeError):
    """``ctx.gather`` was used in a way whose positions a replay could not reproduce (a branch
    making a second journaled call, or one after awaiting something; a wait or child start
    inside a branch; a nested gather), or with arguments it does not take.

    Raised however ``return_exceptions`` is set: it is a mistake in the code, not an outcome."""


class ChildResult(Generic[T]):
    """What ``ChildHandle.result()`` returns: await it for the child's output (the run parks
    until the child ends), or pass it to ``ctx.gather``."""

    __slots__ = ("_wait",)

    def __init__(self, wait: Callable[[], Coroutine[Any, Any, T]]) -> None:
        self._wait = wait

    def __await__(self) -> Generator[Any, None, T]:
        return self._wait().__await__()


class ChildCall(Generic[T]):
    """What ``ctx.child(...)`` returns: await it for the child's output (the run parks until
    the child ends), or pass it to ``ctx.gather`` to run several children at once."""

    __slots__ = ("_start", "type")

    def __init__(self, start: Callable[[], Awaitable[Any]], type: Any) -> None:
        """``start``: ``ctx.start_child(...)`` (returning a ``ChildHandle``)."""
        self._start = start
        self.type = type

    def __await__(self) -> Generator[Any, None, T]:
        return self._run().__await__()

    async def _run(self) -> T:
        handle = await self._start()
        result: T = await handle.result(type=self.type)
        return result


@dataclass(slots=True)
class _Outcome:
    value: Any = None
    error: BaseException | None = None


@dataclass(slots=True, eq=False)
class _Branch:
    scope: _Scope
    index: int
    first: bool = True
    """Still in its first segment (before its first await suspended it)."""
    claimed: str | None = None

    def first_segment_over(self) -> None:
        self.first = False


_BRANCH: contextvars.ContextVar[_Branch | None] = contextvars.ContextVar(
    "sojourn_gather_branch", default=None
)

_KINDS = {
    "value": "ctx.now()/uuid()/random()/spend()",
    "wait": "a wait (ctx.sleep, ctx.wait_for, a child's result)",
    "child": "a child start",
    "patch": "ctx.patched()",
    "step": "a step",
}


class _Scope:
    """The branches of one gather: the journal asks it before any branch takes a position."""

    __slots__ = ()

    def claim(self, kind: str) -> None:
        b = _BRANCH.get()
        if b is None or b.scope is not self:
            return  # the gather's own calls (child starts and results), made in order
        where = f"ctx.gather: argument {b.index}"
        if b.claimed is not None:
            raise GatherError(
                f"{where} made a second journaled call ({_KINDS.get(kind, kind)} after "
                f"{_KINDS.get(b.claimed, b.claimed)}): its position would depend on which "
                "argument finishes first, which a replay cannot reproduce. Pass each step to "
                "ctx.gather as its own ctx.step(...) call, or make the sequence one step"
            )
        if not b.first:
            raise GatherError(
                f"{where} awaited something before its journaled call ({_KINDS.get(kind, kind)})"
                ": its position would depend on timing. Pass ctx.step(...) itself to ctx.gather"
            )
        if kind != "step":
            raise GatherError(
                f"{where} makes {_KINDS.get(kind, kind)}: a branch of ctx.gather may only run "
                "a step. Pass ctx.child(...) or handle.result() to ctx.gather directly, and "
                "make waits and journaled values before or after it"
            )
        b.claimed = kind


async def gather(
    machine: Machine,
    commit: Callable[[list[Any]], Awaitable[None]],
    items: Sequence[Awaitable[Any]],
    *,
    return_exceptions: bool = False,
    limit: int | None = None,
) -> list[Any]:
    """``ctx.gather``: see the module docstring. ``commit`` stores what is pending (the
    driver's ``commit``): results of branches that ended after another one parked."""
    coros = [aw for aw in items if inspect.iscoroutine(aw)]
    try:
        _check(machine, items, limit)
    except BaseException:
        for c in coros:
            c.close()
        raise
    outcomes: list[_Outcome | None] = [None] * len(items)
    handles: dict[int, Any] = {}  # ChildHandle by argument
    try:
        for i, item in enumerate(items):
            if isinstance(item, ChildCall):
                handles[i] = await item._start()
    except BaseException:
        for c in coros:
            c.close()
        raise
    branches: list[tuple[int, Coroutine[Any, Any, Any]]] = [
        (i, aw) for i, aw in enumerate(items) if inspect.iscoroutine(aw)
    ]
    scope = _Scope()
    machine.journal.claim = scope.claim
    try:
        if machine.stop_at_frontier or _running_loop() is None:
            _drive_by_hand(scope, branches, outcomes)
        else:
            await _run_tasks(scope, branches, outcomes, limit)
    finally:
        machine.journal.claim = None
    settled = [o for o in outcomes if o is not None]
    stop = next(
        (o.error for o in settled if o.error is not None and not isinstance(o.error, Exception)),
        None,
    )
    if stop is not None:
        if isinstance(stop, Parked) and machine.pending:
            await commit([])  # what the others recorded after the park was stored
        raise stop
    if machine.nondeterminism is not None:
        raise machine.nondeterminism
    misuse = next((o.error for o in settled if isinstance(o.error, GatherError)), None)
    if misuse is not None:
        raise misuse
    for i, item in enumerate(items):
        if isinstance(item, ChildCall):
            outcomes[i] = await _capture(handles[i].result(type=item.type))
        elif isinstance(item, ChildResult):
            outcomes[i] = await _capture(item)
    done = [o or _Outcome() for o in outcomes]
    if not return_exceptions:
        failed = next((o.error for o in done if o.error is not None), None)
        if failed is not None:
            raise failed
    return [o.value if o.error is None else o.error for o in done]


def _check(machine: Machine, items: Sequence[Awaitable[Any]], limit: int | None) -> None:
    if _BRANCH.get() is not None or machine.journal.claim is not None:
        raise GatherError("ctx.gather cannot run inside an argument of another ctx.gather")
    if len(items) > GATHER_MAX:
        raise ValueError(
            f"ctx.gather takes at most {GATHER_MAX} awaitables, not {len(items)}: "
            "split the work into several gathers (or child runs)"
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"ctx.gather's limit is a whole number >= 1, not {limit!r}")
    for i, item in enumerate(items):
        if not (isinstance(item, ChildCall | ChildResult) or inspect.iscoroutine(item)):
            raise GatherError(
                f"ctx.gather: argument {i} is a {type(item).__name__}; pass the coroutine of "
                "a ctx.step(...) call (not a task or future), ctx.child(...) or handle.result()"
            )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _branch_context(scope: _Scope, index: int) -> tuple[contextvars.Context, _Branch]:
    branch = _Branch(scope, index)
    context = contextvars.copy_context()
    context.run(_BRANCH.set, branch)
    return context, branch


async def _run_tasks(
    scope: _Scope,
    branches: list[tuple[int, Coroutine[Any, Any, Any]]],
    outcomes: list[_Outcome | None],
    limit: int | None,
) -> None:
    """Each branch as a task, started in argument order (at most ``limit`` at once), until all
    that were started have ended. A branch that ends with a ``BaseException`` (it parked, the
    run is being cancelled) stops further starts: the rest are never run."""
    loop = asyncio.get_running_loop()
    queue = deque(branches)
    running: dict[asyncio.Task[Any], int] = {}
    stop = False
    try:
        while True:
            while queue and not stop and (limit is None or len(running) < limit):
                i, coro = queue.popleft()
                context, branch = _branch_context(scope, i)
                running[loop.create_task(coro, context=context)] = i
                # Runs after the task's first segment (callbacks run in the order scheduled):
                # from then on the branch may take no position.
                loop.call_soon(branch.first_segment_over)
            if not running:
                return
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                outcome = _result(task)
                outcomes[running.pop(task)] = outcome
                if outcome.error is not None and not isinstance(outcome.error, Exception):
                    stop = True
    except GeneratorExit:  # closed, never to be resumed: nothing may be awaited now
        for task in running:
            task.cancel()
        running.clear()
        raise
    finally:
        for _, coro in queue:
            coro.close()
        if running:  # the gather itself was cancelled (the worker stops): so are its branches
            for task in running:
                task.cancel()
            await asyncio.wait(running)


def _result(task: asyncio.Task[Any]) -> _Outcome:
    if task.cancelled():
        return _Outcome(error=asyncio.CancelledError())
    error = task.exception()
    return _Outcome(error=error) if error is not None else _Outcome(value=task.result())


def _drive_by_hand(
    scope: _Scope,
    branches: list[tuple[int, Coroutine[Any, Any, Any]]],
    outcomes: list[_Outcome | None],
) -> None:
    """``sojourn replay`` (no I/O, perhaps no event loop): each branch's first segment, in
    argument order. A replayed step returns without suspending; one that suspends needs a
    loop."""
    for n, (i, coro) in enumerate(branches):
        context, branch = _branch_context(scope, i)
        try:
            context.run(coro.send, None)
        except StopIteration as e:
            outcomes[i] = _Outcome(value=e.value)
            continue
        except BaseException as e:
            outcomes[i] = _Outcome(error=e)
            continue
        finally:
            branch.first_segment_over()
        coro.close()
        for _, rest in branches[n + 1 :]:
            rest.close()
        raise RuntimeError(f"ctx.gather: argument {i} awaits something that needs an event loop")


async def _capture(aw: Awaitable[Any]) -> _Outcome:
    try:
        return _Outcome(value=await aw)
    except Exception as e:
        return _Outcome(error=e)
