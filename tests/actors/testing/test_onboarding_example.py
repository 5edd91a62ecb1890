"""The onboarding example (examples/onboarding.py) tested as its author would, with the kit:
a deployment per test (``sojourn_env``), the run's state read typed, the HR page replaced by
a stand-in (``mock_step``) whose calls say how often HR was paged and under which key."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import examples.onboarding
from examples.onboarding import Hire, it_provision, onboarding
from sojourn.actors import Agent
from sojourn.actors.testing import SojournEnv, mock_step
from tests.conftest import wait_for


@pytest.fixture
def sojourn_agents() -> list[Agent[Any, Any]]:
    return [onboarding, it_provision]


@pytest.fixture(autouse=True)
def outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(examples.onboarding.OUTBOX_ENV, str(tmp_path))
    return tmp_path


async def waiting_on(env: SojournEnv, run_id: str, *what: str) -> None:
    async def check() -> bool:
        state = await env.state(run_id)
        return state.status == "waiting" and set(state.waiting_on) == set(what)

    await wait_for(check, timeout=60, what=f"{run_id} to wait on {what}")


def effects(outbox: Path) -> Counter[str]:
    """How often each effect's step body ran."""
    lines = (outbox / "effects.log").read_text().splitlines()
    return Counter(line.split()[0] for line in lines)


async def test_a_hire_who_signs_in_time_is_onboarded_without_paging_hr(
    sojourn_env: SojournEnv, outbox: Path
) -> None:
    env = sojourn_env
    hire = Hire(name="Ada", email="ada@example.com", docs_deadline=60.0)
    with mock_step(examples.onboarding, "page_hr", returns="paged") as hr:
        run_id = await env.start(onboarding, hire)
        await waiting_on(env, run_id, "signal:docs.signed", "timer")
        await env.signal(run_id, "docs.signed", {"by": "ada@example.com"})
        await waiting_on(env, run_id, "signal:hardware.delivered", "timer")
        await env.signal(run_id, "hardware.delivered", {"serial": "SN-1"})
        done = await env.result(run_id, type=examples.onboarding.Onboarded)
    assert done.signed_by == "ada@example.com" and not done.escalated
    assert done.hardware == {"serial": "SN-1"} and done.laptop.email == "ada@example.com"
    assert hr.calls == []
    assert effects(outbox) == Counter({"welcome": 1, "account": 1, "laptop-order": 1})
    (child,) = (await env.state(run_id)).children
    assert (await env.state(child)).status == "completed"


async def test_a_late_hire_pages_hr_once_then_goes_on_when_they_sign(
    sojourn_env: SojournEnv, outbox: Path
) -> None:
    env = sojourn_env
    hire = Hire(name="Bo", email="bo@example.com", docs_deadline=0.5)
    with mock_step(examples.onboarding, "page_hr", returns="paged") as hr:
        run_id = await env.start(onboarding, hire)
        # The deadline passes: HR is paged, and the run waits for the signature with none.
        await waiting_on(env, run_id, "signal:docs.signed")
        assert (await env.state(run_id)).deadline is None
        await env.signal(run_id, "docs.signed", {"by": "bo@example.com"})
        await waiting_on(env, run_id, "signal:hardware.delivered", "timer")
        await env.signal(run_id, "hardware.delivered", {"serial": "SN-2"})
        done = await env.result(run_id, type=examples.onboarding.Onboarded)
    assert done.escalated and done.signed_by == "bo@example.com"
    ((hired,),) = [c.args for c in hr.calls]
    assert hired == hire
    assert [(c.attempt, c.idempotency_key) for c in hr.calls] == [(1, f"{run_id}/2")]
