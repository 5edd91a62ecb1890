"""A failed append is never swallowed (hypothesis, no server).

The real ``Activation`` runs a generated agent (steps with small, limit-sized and oversized
results, some of whose ``StepError`` it catches; journaled values; unjournaled pauses that let
completions be flushed in the background) against an in-memory event store that fails chosen
appends: an outage before the message lands, an outage after it landed (the ack is lost), or a
refusal (a JetStream error). After every activation, and once new activations on a healthy
store have finished the run, the stored history must hold either the events or nothing past a
recorded failure:

- it folds without anomalies (no gap, nothing twice), and every step end follows the start
  of the same attempt;
- a run that ended shows every step it started completed or failed for good, never a step
  started and silently finished;
- a step whose end was stored never runs again (one whose end was lost runs again: it is in
  doubt); an oversized result is a recorded, non-retried ``PayloadTooLarge`` failure;
- every message fits the store's message limit (big decisions are split).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Literal, cast
from unittest import mock

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sojourn.actors import Agent, Context, StepError, agent
from sojourn.actors.core.state import fold
from sojourn.actors.worker import activation as executor_module
from sojourn.actors.worker.activation import Activation
from sojourn.actors.worker.appends import fit_prefix
from sojourn.broker import Broker, EventStore, Names
from sojourn.broker.connection import JetStreamError
from sojourn.broker.eventstore import Decision
from sojourn.schemas import (
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    encode_events,
    to_raw,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import (
    BrokerUnavailable,
    ConcurrencyConflict,
    PayloadTooLarge,
    SojournError,
)

MAX_VALUE = 1024
MAX_MESSAGE = 2048
ENVELOPE = 512
"""Patched over ``VALUE_ENVELOPE``: the limit in effect is min(1024, 2048 - 512) = 1024, and a
few buffered values overflow one message."""
RUN = "model-run"

Fault = Literal["outage", "outage_landed", "refuse"]


class FakeBroker:
    """What an activation asks of the broker here: purging a run's timers when it ends."""

    async def api(self, subject: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        return {}


class FakeStore(EventStore):
    """One run's history in memory, fenced like the real store, failing chosen appends."""

    def __init__(self, faults: dict[int, Fault]) -> None:
        settings = Settings(prefix="model", max_value=MAX_VALUE)
        super().__init__(cast(Broker, FakeBroker()), Names("model"), settings)
        self.faults = faults
        self.calls = 0
        self.decisions: list[Decision] = []

    @property
    def max_decision(self) -> int:
        return MAX_MESSAGE

    async def append(
        self,
        run_id: str,
        events: list[RunEvent] | tuple[RunEvent, ...],
        *,
        expected_seq: int,
        writer: str,
        msg_id: str | None = None,
        timeout: float | None = None,
    ) -> int:
        data = encode_events(events)
        if len(data) > self.max_decision:  # as the real store: refused before sending
            raise PayloadTooLarge(f"decision of {len(data)} bytes", run_id=run_id)
        mid = msg_id or f"{run_id}:{expected_seq}:{writer}"
        fault = self.faults.get(self.calls)
        self.calls += 1
        last = self.decisions[-1].seq if self.decisions else 0
        if expected_seq != last:
            after = [d for d in self.decisions if d.seq > expected_seq]
            if after and after[0].msg_id == mid:  # the landed check of a retried append
                return after[0].seq
            raise ConcurrencyConflict("fenced", run_id=run_id, expected=expected_seq)
        if fault == "outage":
            raise BrokerUnavailable("append not acknowledged", run_id=run_id)
        if fault == "refuse":
            raise JetStreamError("message size exceeds maximum allowed", code=400, err_code=10054)
        self.decisions.append(Decision(last + 1, tuple(events), writer, mid, len(data)))
        if fault == "outage_landed":
            raise BrokerUnavailable("ack lost", run_id=run_id)
        return last + 1

    async def load(self, run_id: str, after_seq: int = 0) -> list[Decision]:
        return [d for d in self.decisions if d.seq > after_seq]

    async def history(self, run_id: str) -> list[Decision]:
        return list(self.decisions)


# --- the generated agent ----------------------------------------------------------------------

Op = tuple[str, int, bool]
"""("step", result size in bytes of JSON, catch its StepError) | ("value", 0, False) |
("pause", 0, False)."""

EXECUTED: list[tuple[int, int]] = []
"""(activation number, position) for every execution of a step body."""
ACTIVATION = [0]


async def produce(position: int, size: int) -> str:
    EXECUTED.append((ACTIVATION[0], position))
    return "x" * (size - 2)


@agent("model")
async def model(ctx: Context, ops: list[Op]) -> list[Any]:
    out: list[Any] = []
    position = 0
    for kind, size, catch in ops:
        if kind == "step":
            try:
                out.append(len(await ctx.step(produce, position, size)))
            except StepError as e:
                if not catch:
                    raise
                out.append(e.error_type)
            position += 1
        elif kind == "value":
            ctx.random()
            position += 1
        else:
            await asyncio.sleep(0.004)  # the flush timer (1 ms) fires meanwhile
    return out


def expected_outcome(ops: list[Op]) -> tuple[str, list[Any] | None]:
    out: list[Any] = []
    for kind, size, catch in ops:
        if kind != "step":
            continue
        if size <= MAX_VALUE:
            out.append(size - 2)
        elif catch:
            out.append("PayloadTooLarge")
        else:
            return "failed", None
    return "completed", out


# --- the invariants ---------------------------------------------------------------------------


def ended_positions(events: list[RunEvent]) -> set[int]:
    return {e.position for e in events if isinstance(e, StepCompleted)} | {
        e.position for e in events if isinstance(e, StepFailed) and e.retry_at is None
    }


def check_history(store: FakeStore) -> list[RunEvent]:
    events = [e for d in store.decisions for e in d.events]
    state = fold(events)
    assert not state.anomalies, state.anomalies
    assert all(d.size <= MAX_MESSAGE for d in store.decisions)
    started: set[tuple[int, int]] = set()
    for e in events:  # every step end follows the start of the same attempt
        if isinstance(e, StepStarted):
            started.add((e.position, e.attempt))
        elif isinstance(e, (StepCompleted, StepFailed)):
            assert (e.position, e.attempt) in started, f"an end without its start: {e}"
    if state.terminal:
        silent = {p for p, _ in started} - ended_positions(events)
        assert not silent, f"steps started, then the run ended without them: {silent}"
        assert isinstance(events[-1], (RunCompleted, RunFailed))
    for e in events:
        if isinstance(e, StepFailed) and e.error.type == "PayloadTooLarge":
            assert e.retry_at is None
    return events


async def drive(ops: list[Op], faults: dict[int, Fault]) -> tuple[FakeStore, list[set[int]]]:
    store = FakeStore(faults)
    start = RunStarted(run_id=RUN, agent="model", input=to_raw(ops))
    store.decisions.append(Decision(1, (start,), "intake", "start", 0))
    ended_before: list[set[int]] = []  # per activation: step positions already ended
    # ``Activation`` takes ``Agent[object, object]``; the worker passes its ``Agent[Any, Any]``.
    any_model: Agent[Any, Any] = model
    for n in range(len(faults) + 3):
        ACTIVATION[0] = n
        history = list(store.decisions)
        ended_before.append(ended_positions([e for d in history for e in d.events]))
        act = Activation(
            agent=any_model,
            run_id=RUN,
            store=store,
            history=history,
            writer=f"w{n}",
            flush_delay=0.001,
        )
        try:
            await act.run()
        except SojournError:
            pass  # an outage or a refusal: the worker would retry the run later
        check_history(store)
        if fold(e for d in store.decisions for e in d.events).terminal:
            break
    return store, ended_before


ops_strategy = st.lists(
    st.one_of(
        st.tuples(
            st.just("step"),
            st.sampled_from([2, 40, 600, MAX_VALUE, MAX_VALUE + 1, 5000]),
            st.booleans(),
        ),
        st.just(("value", 0, False)),
        st.just(("pause", 0, False)),
    ),
    max_size=14,
)
faults_strategy = st.dictionaries(
    st.integers(min_value=0, max_value=12),
    st.sampled_from(["outage", "outage_landed", "refuse"]),
    max_size=4,
)


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ops=ops_strategy, faults=faults_strategy)
def test_failed_appends_leave_the_events_or_the_failure_never_a_silent_step(
    ops: list[Op], faults: dict[int, Fault]
) -> None:
    EXECUTED.clear()
    with mock.patch.object(executor_module, "VALUE_ENVELOPE", ENVELOPE):
        store, ended_before = asyncio.run(drive(ops, faults))
    events = check_history(store)
    state = fold(events)
    assert state.terminal, "healthy activations after the faults must finish the run"
    status, out = expected_outcome(ops)
    assert state.status == status
    if out is not None:
        assert msgspec.json.decode(bytes(state.output or b"null")) == out
    else:
        assert state.error is not None and state.error.type == "StepError"
        assert "PayloadTooLarge" in state.error.message
    # A step whose end was stored before an activation began never ran in it.
    for n, position in EXECUTED:
        assert position not in ended_before[n], (n, position)
    # Every recorded end is that of a step that ran (again, if an earlier end was lost).
    ran = Counter(p for _, p in EXECUTED)
    assert all(ran[p] >= 1 for p in ended_positions(events))


@settings(derandomize=True)
@given(st.lists(st.integers(min_value=1, max_value=300), max_size=20), st.integers(1, 1000))
def test_fit_prefix_takes_the_longest_prefix_that_fits(sizes: list[int], limit: int) -> None:
    n = fit_prefix(sizes, limit)

    def encoded(k: int) -> int:
        return 2 + sum(sizes[:k]) + max(k - 1, 0)

    assert 0 <= n <= len(sizes)
    if n:
        assert encoded(n) <= limit
    if n < len(sizes):
        assert encoded(n + 1) > limit
