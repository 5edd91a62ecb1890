"""``sojourn.actors.testing.replay``: recorded histories as fixtures, replayed by a test.

The histories are the golden ones of tests/golden/ (written by ``python -m tests.golden.record``
from real runs of the examples). A v2 of the README's greeter that sends before composing
diverges at the first step, with both versions named; the same change behind
``ctx.patched`` replays the recorded run on its old branch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import examples.greeter
import examples.onboarding
from examples.greeter import Greeting, compose, send
from sojourn.actors import Agent, Context, agent
from sojourn.actors.testing.replay import ReplayFailed, replay

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
GREETER = GOLDEN / "examples.greeter--completed.json"


async def shout(name: str) -> str:
    return f"HELLO, {name.upper()}!"


@agent("greeter")
async def greeter_v2(ctx: Context, req: Greeting) -> str:
    text = await ctx.step(shout, req.name)  # v2: a different first step
    return await ctx.step(send, req.email, text)


@agent("greeter")
async def greeter_v2_patched(ctx: Context, req: Greeting) -> str:
    if ctx.patched("shout"):
        text = await ctx.step(shout, req.name)
    else:
        text = await ctx.step(compose, req.name)  # the old branch, kept for recorded runs
    return await ctx.step(send, req.email, text)


def test_a_recorded_history_replays_against_the_code_that_made_it() -> None:
    (result,) = replay(examples.greeter, GREETER)
    assert result.ok and result.agent == "greeter" and result.checked == 2


def test_a_changed_step_fails_with_the_file_the_position_and_both_versions_named() -> None:
    with pytest.raises(ReplayFailed) as info:
        replay(greeter_v2, GREETER)
    text = str(info.value)
    assert str(GREETER) in text
    assert "diverges at position 0" in text
    assert "compose" in text and "shout" in text
    assert [p for p, _ in info.value.failures] == [GREETER]


def test_the_same_change_behind_ctx_patched_replays_the_recorded_run() -> None:
    (result,) = replay([greeter_v2_patched], GREETER)
    assert result.ok


def test_a_directory_replays_every_history_below_it(tmp_path: Path) -> None:
    for name in ("examples.greeter--completed.json", "examples.onboarding--escalated.json"):
        shutil.copy(GOLDEN / name, tmp_path / name)
    (tmp_path / "deeper").mkdir()
    shutil.copy(GOLDEN / "examples.onboarding--parked.json", tmp_path / "deeper" / "p.json")
    modules = (examples.greeter, examples.onboarding)
    agents = [v for m in modules for v in vars(m).values() if isinstance(v, Agent)]
    results = replay(agents, tmp_path)
    assert len(results) == 3 and all(r.ok for r in results)


def test_every_bad_file_is_listed_not_only_the_first(tmp_path: Path) -> None:
    shutil.copy(GREETER, tmp_path / "good.json")
    (tmp_path / "junk.json").write_bytes(b"{not json")
    shutil.copy(GOLDEN / "examples.onboarding--escalated.json", tmp_path / "other.json")
    with pytest.raises(ReplayFailed) as info:
        replay(examples.greeter, tmp_path)
    failed = {p.name: what for p, what in info.value.failures}
    assert set(failed) == {"junk.json", "other.json"}
    assert "not a history" in failed["junk.json"]
    assert "agent 'onboarding'" in failed["other.json"] and "greeter" in failed["other.json"]


def test_a_missing_path_or_an_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        replay(examples.greeter, tmp_path / "nowhere.json")
    with pytest.raises(FileNotFoundError):
        replay(examples.greeter, tmp_path)
    with pytest.raises(TypeError):
        replay([object()], GREETER)  # type: ignore[list-item]
