"""The chaos harness's agent, and the worker process that serves it.

The agent ``chaos`` runs ``steps`` steps (default 4); each applies one effect to the external
store (``bench.chaos_store``, address in ``$CHAOS_STORE``) under its step's idempotency key, and
a durable ``ctx.sleep`` sits between consecutive steps, so every run parks on broker timers and
is woken by them. Step ``i`` is at position ``2 * i``, sleep ``i`` at ``2 * i + 1``. With
``gate`` set, the run then waits (no timeout) for the signal ``gate`` at ``2 * steps - 1``,
which the harness sends: the intake's seams are in play, and a signal whose wake was lost
would leave the run waiting.

Steps fail at random with ``Transient`` (probability ``$CHAOS_FAIL_RATE``, default 0.1): half
of the time before the store call (the effect did not happen), half after it (the effect
happened but the answer was "lost"). The agent's ``RetryPolicy`` retries ``Transient`` with
short backoffs, so failed attempts, ``StepFailed(retry_at=...)`` and backoff timers are in play.
Whether an attempt fails is drawn from ``(seed, idempotency key, attempt)``, so it is the same
on every worker. ``$CHAOS_BREAK_KEYS=1`` (``bench.chaos --break-idempotency``, the harness's
self-test) adds the attempt to the key, so a step that runs again applies its effect again.

Run a worker (the harness does)::

    python -m bench.chaos_agents NATS_URL PREFIX LEASE_TTL [REPLICAS]

``NATS_URL`` may be a comma-separated list (every node of a cluster); ``REPLICAS`` (default 1)
is ``Settings.replicas``, what the harness's own ``Settings`` say, so that streams a worker
creates or checks for drift agree with the cluster's R3.

It prints ``ready <pid>`` once it takes work. While ``$SOJOURN_FAULTS`` arms seams it also
prints ``seam <name>`` each time it reaches an armed seam, just before
``sojourn.actors.worker.faults`` decides whether to SIGKILL the process there; so the last
such line of a worker that died by SIGKILL names the seam that killed it. (The line is written
and flushed before the decision; the decision itself is the runtime's own code, unchanged.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
import threading
import time

import msgspec

from sojourn.actors import Context, RetryPolicy, Worker, agent, current_step
from sojourn.actors.worker import faults
from sojourn.schemas.config import Settings

from .chaos_store import StoreClient

__all__ = ["AGENT", "GATE", "STEP", "Job", "Transient", "apply_effect", "chaos", "step_positions"]

AGENT = "chaos"
STEP = "apply_effect"
GATE = "gate"
"""The signal a gated run waits for after its last step."""

_SEED = os.environ.get("CHAOS_SEED", "0")
_FAIL = float(os.environ.get("CHAOS_FAIL_RATE", "0.1") or 0.1)
_STEP_TIME = float(os.environ.get("CHAOS_STEP_TIME", "0.02") or 0.0)
_BREAK_KEYS = os.environ.get("CHAOS_BREAK_KEYS") == "1"  # the harness's self-test only
_local = threading.local()


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """A chaos run's input."""

    steps: int = 4
    sleep: float = 0.3
    gate: bool = False


class Transient(Exception):
    """A retryable glitch of the external store (its call failed, or its answer was lost)."""


RETRY = RetryPolicy(
    retry_on=(Transient,),
    attempts=25,
    initial_interval=0.05,
    backoff=2.0,
    max_interval=1.0,
    jitter=0.2,
)


def _store() -> StoreClient:
    client: StoreClient | None = getattr(_local, "client", None)
    if client is None:
        client = _local.client = StoreClient(os.environ["CHAOS_STORE"])
    return client


def apply_effect(index: int) -> int:
    """Apply effect ``index`` of this run, once per idempotency key (the store dedups)."""
    info = current_step()
    rng = random.Random(f"{_SEED}:{info.idempotency_key}:{info.attempt}")
    draw = rng.random()
    if draw < _FAIL / 2:
        raise Transient(f"store call failed (attempt {info.attempt})")
    if _STEP_TIME > 0:
        time.sleep(rng.uniform(0, _STEP_TIME))  # the step's "work": a window to be killed in
    key = info.idempotency_key
    if _BREAK_KEYS:  # self-test: a key that changes per attempt defeats the store's dedup
        key = f"{key}#{info.attempt}"
    _store().apply(key, info.run_id, info.position, info.attempt)
    if draw < _FAIL:
        raise Transient(f"store answer lost (attempt {info.attempt})")
    return index


@agent(AGENT, retry=RETRY)
async def chaos(ctx: Context, job: Job) -> list[int]:
    """``job.steps`` effects with a durable sleep between consecutive ones."""
    done: list[int] = []
    for i in range(job.steps):
        done.append(await ctx.step(apply_effect, i))
        if i < job.steps - 1:
            await ctx.sleep(job.sleep)
    if job.gate:
        await ctx.wait_for(GATE)
    return done


def step_positions(steps: int) -> list[int]:
    """The positions of the agent's steps in a run's history."""
    return [2 * i for i in range(steps)]


# --- the worker process -----------------------------------------------------------------------


def _trace_seams() -> None:
    """Print ``seam <name>`` before each armed seam's kill decision (see the module doc)."""
    armed = {s for s in os.environ.get("SOJOURN_FAULTS", "").split(",") if s}
    if not armed:
        return
    out = sys.stdout

    def traced(seam: str, _where: str) -> None:
        if seam in armed:
            out.write(f"seam {seam}\n")
            out.flush()

    faults.observe(traced)


async def _serve(url: str, prefix: str, ttl: float, replicas: int) -> None:
    settings = Settings(prefix=prefix, lease_ttl=ttl, replicas=replicas)
    worker = Worker([chaos], nats=url, settings=settings)
    await worker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print(f"ready {os.getpid()}", flush=True)
    await stop.wait()
    await worker.stop()


def main() -> None:
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: python -m bench.chaos_agents NATS_URL PREFIX LEASE_TTL [REPLICAS]")
    url, prefix, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    replicas = int(sys.argv[4]) if len(sys.argv) == 5 else 1
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    # SOJOURN_CHAOS_LOG=DEBUG (or INFO): sojourn's own loggers say more in the workers' logs.
    level = os.environ.get("SOJOURN_CHAOS_LOG", "").upper()
    if level in ("DEBUG", "INFO"):
        logging.getLogger("sojourn").setLevel(level)
    _trace_seams()
    asyncio.run(_serve(url, prefix, ttl, replicas))


if __name__ == "__main__":
    main()
