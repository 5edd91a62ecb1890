"""Fencing: whoever executes a run, the event store's sequence fence lets one history through.

- Two activations resume the same run at once from the same recorded history (mid-run, a step
  in doubt, or a retry due), 500 times: one completes, the other is fenced before any effect.
- A SIGSTOPped worker wakes up after another worker took its run over and finished it: its
  late append is refused and it runs no further step.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sojourn.actors import Agent, Client, Context, agent
from sojourn.actors.core.state import fold
from sojourn.actors.worker.activation import Activation
from sojourn.broker import Broker, Delivery, EmbeddedServer, EventStore, Names
from sojourn.broker import headers as h
from sojourn.broker.topology import ensure_topology
from sojourn.schemas import (
    ErrorInfo,
    RunCompleted,
    RunEvent,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    decode_events,
    from_raw,
    to_raw,
)
from sojourn.schemas.codec import decode_worker_beat
from sojourn.schemas.config import Settings
from sojourn.schemas.health import WorkerBeat
from tests.conftest import wait_for
from tests.procs import WorkerProc

# --- two activations, one run, 500 times ------------------------------------------------------

STEPS = 3
effects: Counter[tuple[int, int]] = Counter()
"""(round, step) -> how many times the step's effect happened."""


async def touch(round_no: int, i: int) -> str:
    effects[(round_no, i)] += 1
    await asyncio.sleep(0)  # let the other activation interleave
    return f"{round_no}:{i}"


@agent("fence_racer")
async def fence_racer(ctx: Context, round_no: int) -> list[str]:
    return [await ctx.step(touch, round_no, i) for i in range(STEPS)]


VARIANTS = ("mid_run", "in_doubt", "retry_due")


def recorded(variant: str, round_no: int) -> list[RunEvent]:
    """What an earlier (dead) worker recorded about step 0 before both activations resume."""
    now = time.time()
    started = StepStarted(position=0, name="touch", attempt=1, at=now)
    if variant == "mid_run":
        return [
            started,
            StepCompleted(position=0, name="touch", result=to_raw(f"{round_no}:0"), at=now),
        ]
    if variant == "in_doubt":
        return [started]
    return [
        started,
        StepFailed(
            position=0,
            name="touch",
            error=ErrorInfo(type="ConnectionError", message="reset"),
            retry_at=now - 1,
            at=now,
        ),
    ]


async def resume(act: Activation, yields: int) -> str:
    """Run ``act`` after letting the event loop turn ``yields`` times (varies who goes first)."""
    for _ in range(yields):
        await asyncio.sleep(0)
    return str(await act.run())


async def test_two_activations_resuming_one_run_500_times(
    nats_server: EmbeddedServer, settings: Settings
) -> None:
    broker = await Broker.connect(nats_server.url)
    names = Names(settings.prefix)
    await ensure_topology(broker, names, settings)
    store = EventStore(broker, names, settings)
    rng = random.Random(20240601)
    outcomes: Counter[str] = Counter()
    winners: Counter[str] = Counter()
    rounds = 500
    # ``Activation`` takes ``Agent[object, object]``; the worker passes its ``Agent[Any, Any]``.
    any_racer: Agent[Any, Any] = fence_racer
    try:
        for round_no in range(rounds):
            variant = VARIANTS[round_no % len(VARIANTS)]
            run_id = f"fence-{round_no}"
            seq = await store.append(
                run_id,
                [RunStarted(run_id=run_id, agent="fence_racer", input=to_raw(round_no))],
                expected_seq=0,
                writer="intake",
            )
            await store.append(
                run_id, recorded(variant, round_no), expected_seq=seq, writer="dead-worker"
            )
            history = await store.load(run_id)
            acts = {
                w: Activation(
                    agent=any_racer, run_id=run_id, store=store, history=history, writer=w
                )
                for w in ("A", "B")
            }
            order = ["A", "B"]
            rng.shuffle(order)

            runs = [resume(acts[w], rng.randrange(3)) for w in order]
            results = dict(zip(order, await asyncio.gather(*runs), strict=True))
            outcomes.update(results.values())
            assert sorted(results.values()) == ["completed", "fenced"], (round_no, results)
            winner = next(w for w, r in results.items() if r == "completed")
            winners[winner] += 1

            decisions = await store.load(run_id)
            assert [d.writer for d in decisions[:2]] == ["intake", "dead-worker"]
            assert {d.writer for d in decisions[2:]} == {winner}, (round_no, decisions)
            assert [d.seq for d in decisions] == sorted({d.seq for d in decisions})
            events = [e for d in decisions for e in d.events]
            state = fold(events)
            assert state.status == "completed" and state.anomalies == (), (round_no, state)
            assert [op.position for op in state.ops] == list(range(STEPS))
            assert all(op.status == "completed" for op in state.ops)
            assert sum(isinstance(e, RunCompleted) for e in events) == 1
            done = [e.position for e in events if isinstance(e, StepCompleted)]
            assert done == list(range(STEPS)), (round_no, done)
            assert from_raw(state.output or b"null", list[str]) == [
                f"{round_no}:{i}" for i in range(STEPS)
            ]
            # Every effect once: the recorded step 0 of a mid-run history not at all.
            expected = {(round_no, i): 1 for i in range(STEPS)}
            if variant == "mid_run":
                expected[(round_no, 0)] = 0
            assert {k: effects[k] for k in expected} == expected, (round_no, variant)
            # The loser learned it lost and wrote nothing more.
            loser = "B" if winner == "A" else "A"
            assert acts[loser].fenced and acts[loser].pending == []
    finally:
        await broker.close()
    assert outcomes == Counter({"completed": rounds, "fenced": rounds})
    # The race went both ways: this is not one activation always starting first.
    assert min(winners.values()) > rounds // 10, winners


# --- a paused worker comes back too late -------------------------------------------------------


def rows(log: Path) -> list[tuple[str, int, str, str, str]]:
    if not log.exists():
        return []
    out = []
    for raw in log.read_text().splitlines():
        event, pid, step, key, last = raw.split()
        out.append((event, int(pid), step, key, last))
    return out


async def test_a_stopped_worker_is_refused_after_another_took_over(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    env = {"SOJOURN_TEST_LOG": str(log), "SOJOURN_SLOW_STEP": "3"}
    module = "tests.apps.retry_agents"
    a = WorkerProc(nats_server.url, settings.prefix, module, lease_ttl=2.0, **env)
    b: WorkerProc | None = None
    stopped = False
    seen_events: list[Delivery] = []
    seen_beats: list[WorkerBeat] = []
    subs: list[Any] = []
    run_id = "stopped"
    key = f"{run_id}/1"
    try:
        await a.ready()
        await client.start("doubt_retry", 0, run_id=run_id, wait=True)

        async def a_in_slow_step() -> bool:
            return any(r[0] == "exec" and r[1] == a.proc.pid and r[3] == key for r in rows(log))

        await wait_for(a_in_slow_step, timeout=30, what="worker A inside the slow step")
        os.kill(a.proc.pid, signal.SIGSTOP)
        stopped = True

        b = WorkerProc(nats_server.url, settings.prefix, module, lease_ttl=2.0, **env)
        await b.ready()

        async def b_took_over() -> bool:
            return any(
                isinstance(e, StepStarted) and (e.position, e.attempt) == (1, 2)
                for d in await client.history(run_id)
                for e in d.events
            )

        await wait_for(b_took_over, timeout=30, what="worker B to take the run over")
        history = await client.history(run_id)
        writer_a = next(
            d.writer
            for d in history
            for e in d.events
            if isinstance(e, StepStarted) and (e.position, e.attempt) == (1, 1)
        )
        takeover = next(
            d
            for d in history
            for e in d.events
            if isinstance(e, StepStarted) and (e.position, e.attempt) == (1, 2)
        )
        assert f"-{a.proc.pid}-" in writer_a
        assert takeover.writer != writer_a and f"-{b.proc.pid}-" in takeover.writer
        assert await client.result(run_id, timeout=30) == [0, 10, 20, 30]

        names = client.names
        before = await client.history(run_id)

        async def on_event(m: Delivery) -> None:
            seen_events.append(m)

        async def on_beat(m: Delivery) -> None:
            seen_beats.append(decode_worker_beat(m.data))

        # Core subscriptions see what A publishes, whether or not the streams take it.
        subs.append(await client.broker.subscribe(names.events(run_id), cb=on_event))
        subs.append(await client.broker.subscribe(names.workers_all, cb=on_beat))
        await client.broker.flush()

        os.kill(a.proc.pid, signal.SIGCONT)
        stopped = False

        async def a_step_finished() -> bool:
            return any(r[0] == "done" and r[1] == a.proc.pid and r[3] == key for r in rows(log))

        await wait_for(a_step_finished, timeout=30, what="A's step body to finish")

        def from_a(m: Delivery) -> bool:
            return m.header(h.WRITER) == writer_a

        async def a_tried_to_append() -> bool:
            return any(from_a(m) for m in seen_events)

        await wait_for(a_tried_to_append, timeout=30, what="A's late append")

        attempt_at = len(seen_beats)

        async def a_activation_over() -> bool:
            # A beat of A's that no longer lists the run, after its refused append.
            return any(
                f"-{a.proc.pid}-" in beat.worker_id and all(r.run_id != run_id for r in beat.runs)
                for beat in seen_beats[attempt_at:]
            )

        await wait_for(a_activation_over, timeout=30, what="A's activation to end")

        # What A tried to write: its late completion of step 1 (with the next step's start).
        tried = [e for m in seen_events if from_a(m) for e in decode_events(m.data)]
        assert any(isinstance(e, StepCompleted) and e.position == 1 for e in tried), tried

        after = await client.history(run_id)
        assert after == before  # refused: the history did not change
        assert writer_a not in {d.writer for d in after if d.seq >= takeover.seq}
        state = fold(e for d in after for e in d.events)
        assert state.status == "completed" and state.anomalies == ()
        # A ran no later step of the run.
        assert [r for r in rows(log) if r[1] == a.proc.pid and r[0] == "exec"] == [
            ("exec", a.proc.pid, "quick", f"{run_id}/0", "1"),
            ("exec", a.proc.pid, "slow", key, "1"),
        ]
        assert a.proc.poll() is None  # A itself lives on, fenced out of this run only
    finally:
        for sub in subs:
            await sub.unsubscribe()
        if stopped:
            os.kill(a.proc.pid, signal.SIGCONT)
        a.stop()
        if b is not None:
            b.stop()
