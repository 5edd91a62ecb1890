"""Stand-ins for what a run calls out to: a step function replaced for a test, its calls kept.

A step is journaled under its function's name, so a stand-in must keep the name (and the
``@step`` options: retries, timeout, in-doubt policy) for the run to record what production
records. ``mock_step`` replaces the function where the agent's code looks it up (the module
or object holding it, as ``unittest.mock.patch`` does) by a recording stand-in that keeps
both, for the length of a ``with`` block::

    from sojourn.actors.testing import mock_step
    import myapp.agents

    async def test_welcome(sojourn_env) -> None:
        with mock_step(myapp.agents, "send_email", returns="queued") as sent:
            run_id = await sojourn_env.start("welcome", {"email": "ada@example.com"})
            await sojourn_env.result(run_id)
        (call,) = sent.calls
        assert call.args == ("ada@example.com",) and call.attempt == 1
        assert call.idempotency_key == f"{run_id}/0"

Each call is kept with what ``current_step()`` says of it (run, position, attempt, idempotency
key, in doubt or not) and its arguments. The stand-in returns ``returns``, raises ``raises``,
or returns what ``side_effect(*args, **kwargs)`` returns (awaited when it is awaitable; it may
read ``current_step()`` too, to fail the first attempt and pass the second, say). The worker
must run in the test's process (``SojournEnv``, the ``sojourn_env`` fixture) for the stand-in
to be the one it calls.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

from ..agents.steps import current_step

__all__ = ["StepCall", "StepMock", "mock_step"]

_MISSING = object()


@dataclass(frozen=True, slots=True)
class StepCall:
    """One call of a stand-in: which execution of which step it was, and its arguments."""

    run_id: str
    position: int
    attempt: int
    idempotency_key: str
    in_doubt: bool
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class StepMock:
    """The stand-in ``mock_step`` puts in place of ``where.<name>``; ``calls`` lists every
    call, oldest first, across every run that made one."""

    def __init__(
        self,
        where: object,
        name: str,
        *,
        returns: Any = None,
        raises: BaseException | type[BaseException] | None = None,
        side_effect: Callable[..., Any] | None = None,
    ) -> None:
        if sum(x is not None for x in (raises, side_effect)) + (returns is not None) > 1:
            raise ValueError("give at most one of returns, raises and side_effect")
        original = getattr(where, name, _MISSING)
        if original is _MISSING or not callable(original):
            raise AttributeError(f"{where!r} has no step function {name!r} to stand in for")
        self.where = where
        self.name = name
        self.original: Callable[..., Any] = original
        self.calls: list[StepCall] = []
        self._returns = returns
        self._raises = raises
        self._side_effect = side_effect
        self._active = False

        async def stand_in(*args: Any, **kwargs: Any) -> Any:
            return await self._call(args, kwargs)

        # The original's name, qualified name, module, annotations (the recorded result is
        # decoded as its return type) and attributes (``@step`` options) carry over.
        functools.update_wrapper(stand_in, original)
        stand_in.__annotations__ = dict(getattr(original, "__annotations__", {}))
        self.stand_in: Callable[..., Any] = stand_in

    async def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        s = current_step()
        call = (s.run_id, s.position, s.attempt, s.idempotency_key, s.in_doubt)
        self.calls.append(StepCall(*call, args=args, kwargs=dict(kwargs)))
        if self._raises is not None:
            raise self._raises
        if self._side_effect is not None:
            out = self._side_effect(*args, **kwargs)
            return await out if inspect.isawaitable(out) else out
        return self._returns

    def __enter__(self) -> Self:
        if self._active:
            raise RuntimeError(f"the stand-in for {self.name!r} is already in place")
        setattr(self.where, self.name, self.stand_in)
        self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.where, self.name, self.original)
        self._active = False


def mock_step(
    where: object,
    name: str,
    *,
    returns: Any = None,
    raises: BaseException | type[BaseException] | None = None,
    side_effect: Callable[..., Any] | None = None,
) -> StepMock:
    """A stand-in for the step function ``where.<name>`` (the module or object the agent's
    code finds it on), in place for a ``with`` block; see the module docstring.

    Raises:
        AttributeError: ``where`` has no callable ``name``.
        ValueError: more than one of ``returns``, ``raises`` and ``side_effect``.
    """
    return StepMock(where, name, returns=returns, raises=raises, side_effect=side_effect)
