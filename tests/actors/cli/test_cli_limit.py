"""``sojourn limit``, run as a real subprocess: list, show, set, block and unblock a shared
rate limit (decision 0046); mistakes are one-line errors."""

from __future__ import annotations

import json

import pytest

from sojourn.actors import Client, Limit, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.actors.cli.test_cli import assert_one_line_error, deployment, sojourn
from tests.apps.limited import limited

pytestmark = pytest.mark.usefixtures("processes")


async def test_limit_lists_shows_sets_blocks_and_unblocks(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    dep = deployment(nats_server, settings)
    async with Worker([limited], nats=nats_server.url, settings=settings):
        listed = await sojourn("limit", *dep)
        assert listed.rc == 0, listed.err
        assert listed.out.startswith("api  600/min requests  granted 0, blocks 0")
        assert "declared by intake:" in listed.out
        changed = await sojourn("limit", "api", "--requests", "10/s", "--burst", "3", *dep)
        assert changed.rc == 0, changed.err
        assert "10/s requests, burst 3" in changed.out and "set by " in changed.out
        record = await client.limit("api")
        assert record is not None and record.limit == Limit(requests="10/s", burst=3)
        assert not record.declared
        blocked = await sojourn("limit", "api", "--block", "30", "--json", *dep)
        assert blocked.rc == 0, blocked.err
        body = json.loads(blocked.out)
        assert body["blocks"] == 1 and body["epoch"] == 1 and body["blocked_until"] > 0
        shown = await sojourn("limit", "api", *dep)
        assert "blocked until" in shown.out
        lifted = await sojourn("limit", "api", "--unblock", *dep)
        assert lifted.rc == 0 and "blocked until" not in lifted.out
        unknown = await sojourn("limit", "ghost", "--block", "5", *dep)
        assert_one_line_error(unknown, 1, "ghost")
        missing = await sojourn("limit", "ghost", *dep)
        assert_one_line_error(missing, 1, "no limit 'ghost' is declared")
    bad_rate = await sojourn("limit", "api", "--requests", "5/fortnight", *dep)
    assert bad_rate.rc == 2 and "a rate is text like" in bad_rate.err
    both = await sojourn("limit", "api", "--requests", "1/s", "--unblock", *dep)
    assert_one_line_error(both, 2, "one at a time")
    nameless = await sojourn("limit", "--block", "5", *dep)
    assert_one_line_error(nameless, 2, "name the limit")
