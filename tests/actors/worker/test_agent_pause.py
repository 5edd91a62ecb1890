"""An operator's pause of a whole agent (``sojourn pause --agent``, decision 0039): every live
run of the agent holds at its next step, a new one before its first, across a worker's death
(SIGKILL, real processes), and each goes on where it was on unpause; a bad request touches
nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sojourn.actors import Client
from sojourn.broker import EmbeddedServer
from sojourn.broker import headers as h
from sojourn.broker.follow import read_all
from sojourn.schemas.codec import decode_held_run, encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.events import RunResumed, RunSuspended
from tests.conftest import wait_for
from tests.procs import WorkerProc

APP = "tests.apps.held"


@pytest.fixture
def procs() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for p in started:
        p.kill()


def effects(path: Path) -> Counter[str]:
    """``"<run> <step>"`` -> how many times the step ran."""
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


async def held_by_agent(client: Client, run_id: str) -> bool:
    """Suspended for agent ``held``'s hold and listed for its unpause: the listing is written
    just after the suspension, and an unpause between the two leaves the run to its worker's
    own resume (not counted in the answer's ``resumed``)."""
    try:
        st = await client.state(run_id)
    except RunNotFound:
        return False
    listed = await read_all(
        client.broker, client.names.agents_stream, client.names.held("held", run_id)
    )
    return (
        st.status == "suspended"
        and st.suspended_reason == "manual"
        and "agent held paused by" in (st.suspended_detail or "")
        and [decode_held_run(m.data).released for m in listed] == [False]
    )


async def test_a_paused_agent_holds_its_runs_across_a_sigkill_and_goes_on_when_unpaused(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    procs: list[WorkerProc],
    tmp_path: Path,
) -> None:
    out, gate = tmp_path / "effects", tmp_path / "gate"
    env = {"SOJOURN_TEST_EFFECTS": str(out), "SOJOURN_TEST_GATE": str(gate)}

    async def worker() -> WorkerProc:
        p = await WorkerProc(nats_server.url, settings.prefix, APP, lease_ttl=3.0, **env).ready()
        procs.append(p)
        return p

    async def running_b() -> bool:
        return effects(out)["mid b"] == 1

    first = await worker()
    await client.start("held", True, run_id="mid")
    await wait_for(running_b, timeout=30, what="the gated step running")
    answer = await client.pause_agent("held", "incident 42")
    assert answer.paused and answer.agent == "held"
    assert [(x.agent, x.reason) for x in await client.agent_holds()] == [("held", "incident 42")]
    await worker()  # the standby that takes the run over
    first.kill()  # in the middle of step b: its attempt is in doubt
    await wait_for(lambda: held_by_agent(client, "mid"), timeout=60, what="the run held")
    await client.start("held", False, run_id="new")
    await wait_for(lambda: held_by_agent(client, "new"), timeout=60, what="the new run held")
    gate.touch()
    # Held: the killed step was not run again, and the new run ran nothing.
    assert effects(out) == Counter({"mid a": 1, "mid b": 1})
    st = await client.state("mid")
    assert st.status == "suspended"

    answer = await client.unpause_agent("held")
    assert (answer.paused, answer.resumed) == (False, 2)
    assert await client.agent_holds() == []
    assert await client.result("mid", timeout=60) == ["a", "b", "c"]
    assert await client.result("new", timeout=60) == ["a", "b", "c"]
    assert effects(out) == Counter(
        {"mid a": 1, "mid b": 2, "mid c": 1, "new a": 1, "new b": 1, "new c": 1}
    )
    history = [e for d in await client.history("mid") for e in d.events]
    suspended = [e for e in history if isinstance(e, RunSuspended)]
    assert len(suspended) == 1 and "incident 42" in (suspended[0].detail or "")
    resumed = [e for e in history if isinstance(e, RunResumed)]
    assert len(resumed) == 1 and resumed[0].note == "agent held unpaused"


async def test_an_unpause_of_an_agent_not_held_resumes_nothing_and_a_bad_request_is_refused(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    procs: list[WorkerProc],
    tmp_path: Path,
) -> None:
    env = {"SOJOURN_TEST_EFFECTS": str(tmp_path / "e"), "SOJOURN_TEST_GATE": str(tmp_path / "g")}
    procs.append(
        await WorkerProc(nats_server.url, settings.prefix, APP, lease_ttl=3.0, **env).ready()
    )
    answer = await client.unpause_agent("held")
    assert (answer.paused, answer.resumed) == (False, 0)
    with pytest.raises(ValueError):
        await client.pause_agent("held", "x" * 5000)
    # Raw requests a hostile client could send: each answered with an error, nothing held.
    too_long = encode({"action": "pause", "reason": "x" * 1025})
    bodies = [b"{", b'{"action": "freeze"}', b'{"action": "pause", "by": "eve"}', b"[]", too_long]
    for body in bodies:
        inbox = client.broker.new_inbox()
        sub = await client.broker.subscribe(inbox, max_msgs=1)
        await client.broker.publish(
            client.names.hold_request("held", "eve"), body, {h.REPLY_TO: inbox}
        )
        msg = await sub.next_msg(timeout=30)
        assert b'"error"' in msg.data, msg.data
    assert await client.agent_holds() == []
    # The run of an agent never held is not touched.
    assert await client.result(await client.start("held", False), timeout=60) == ["a", "b", "c"]
