"""Replay a stored history against code, executing nothing: is this code safe to deploy?

``replay_run`` folds a run's events, then runs the agent's code with a ``Context`` whose
machine answers every journaled call from history and stops at the first operation history
has not decided (the *frontier*: the run's next live step, or an open wait). No step function
runs, no value is made, nothing is written; the agent's coroutine is driven by hand, with no
event loop. What it reports:

- ``ok``: the code makes the recorded operations in the recorded order up to the frontier (or
  to the run's end, and ends the same way);
- ``diverges at position N: recorded X, code now calls Y``: the code now calls something else
  at N, finishes before history does, or raises where history went on.

``sojourn replay`` runs this over runs from the broker or over files written by
``sojourn history RUN --json``, and exits 1 on any divergence: a gate for CI before a deploy.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from sojourn.schemas.codec import decode_history
from sojourn.schemas.errors import NondeterminismError
from sojourn.schemas.events import RunEvent
from sojourn.schemas.wire import ChildOutcome

from ..agents.agent import Agent
from ..agents.context import Context
from .actions import Park, Parked, RunCancelledInterrupt
from .journal import ReplayFrontier, describe_op
from .limits import Limits
from .machine import Machine
from .ratelimit import Grant
from .state import RunState, fold

__all__ = ["Divergence", "ReplayResult", "decode_history_file", "replay_run"]


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where code and history part: what history recorded at ``position``, and what the code
    does there now (``calls step 'x'``, ``finishes``, ``raises ValueError: ...``)."""

    position: int
    recorded: str
    code_now: str


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The verdict on one run."""

    run_id: str
    agent: str
    checked: int
    """Recorded operations the code replayed."""
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def describe(self) -> str:
        d = self.divergence
        if d is None:
            return "ok"
        return f"diverges at position {d.position}: recorded {d.recorded}, code now {d.code_now}"


def decode_history_file(data: bytes) -> list[RunEvent]:
    """The events of a file written by ``sojourn history RUN --json``.

    Raises:
        ValueError: the file is not such a history (with a readable reason).
    """
    try:
        entries = decode_history(data)
    except msgspec.MsgspecError as e:
        raise ValueError(f"not a history written by `sojourn history RUN --json`: {e}") from e
    events = [e for entry in sorted(entries, key=lambda d: d.seq) for e in entry.events]
    if not events:
        raise ValueError("the history is empty")
    return events


class _NoCount:
    def inc(self, amount: float = 1) -> None:
        return None


class _ReplayDriver:
    """The I/O side of a replay: there is none. The machine's journal stops at the frontier
    before any of these could be needed; reaching one is a bug, said loudly."""

    def __init__(self, agent: str, declared: Agent[Any, Any] | None = None) -> None:
        self.agent = declared  # what the agent declares (its MCP servers, for ctx.mcp)
        self.agent_name = agent
        self.metric_agent = agent
        self.tool_calls = _NoCount()

    def time(self) -> float:
        return time.time()  # what a replayed run reads is recorded: nothing new is stamped

    def check_live(self) -> None:
        return None

    def report(self, details: msgspec.Raw) -> None:
        return None

    def running(self, step: str | None) -> None:
        return None

    def _refuse(self) -> RuntimeError:
        return RuntimeError("replay reached an operation that needs I/O")

    async def commit(self, events: list[RunEvent]) -> None:
        raise self._refuse()

    async def backoff(self, position: int, retry_at: float) -> None:
        raise self._refuse()

    async def park(self, action: Park) -> None:
        raise self._refuse()

    async def rest(self) -> None:
        raise Parked()

    async def reserve(self, limit: str) -> Grant:
        raise self._refuse()

    async def await_slot(self, position: int, slot: float, park: bool) -> None:
        raise self._refuse()

    async def block_limit(self, limit: str, seconds: float | None) -> None:
        raise self._refuse()

    def charge_limit(self, limit: str, tokens: int) -> None:
        raise self._refuse()

    async def suspend(self, event: Any) -> None:
        raise self._refuse()

    async def start_child(self, agent: str, body: bytes, child_id: str) -> None:
        raise self._refuse()

    async def child_outcome(self, child_id: str) -> ChildOutcome | None:
        raise self._refuse()

    def cancel_timer(self, position: int) -> None:
        raise self._refuse()


def replay_run(agent: Agent[Any, Any], events: Sequence[RunEvent]) -> ReplayResult:
    """Replay one run's history against ``agent``'s code; see the module docstring.

    Raises:
        ValueError: the events are not a run's history (no ``RunStarted``).
    """
    state = fold(events)
    if not state.run_id:
        raise ValueError("the history has no RunStarted event")
    limits = Limits(max_value=1 << 62, crash_loop_limit=0, poll_cap=agent.poll_cap)
    machine = Machine(state, limits=limits, stop_at_frontier=True)
    ctx = Context(machine, _ReplayDriver(agent.name, agent), max_payload=1 << 62)

    def result(divergence: Divergence | None = None) -> ReplayResult:
        checked = min(machine.journal.position, machine.journal.recorded)
        if divergence is not None:
            checked = min(checked, divergence.position)  # the operations before it replayed
        return ReplayResult(state.run_id, state.agent, checked, divergence)

    try:
        arg = agent.decode_input(bytes(state.input or b"null"))
    except Exception as e:
        return result(Divergence(0, "the run's input", f"rejects it: {type(e).__name__}: {e}"))
    coro = agent.call(ctx, arg)
    try:
        _drive(coro)
    except ReplayFrontier:
        return result(_caught(machine))
    except NondeterminismError as e:
        return result(_divergence(machine, state, e))
    except (Parked, RunCancelledInterrupt):
        return result(_caught(machine))
    except _Awaited as e:
        position = machine.journal.position
        return result(Divergence(position, _recorded(state, position), str(e)))
    except RuntimeError as e:
        if "event loop" not in str(e):
            return _failed(machine, state, e, result)
        position = machine.journal.position
        what = "awaits something outside ctx that needs an event loop, which replay cannot follow"
        return result(Divergence(position, _recorded(state, position), what))
    except Exception as e:
        return _failed(machine, state, e, result)
    caught = _caught(machine)
    if caught is not None:
        return result(caught)
    try:
        machine.journal.finish()
    except NondeterminismError as e:
        return result(_divergence(machine, state, e))
    if state.status == "failed":
        position = machine.journal.position
        return result(Divergence(position, "the run's failure", "completes"))
    return result()


def _failed(
    machine: Machine,
    state: RunState,
    e: Exception,
    result: Callable[[Divergence | None], ReplayResult],
) -> ReplayResult:
    """The code raised ``e``: fine where history ends with the run's failure (it failed the
    same way), a divergence where history went on or the run completed."""
    caught = _caught(machine)
    if caught is not None:
        return result(caught)
    position = machine.journal.position
    if position < machine.journal.recorded or state.status == "completed":
        what = f"raises {type(e).__name__}: {e}"
        return result(Divergence(position, _recorded(state, position), what))
    return result(None)


class _Awaited(Exception):
    """The code awaited something other than a ``ctx`` operation."""


def _drive(awaitable: Awaitable[Any]) -> None:
    """Run the agent's coroutine by hand: replayed ``ctx`` operations never suspend it, so
    anything it yields is an await on something else (a sleep, a lock, I/O)."""
    if not isinstance(awaitable, Coroutine):
        raise _Awaited(f"returns {type(awaitable).__name__}, not a coroutine")
    coro = awaitable
    try:
        while True:
            yielded = coro.send(None)
            if yielded is not None:
                raise _Awaited(
                    f"awaits {type(yielded).__name__} outside ctx, which replay cannot follow"
                )
    except StopIteration:
        return
    finally:
        coro.close()


def _caught(machine: Machine) -> Divergence | None:
    """A divergence the code caught (and went on after): it is still one."""
    e = machine.nondeterminism
    return None if e is None else _divergence(machine, machine.state, e)


def _divergence(machine: Machine, state: RunState, e: NondeterminismError) -> Divergence:
    position = e.seq if e.seq is not None else machine.journal.position
    wanted = f"calls {e.step}" if e.step else "finishes"
    return Divergence(position, _recorded(state, position), wanted)


def _recorded(state: RunState, position: int) -> str:
    op = state.op(position)
    if op is not None:
        return describe_op(op)
    return "the run's end" if state.terminal else "nothing more (the run is live)"
