"""The crash explorer: an agent's run crashed at every seam it passes, each resumed and checked.

``explore_crashes`` runs the agent once cleanly, counting the seams it passes (the windows of
``actors/worker/faults.py``: after a step's effect before its record, during replay, after the
intake recorded a signal before its wake, after a child's start was published, after
continue-as-new's next run was created, before a wake's ack, ...). Then, for each seam
occurrence, it runs the agent again and, exactly there, kills the worker as a SIGKILL would
(``Worker.kill``: the connection cut, nothing more sent, every task cancelled), starts a fresh
worker, lets it take the run over, and drives the run to its end. Each explored run must end
like the clean one (status and output), run each step's body at most once per idempotency key
(twice for the step the crash hit between its effect and its record, when its policy runs it
again in doubt), and leave the effects the test counts (``effects``) as the clean run did.

Signals the test names (``signals``) are sent whenever a run waits on them, in every run the
same; time is virtual and skipped as in ``SojournEnv.result``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from sojourn.schemas.codec import decode_json
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.vocabulary import is_terminal

from ..agents.agent import Agent
from ..agents.steps import current_step
from ..worker import faults

if TYPE_CHECKING:
    from .env import SojournEnv

__all__ = ["CrashExplorationFailed", "Exploration", "ExploredCrash", "Seam"]

Effects = Callable[[], Mapping[str, int]]
"""The effects the outside world has seen so far, counted by kind (or key)."""


@dataclass(frozen=True, slots=True)
class Seam:
    """One seam occurrence of the clean run: the seam, its occurrence among those of its name,
    and where it was (the step and its position, when the seam can say)."""

    name: str
    nth: int
    where: str

    def __str__(self) -> str:
        at = f" ({self.where})" if self.where else ""
        return f"{self.name} #{self.nth + 1}{at}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run (its chain's last run) ended."""

    status: str
    output: Any = None
    error: str | None = None


@dataclass(slots=True)
class ExploredCrash:
    """One explored run: where it was crashed, how it ended, and what went wrong (if)."""

    seam: Seam
    run_id: str
    reached: bool = False
    outcome: Outcome | None = None
    problems: list[str] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    """The run's events around the crash, one line each, when something went wrong."""


@dataclass(slots=True)
class Exploration:
    """What ``explore_crashes`` did: the clean run's seams and outcome, and each crash."""

    clean: Outcome
    seams: list[Seam]
    crashes: list[ExploredCrash]

    @property
    def explored(self) -> int:
        """Seam occurrences crashed at (reached in their run)."""
        return sum(c.reached for c in self.crashes)

    def summary(self) -> str:
        missed = len(self.crashes) - self.explored
        tail = f"; {missed} not reached again" if missed else ""
        return f"{len(self.seams)} seam occurrences, {self.explored} crashed at{tail}"


class CrashExplorationFailed(AssertionError):
    """A run crashed at a seam did not end like the clean run, or repeated an effect."""

    def __init__(self, exploration: Exploration) -> None:
        self.exploration = exploration
        bad = [c for c in exploration.crashes if c.problems]
        lines = [f"crash exploration: {exploration.summary()}; {len(bad)} failed"]
        for c in bad:
            lines.append(f"- crashed at {c.seam} in run {c.run_id}:")
            lines += [f"    {p}" for p in c.problems]
            if c.history:
                lines.append("    history:")
                lines += [f"      {h}" for h in c.history]
        super().__init__("\n".join(lines))


class _Observer:
    """Counts the seams the process passes and the step bodies that ran (by idempotency
    key); crashes the worker at one seam occurrence, if told."""

    def __init__(self, crash_at: Seam | None, kill: Callable[[], None]) -> None:
        self.seen: list[Seam] = []
        self.counts: Counter[str] = Counter()
        self.ran: Counter[str] = Counter()
        self.crash_at = crash_at
        self.crashed: Seam | None = None
        self.crashed_key: str | None = None
        self._kill = kill

    def __call__(self, seam: str, where: str) -> None:
        key = None
        if seam == "after_step":
            with contextlib.suppress(LookupError):
                key = current_step().idempotency_key
                self.ran[key] += 1
        occurrence = Seam(seam, self.counts[seam], where)
        self.counts[seam] += 1
        self.seen.append(occurrence)
        target = self.crash_at
        if (
            target is not None
            and self.crashed is None
            and (seam, occurrence.nth) == (target.name, target.nth)
        ):
            self.crashed, self.crashed_key = occurrence, key
            self._kill()
            raise asyncio.CancelledError()  # nothing after the seam runs, as after a SIGKILL


async def explore(
    env: SojournEnv,
    agent: Agent[Any, Any] | str,
    input: Any = None,
    *,
    signals: Mapping[str, Any] | None = None,
    effects: Effects | None = None,
    seams: Callable[[Seam], bool] | None = None,
    timeout: float = 60.0,
) -> Exploration:
    """``SojournEnv.explore_crashes``."""
    name = agent.name if isinstance(agent, Agent) else agent
    driver = _Driver(env, dict(signals or {}), effects, timeout)
    clean_obs = _Observer(None, lambda: None)
    _, clean, clean_effects = await driver.run(name, input, clean_obs, "clean")
    chosen = [s for s in clean_obs.seen if seams is None or seams(s)]
    crashes: list[ExploredCrash] = []
    for i, seam in enumerate(chosen):
        obs = _Observer(seam, driver.crash)
        run_id, outcome, seen_effects = await driver.run(name, input, obs, f"crash{i}")
        crash = ExploredCrash(seam, run_id, reached=obs.crashed is not None, outcome=outcome)
        crash.problems = _problems(clean, outcome, clean_effects, seen_effects, obs)
        if crash.problems:
            crash.history = await _history_lines(env, run_id)
        crashes.append(crash)
    result = Exploration(clean, list(clean_obs.seen), crashes)
    if any(c.problems for c in crashes):
        raise CrashExplorationFailed(result)
    return result


def _problems(
    clean: Outcome,
    got: Outcome,
    clean_effects: Counter[str],
    seen_effects: Counter[str],
    obs: _Observer,
) -> list[str]:
    problems = []
    if got != clean:
        problems.append(f"ended {got}, the clean run {clean}")
    for key, n in sorted(obs.ran.items()):
        allowed = 2 if key == obs.crashed_key and _retried_in_doubt(obs) else 1
        if n > allowed:
            problems.append(f"step {key} ran {n} times (at most {allowed})")
    for kind in sorted(set(clean_effects) | set(seen_effects)):
        if clean_effects[kind] != seen_effects[kind]:
            problems.append(
                f"effect {kind!r} happened {seen_effects[kind]} times, the clean run "
                f"{clean_effects[kind]}"
            )
    return problems


def _retried_in_doubt(obs: _Observer) -> bool:
    """Whether the step a crash hit between its effect and its record runs again (its
    in-doubt policy: the default runs it again under the same key)."""
    return obs.crashed is not None and obs.crashed.name == "after_step"


class _Driver:
    """Starts one run, drives it to its end (signals, time, a fresh worker after a crash)."""

    def __init__(
        self, env: SojournEnv, signals: dict[str, Any], effects: Effects | None, timeout: float
    ) -> None:
        self.env = env
        self.signals = signals
        self.effects = effects
        self.timeout = timeout
        self._revival: asyncio.Task[None] | None = None

    def crash(self) -> None:
        """Kill the worker where it stands and start a fresh one in its place at once, as a
        supervisor restarts a killed process: until it is up, nothing consumes what the
        broker delivers (a timer firing, a redelivery), and waiting for quiet then would
        wait forever."""
        worker = self.env.worker
        worker.kill()
        self._revival = asyncio.get_running_loop().create_task(
            self.env._replace_worker(worker), name="sojourn-explorer-revival"
        )

    async def run(
        self, agent: str, input: Any, obs: _Observer, label: str
    ) -> tuple[str, Outcome, Counter[str]]:
        env = self.env
        before = Counter(self.effects()) if self.effects is not None else Counter[str]()
        previous = faults.observe(obs)
        run_id = f"{label}-{env.settings.prefix}"
        try:
            # One bound on all of it: every wait inside (for quiet, for the intake) too.
            async with asyncio.timeout(self.timeout):
                await env.client.start(agent, input, wait=True, run_id=run_id)
                outcome = await self._drive(run_id)
        except TimeoutError as e:
            where = f", crashed at {obs.crashed}" if obs.crashed is not None else ""
            busy = f": {e}" if str(e) else ""  # a wait for quiet says what was busy
            raise TimeoutError(
                f"run {run_id} did not end within {self.timeout:.0f} s{where}{busy}"
            ) from None
        finally:
            faults.observe(previous)
            await self._revive()
        after = Counter(self.effects()) if self.effects is not None else Counter[str]()
        after.subtract(before)
        return run_id, outcome, +after

    async def _drive(self, run_id: str) -> Outcome:
        env = self.env
        sent: set[str] = set()
        current = run_id
        while True:
            await self._revive()
            await env.settle()
            await self._revive()
            try:
                st = await env.state(current)
            except RunNotFound:  # crashed before its first append: its start is redelivered
                await asyncio.sleep(0.05)
                continue
            if is_terminal(st.status):
                if st.continued_as is not None:
                    current = st.continued_as
                    continue
                output = None if st.output is None else decode_json(bytes(st.output))
                error = None if st.error is None else f"{st.error.type}: {st.error.message}"
                return Outcome(st.status, output, error)
            due = self._due(st.waiting_on, sent)
            for n in due:
                await env.signal(current, n, self.signals[n], wait=True)
                sent.add(n)
            if due or await env._skip().jump_next(functools.partial(self._hold, current, sent)):
                continue
            await asyncio.sleep(0.05)  # a takeover or a redelivery, on the real clock

    def _due(self, waiting_on: tuple[str, ...], sent: set[str]) -> list[str]:
        """The signals to send now: those the run waits on, not sent yet."""
        return [n for n in self.signals if n not in sent and f"signal:{n}" in waiting_on]

    async def _hold(self, run_id: str, sent: set[str]) -> bool:
        """Whether, all quiet, the run has ended, waits on a signal to send, or is not waiting
        at all (its takeover after a crash is still to come, on the real clock): then time
        does not move (a deadline passed first would change what the run does)."""
        try:
            st = await self.env.state(run_id)
        except RunNotFound:
            return True  # its start is delivered again (after a crash before it was stored)
        if st.status in ("pending", "running"):
            return True
        return is_terminal(st.status) or bool(self._due(st.waiting_on, sent))

    async def _revive(self) -> None:
        """After a crash: wait until the fresh worker is up in the dead one's place (it takes
        the run over); its start's error, if it failed, is raised here."""
        revival, self._revival = self._revival, None
        if revival is not None:
            await revival


async def _history_lines(env: SojournEnv, run_id: str, last: int = 12) -> list[str]:
    lines = []
    for i, e in enumerate(await env.history(run_id)):
        fields = {
            k: v
            for k, v in msgspec.structs.asdict(e).items()
            if k in ("position", "name", "attempt", "status", "outcome", "reason")
        }
        lines.append(f"{i:3} {type(e).__name__} {fields}")
    return lines[-last:]
