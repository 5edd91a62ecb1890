"""``mock_model``: the model an agent asks, replaced for a test by a scripted one, its calls kept.

An agent names its model in code: ``ctx.llm(MODEL, ...)``, or a Pydantic AI agent run through
``SojournAgent``. ``mock_model(target, script)`` puts a stand-in in its place for a ``with``
block and takes it away after, however the block ends::

    from sojourn.actors.testing import mock_model, turn
    import myapp.agents

    async def test_weather(sojourn_env) -> None:
        script = [
            turn(calls=[("get_weather", {"city": "Lisbon"})]),  # turn 1 calls a tool
            turn("Sunny in Lisbon.", tokens=(120, 8)),          # turn 2 answers
        ]
        with mock_model(myapp.agents.MODEL, script) as model:
            run_id = await sojourn_env.start("chat", {"question": "Weather in Lisbon?"})
            await sojourn_env.result(run_id)
        first, second = model.calls
        assert first.request.messages[-1].content == "Weather in Lisbon?"
        assert second.idempotency_key == f"{run_id}/{second.position}"

The stand-in answers from ``ScriptedModel`` (the script is its script: answers in order, or
one function of the request) and keeps the model's name, so the step is ``llm:<name>`` as in
production, and its prices, so the run's budget is charged as production's would be. The
target is:

- a model object the agent passes to ``ctx.llm`` (replaced wherever the agent's code finds
  it), or a model name (every model of that name ``ctx.llm`` is given);
- a ``SojournAgent`` (or the Pydantic AI ``Agent`` it wraps): its runs use the stand-in, put
  in place with pydantic-ai's ``Agent.override(model=...)``, so the agent's own model is not
  even asked. The conversation is handed to the script as a ``ModelRequest`` (the agent's
  instructions a ``system`` message, tool results ``tool`` messages, function and output tools
  its ``tools``), and the answer back as a Pydantic AI response.

The worker must run in the test's process (``SojournEnv``, ``sojourn_env``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import msgspec

from sojourn.schemas.events import Usage

from ..agents.steps import current_step
from ..llm import _call
from ..llm._prices import PriceTable
from ..llm._scripted import Answer, ScriptedModel
from ..llm._types import Model, ModelRequest, ModelResponse, OnToken, ToolCall

__all__ = ["ModelCall", "ModelMock", "mock_model", "turn"]

_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One request the stand-in answered: which execution of which step it was, what was
    asked, and what it answered (``response``) or raised (``error``)."""

    run_id: str
    position: int
    attempt: int
    idempotency_key: str
    in_doubt: bool
    request: ModelRequest
    response: ModelResponse | None
    error: BaseException | None


def turn(
    text: str = "",
    *,
    calls: Mapping[str, Mapping[str, Any]] | Sequence[tuple[str, Mapping[str, Any]]] = (),
    tokens: tuple[int, int] | None = None,
    cost: float | None = None,
) -> ModelResponse:
    """One scripted answer: ``text``, and the tools it calls with their arguments
    (``[("get_weather", {"city": "Lisbon"})]``, or a mapping from name to arguments).

    ``tokens`` is the usage to report, ``(input, output)`` (default: ``ScriptedModel``'s made-up
    counts, the words of the request and of the answer); ``cost`` the USD the provider itself
    would report (``ctx.llm`` then uses it instead of the price table, as for OpenRouter; the
    Pydantic AI integration prices with ``SojournAgent(prices=...)`` only). Tool calls get the
    ids ``call-<request>-<n>``, unique within a mock.
    """
    items = list(calls.items()) if isinstance(calls, Mapping) else list(calls)
    tool_calls = tuple(
        ToolCall(id="", name=name, arguments=json.dumps(dict(arguments)))
        for name, arguments in items
    )
    usage = (
        Usage()
        if tokens is None
        else Usage(input_tokens=tokens[0], output_tokens=tokens[1], requests=1)
    )
    return ModelResponse(text=text, tool_calls=tool_calls, usage=usage, cost=cost)


class ModelMock:
    """The stand-in ``mock_model`` puts in place of ``target``'s model; ``calls`` lists every
    request it answered, oldest first, across every run that made one.

    Attributes:
        scripted: the ``ScriptedModel`` answering (its ``calls`` count includes scripted
            failures).
        name: the name the stand-in goes by (the step is ``llm:<name>``).
    """

    def __init__(
        self,
        target: Any,
        script: Sequence[Answer] | Callable[[ModelRequest], Any],
        *,
        name: str | None = None,
        prices: Any = _UNSET,
        fail: Mapping[int, float | None] | Iterable[int] = (),
        delay: float = 0.0,
    ) -> None:
        self.target = target
        self.calls: list[ModelCall] = []
        self._prices = prices
        self._pydantic = _is_pydantic_ai(target)
        if self._pydantic:
            from . import _pydantic_ai

            default = _pydantic_ai.model_name(target)
        elif isinstance(target, str):
            default = target
        elif isinstance(target, Model):
            default = target.name
        else:
            raise TypeError(
                f"mock_model stands in for a model given to ctx.llm (the object or its name) "
                f"or a SojournAgent's model, not {target!r}"
            )
        self.name: str = name or default
        self.scripted = ScriptedModel(script, name=self.name, fail=fail, delay=delay)
        self._remove: Callable[[], None] | None = None
        self._asked = 0

    def __repr__(self) -> str:
        return f"ModelMock({self.name!r}, calls={len(self.calls)})"

    async def answer(self, request: ModelRequest, on_token: OnToken | None = None) -> ModelResponse:
        """Answer ``request`` from the script, inside the step of a model request, and keep the
        call (what the stand-ins put in place call)."""
        s = current_step()
        step = (s.run_id, s.position, s.attempt, s.idempotency_key, s.in_doubt)
        self._asked += 1
        n = self._asked  # this request's number, whatever other runs ask meanwhile
        try:
            response = await self.scripted.request(
                request, on_token=on_token, idempotency_key=s.idempotency_key
            )
        except BaseException as e:
            self.calls.append(ModelCall(*step, request=request, response=None, error=e))
            raise
        if any(not c.id for c in response.tool_calls):
            ids = tuple(
                c if c.id else msgspec.structs.replace(c, id=f"call-{n}-{i}")
                for i, c in enumerate(response.tool_calls, 1)
            )
            response = msgspec.structs.replace(response, tool_calls=ids)
        self.calls.append(ModelCall(*step, request=request, response=response, error=None))
        return response

    def _stand_in_for(self, model: Model) -> Model | None:
        """The ``ctx.llm`` seam: a stand-in for ``model`` when it is the target."""
        target = self.target
        if model is not target and not (isinstance(target, str) and model.name == target):
            return None
        prices = getattr(model, "prices", None) if self._prices is _UNSET else self._prices
        return _StandIn(self, model.name, prices)

    def __enter__(self) -> Self:
        if self._remove is not None:
            raise RuntimeError(f"the stand-in for model {self.name!r} is already in place")
        if self._pydantic:
            from . import _pydantic_ai

            self._remove = _pydantic_ai.put_model_in_place(self)
        else:
            seam = _call.MODEL_STAND_INS
            swap = self._stand_in_for
            seam.append(swap)
            self._remove = lambda: seam.remove(swap)
        return self

    def __exit__(self, *exc: object) -> None:
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()


class _StandIn:
    """What ``ctx.llm`` calls in the target's place: its name and prices, the mock's answers."""

    def __init__(self, mock: ModelMock, name: str, prices: PriceTable | None) -> None:
        self.name = name
        self.prices = prices
        self._mock = mock

    async def request(
        self,
        request: ModelRequest,
        *,
        on_token: OnToken | None = None,
        idempotency_key: str | None = None,
    ) -> ModelResponse:
        return await self._mock.answer(request, on_token)


def _is_pydantic_ai(target: object) -> bool:
    if "pydantic_ai" not in sys.modules:  # a pydantic-ai object imported it already
        return False
    from . import _pydantic_ai

    return _pydantic_ai.is_agent(target)


def mock_model(
    target: Any,
    script: Sequence[Answer] | Callable[[ModelRequest], Any],
    *,
    name: str | None = None,
    prices: Any = _UNSET,
    fail: Mapping[int, float | None] | Iterable[int] = (),
    delay: float = 0.0,
) -> ModelMock:
    """A scripted stand-in for ``target``'s model, in place for a ``with`` block; see the
    module docstring.

    Args:
        target: a model object given to ``ctx.llm``, a model name, or a ``SojournAgent`` (or
            the Pydantic AI ``Agent`` it wraps).
        script: ``ScriptedModel``'s script: answers in order (``turn(...)``, a
            ``ModelResponse``, a ``str``, an exception to raise, a function of the request),
            or one function answering every request.
        name: the name the stand-in goes by (default: the target's, so steps and prices are
            production's; under Pydantic AI the agent's model's ``model_name``, or the part of
            its ``"provider:name"`` after the colon).
        prices: for ``ctx.llm``, a ``PriceTable`` to price with (default: the target's own, or
            none, as in production). Under Pydantic AI the ``SojournAgent``'s ``prices`` apply.
        fail: requests (1-based) that raise ``ModelRateLimited`` first, with the given
            ``retry_after`` (``ScriptedModel``'s ``fail``), to exercise retries.
        delay: seconds between streamed words.

    Raises:
        TypeError: ``target`` is none of these.
    """
    return ModelMock(target, script, name=name, prices=prices, fail=fail, delay=delay)
