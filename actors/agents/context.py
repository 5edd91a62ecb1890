"""``Context``: what agent code uses to do anything that must survive a crash.

Every method here is journaled. On replay a recorded step returns its recorded result without
running; a recorded ``now()``/``uuid()``/``random()`` returns the recorded value. Code *between*
these calls must be deterministic and side-effect free: it runs again on every replay.

Replay hazards (they raise ``NondeterminismError`` at the next journaled call, or corrupt
nothing but behave differently): reading the wall clock or ``random`` directly, iterating a
``set`` whose order depends on hashing of str, branching on environment variables or on the
current time, or calling steps in a different order after a deploy (guard such a change with
``ctx.patched``; ``sojourn replay`` finds the ones that were not guarded).

``Context`` is a façade. What to record and what to do next is decided by the run machine
(``machine.py``, no I/O); the ``Driver`` (an ``Activation`` when live) stores events, sets
timers and publishes; the context runs the agent's step functions and turns the machine's
answers into return values and exceptions. It is put together from one mixin per concept, each
in a module of its own on ``ContextBase`` (``driver.py``: the run's facts, ``heartbeat``,
``now``/``uuid``/``random``): ``step_calls.py`` (``step``, ``llm``, ``stream``, ``progress``),
``waits.py`` (``sleep``, ``wait_for``, ``select``), ``children.py`` (``start_child``,
``child``) and ``long_waits.py`` (``approval``, ``poll``). This module adds what concerns the
run as a whole: ``gather``, versioning (``patched``), ``continue_as_new``, ``spend`` and
``callback``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec

from sojourn.schemas.codec import to_raw
from sojourn.schemas.errors import CallbackKeysMissing

from ..core.actions import Parked
from ..history.chain import ContinueAsNew
from ..ops import metrics as _metrics
from . import gather as _gather
from .callbacks import CALLBACK_KEYS_ENV, check_callback_signal, check_ttl
from .children import Children
from .driver import Duration, seconds
from .gather import ChildCall, ChildResult, GatherError
from .long_waits import LongWaits
from .steps import StepInfo, current_step, heartbeat, idempotency_headers

if TYPE_CHECKING:
    from ..core.retry import InDoubt, RetryPolicy
    from ..integrations.mcp import McpServer

__all__ = [
    "ChildCall",
    "ChildResult",
    "Context",
    "GatherError",
    "Parked",
    "StepInfo",
    "current_step",
    "heartbeat",
    "idempotency_headers",
]

PATCH_ID_MAX = 200
"""Characters of a ``ctx.patched`` change id (it is stored in every run that passes it)."""


class Context(Children, LongWaits):
    """The handle an agent run gets as its first argument."""

    # --- versioning -------------------------------------------------------------------------

    def patched(self, change_id: str) -> bool:
        """Whether this run takes the new branch of a code change: ``True`` for runs that reach
        this point under code that has it (a marker is recorded), ``False`` for runs whose
        history passed this point before the change. Wrap the change, keep the old branch::

            if ctx.patched("send-sms-too"):
                await ctx.step(send_sms, user)      # new code
            await ctx.step(send_email, user)        # both

        The answer is the same for every call with the same id in one run. When no run that
        took the old branch is left (``sojourn replay --all-live`` says so), replace the call
        by ``ctx.deprecate_patch(change_id)`` and drop the old branch; see the guide.

        Raises:
            ValueError: ``change_id`` is empty or longer than 200 characters.
        """
        self._check_patch_id(change_id)
        self._driver.check_live()
        return self._m.patched(change_id, self._driver.time())

    def deprecate_patch(self, change_id: str) -> None:
        """The second step of retiring ``ctx.patched(change_id)``: the old branch is gone, and
        runs that recorded the change's marker still replay. Remove this call too once those
        runs have ended."""
        self._check_patch_id(change_id)
        self._driver.check_live()
        self._m.deprecate_patch(change_id)

    @staticmethod
    def _check_patch_id(change_id: str) -> None:
        if not isinstance(change_id, str) or not 0 < len(change_id) <= PATCH_ID_MAX:
            raise ValueError(f"a patch's change id is a string of 1 to {PATCH_ID_MAX} characters")

    async def gather(
        self,
        *aws: Awaitable[Any],
        return_exceptions: bool = False,
        limit: int | None = None,
    ) -> list[Any]:
        """Run several operations at once and return their results in argument order, the
        same on every replay whichever finishes first::

            a, b, kid = await ctx.gather(
                ctx.step(fetch, url1), ctx.step(fetch, url2), ctx.child("summarise", doc)
            )

        Each argument is one ``ctx.step(...)`` call (``ctx.llm(...)`` too, or a coroutine that
        makes exactly one step call before it awaits anything), a ``ctx.child(...)`` or a
        ``handle.result()``. Children are started first, in argument order; steps then run
        concurrently (at most ``limit`` at once, started in argument order); child results are
        awaited last, in argument order (the run parks until each has ended). A failure is
        raised once every argument has settled: the first in argument order, or each in its
        place with ``return_exceptions=True``.

        Raises:
            GatherError: an argument makes a second journaled call, or one after awaiting
                something, or a wait or child start of its own (its position would depend on
                timing, which a replay cannot reproduce); a gather inside a gather.
            ValueError: more than 1000 arguments, or a ``limit`` below 1.
            StepError, ChildRunError: the first failure in argument order
                (``return_exceptions=False``).
        """
        self._driver.check_live()
        return await _gather.gather(
            self._m, self._driver.commit, aws, return_exceptions=return_exceptions, limit=limit
        )

    # --- long conversations ------------------------------------------------------------

    def continue_as_new(self, input: Any) -> NoReturn:
        """End this run and carry on in a new run of the same agent with ``input`` and an
        empty history: a conversation of thousands of turns stays as quick to wake as one of
        ten. Never returns (it raises a ``BaseException`` that ``except Exception`` cannot
        catch), whether awaited or not.

        The new run's id is ``<first run id>-g<n>``; it keeps this run's parent, agent and
        budget, and the signals this run holds that no wait took. The chain's first id stays
        the handle of the whole conversation: ``Client.result``, ``sojourn watch`` and
        signals and cancels sent to it follow the chain to its current run, and a parent
        learns the outcome of the chain's last run. ``input`` larger than
        ``Settings.value_inline_max`` is stored by reference, its unchanged parts shared.

        Raises:
            TypeError: ``input`` is not JSON-encodable.
        """
        self._driver.check_live()
        self._m.check()
        try:
            raw = to_raw(input)
        except msgspec.EncodeError as e:
            raise TypeError(f"ctx.continue_as_new input must be JSON-encodable: {e}") from e
        raise ContinueAsNew(raw)

    # --- spending and callbacks ---------------------------------------------------------------

    async def spend(self, *, usd: float = 0.0, tokens: int = 0) -> None:
        """Record what the run just spent (an LLM call's cost and tokens), journaled.

        Totals are counted in ``sojourn_spend_total``. When the agent has a ``Budget`` and the
        run's total reaches it, the run is suspended (reason ``budget``) before it can spend
        more; ``sojourn resume RUN`` grants the same budget again.

        Raises:
            ValueError: a negative amount.
        """
        if usd < 0 or tokens < 0:
            raise ValueError("ctx.spend amounts must not be negative")
        self._driver.check_live()
        live, over = self._m.spend(usd, tokens, self._driver.time())
        agent = self._driver.metric_agent
        if live:
            _metrics.count_spend(agent, "usd", usd)
            _metrics.count_spend(agent, "tokens", tokens)
        if over is not None:
            _metrics.BUDGET_BREACHES.labels(agent, over.unit or "usd").inc()
            await self._driver.suspend(over.event)

    def callback(self, signal: str, *, ttl: Duration) -> str:
        """A token to hand an external system (an e-signature service, a payment provider)
        that will call back over HTTP: the gateway delivers its POST body as the signal
        ``signal`` to this run, once however often it is repeated, until ``ttl`` has passed.
        Wait for it with ``ctx.wait_for(signal)`` as for any signal.

        Journaled: a replay returns the same token (so it is in the run's history; treat the
        history as holding a capability until the token expires). Each call is a new token
        with its own signal id: hand out one per callback you expect.

        Raises:
            InvalidName: ``signal`` is not a signal name, or a reserved (``sojourn-``) one.
            ValueError: ``ttl`` is not more than 0 and at most 366 days.
            CallbackKeysMissing: the worker has no callback keys (``SOJOURN_CALLBACK_KEYS``
                or ``Worker(callback_keys=...)``); a replay of a recorded token needs none.
        """
        check_callback_signal(signal)
        valid_for = check_ttl(seconds(ttl))
        keys = self._callback_keys
        if keys is None and not self._m.replaying and not self.offline:
            # Refused before the call takes a position: nothing is recorded.
            raise CallbackKeysMissing(
                f"ctx.callback needs callback keys: set {CALLBACK_KEYS_ENV} to a key file "
                "(one `KID SECRET` per line) or pass Worker(callback_keys=CallbackKeys(...))",
                run_id=self.run_id,
            )

        def issue() -> str:
            assert keys is not None  # a recorded token is returned without issuing one
            # A credential, checked by the gateway on the real clock (not the runs').
            return keys.issue(self.run_id, signal, valid_for, time.time())

        token: str = self._value("callback", issue, str)
        return token

    # --- MCP tools ----------------------------------------------------------------------------

    async def mcp(
        self,
        server: str | McpServer,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        in_doubt: InDoubt | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        usd: float | None = None,
    ) -> Any:
        """Call ``tool`` of the MCP server ``server`` (a name declared on the agent,
        ``@agent(..., mcp=[McpServer(...)])``, or an ``McpServer``) with ``args``, as a
        journaled step (``mcp:<server>.<tool>``, kind ``tool``), and return its result: the
        tool's structured content, else its text. Replay returns the recorded result without
        asking the server. Needs ``pip install 'sojourn[mcp]'``; see docs/mcp.md.

        ``in_doubt``, ``retry``, ``timeout`` (seconds to wait for the answer) and ``usd`` (the
        call's cost, charged to the run's budget) override the server's declaration. A call
        whose server goes away before it answers is in doubt and settled by ``in_doubt``.

        Raises:
            KeyError: no server of that name is declared on the agent.
            StepError: the call failed for good (``error_type`` ``McpToolError``: the tool
                answered with an error; ``McpUnavailable``: the server could not be reached).
        """
        from ..integrations.mcp import call  # imported on first use: the mcp extra

        return await call(
            self, server, tool, args, in_doubt=in_doubt, retry=retry, timeout=timeout, usd=usd
        )
