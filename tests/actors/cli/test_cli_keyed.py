"""``sojourn start --singleton-key`` and ``--debounce`` (decision 0047), as real subprocesses
against the session's nats-server; and the flags' parsing."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from sojourn.actors import Client, Worker
from sojourn.actors.cli._keyed import parse_window
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.actors.cli.test_cli import deployment, sojourn
from tests.apps.keyed import batch, gate

pytestmark = pytest.mark.usefixtures("processes")  # the sojourn CLI in processes of its own


async def test_cli_singleton_and_debounce(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    dep = deployment(nats_server, settings)
    async with Worker([gate, batch], nats=nats_server.url, settings=settings):
        first = await sojourn("start", "gate", "--input", '"a"', "--singleton-key", "k", *dep)
        assert first.rc == 0 and "accepted: new run" in first.out, first
        run_id = first.out.split("run_id: ")[1].split()[0]
        again = await sojourn("start", "gate", "--input", '"b"', "--singleton-key", "k", *dep)
        assert again.rc == 0 and f"run_id: {run_id}" in again.out and "attached" in again.out
        await client.signal(run_id, "go")
        assert await client.result(run_id, timeout=60) == "a"

        # Two commands at once, so both triggers land within the window however slowly a
        # loaded machine starts a process; their order within the burst is the broker's.
        args = ("--debounce", "10s", "--debounce-key", "b", "--debounce-inputs", "all")
        one, two = await asyncio.gather(
            sojourn("start", "batch", "--input", "1", *args, *dep),
            sojourn("start", "batch", "--input", "2", *args, "--wait", *dep),
        )
        assert one.rc == 0 and "debounced" in one.out, one
        assert two.rc == 0, two
        burst = one.out.split("run_id: ")[1].split()[0]
        assert f"run_id: {burst}" in two.out
        assert sorted(json.loads(two.out.split("output: ")[1])) == [1, 2]

        bad = await sojourn("start", "batch", "--input", "1", "--debounce", "0s", *dep)
        assert bad.rc == 2 and "--debounce" in bad.err, bad
        lone = await sojourn("start", "batch", "--input", "1", "--debounce", "1s", *dep)
        assert lone.rc == 2 and "--debounce-key" in lone.err, lone
        empty = await sojourn("start", "gate", "--input", '"x"', "--singleton-key", "", *dep)
        assert empty.rc != 0 and "singleton_key" in empty.err, empty


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("1.5s", 1.5), ("500ms", 0.5), ("2m", 120.0), ("1h30m", 5400.0), ("45", 45.0)],
)
def test_debounce_windows_parse(text: str, seconds: float) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "50ms", "8d", "-1s", "1x", "nan", "1e3", "30 s"])
def test_bad_debounce_windows_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_window(text)
