"""``sojourn start --priority/--fairness-key/--fairness-weight`` (decision 0049), as real
subprocesses against the session's nats-server: the run records its lane and key; bad values
are usage errors and nothing is published."""

from __future__ import annotations

import pytest

from sojourn.actors import Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunStarted
from sojourn.schemas.fairness import Fairness
from tests.actors.cli.test_cli import deployment, sojourn
from tests.apps.laned import laned

pytestmark = pytest.mark.usefixtures("processes")  # the sojourn CLI in processes of its own


async def test_cli_priority_and_fairness(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    dep = deployment(nats_server, settings)
    async with Worker([laned], nats=nats_server.url, settings=settings):
        flags = ("--priority", "2", "--fairness-key", "tenant:a", "--fairness-weight", "4")
        res = await sojourn("start", "laned", "--input", "0", "--run-id", "c1", *flags, *dep)
        assert res.rc == 0 and "accepted: new run" in res.out, res
        assert await client.result("c1", timeout=30) == 0
        first = (await client.history("c1"))[0].events[0]
        assert isinstance(first, RunStarted)
        assert first.priority == 2 and first.fairness == Fairness(key="tenant:a", weight=4)
        for bad in (
            ("--priority", "0"),
            ("--priority", "6"),
            ("--priority", "x"),
            ("--fairness-weight", "2"),
            ("--fairness-key", "a b"),
            ("--fairness-key", "a", "--fairness-weight", "1001"),
        ):
            res = await sojourn("start", "laned", "--input", "0", "--run-id", "c2", *bad, *dep)
            assert res.rc == 2, (bad, res)
        assert await client.pending("c2") is None
        help_ = await sojourn("start", "--help")
        assert "--priority" in help_.out and "--fairness-key" in help_.out
