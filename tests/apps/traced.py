"""The agents of the tracing tests (tests/actors/telemetry): two steps, a model request, a
child run and a signal, and a step that holds until the test releases it, so that its worker
can be killed in the middle of it.

``SOJOURN_TEST_HOLD_DIR``: where ``held`` writes ``started-<attempt>`` when it starts and
waits for ``release`` (without it, the step does not wait). Every step returns the trace and
span ids of the OpenTelemetry context it runs in: the step's own span, if the process traces.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sojourn.actors import Context, agent, current_step
from sojourn.actors.llm import PriceTable, ScriptedModel

MODEL = ScriptedModel(
    lambda request: "a summary of the run in six words",
    name="scripted-mini",
    prices=PriceTable({"scripted-mini": (1.0, 2.0)}),
)


def _context() -> str:
    """The current OpenTelemetry span as ``<trace id>/<span id>`` ("" without one)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return ""
    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}/{ctx.span_id:016x}" if ctx.is_valid else ""


async def first(x: int) -> list[str]:
    return [str(x + 1), _context()]


def held(x: int) -> list[str]:  # a sync step, on a step thread, in the attempt's context too
    where = os.environ.get("SOJOURN_TEST_HOLD_DIR")
    if where:
        info = current_step()
        attempt = 0 if info is None else info.attempt
        Path(where, f"started-{attempt}").write_text(str(os.getpid()))
        while not Path(where, "release").exists():
            time.sleep(0.05)
    return [str(x * 2), _context()]


def double(n: int) -> int:  # a sync step: it runs on a step thread
    return n * 2


@agent("traced_child")
async def traced_child(ctx: Context, n: int) -> int:
    return await ctx.step(double, n)


@agent("traced")
async def traced(ctx: Context, x: int) -> dict[str, object]:
    one = await ctx.step(first, x)
    answer = await ctx.llm(MODEL, f"summarize {one[0]}")
    child = await ctx.child("traced_child", int(one[0]))
    two = await ctx.step(held, child)
    go = await ctx.wait_for("go")
    return {"first": one, "text": answer.text, "child": child, "held": two, "go": go}
