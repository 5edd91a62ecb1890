"""The README's commands and example agent are real: this test runs them."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from sojourn.actors import Agent, Client, Worker
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings

README = Path(__file__).resolve().parent.parent / "README.md"
CI = Path(__file__).resolve().parent.parent / ".ci" / "run"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_first_lines_are_the_two_commands_and_ci_runs_the_test_one() -> None:
    first = blocks("bash")[0].strip().splitlines()
    assert len(first) == 2
    demo, tests = (line.split("#")[0].strip() for line in first)
    assert demo == "pip install -e . && sojourn demo"
    assert tests == "pip install -e '.[test]' && pytest"
    assert README.read_text().index("```bash") < 20  # near the top
    assert tests in CI.read_text().splitlines()


async def test_readme_agent_runs(nats_server: EmbeddedServer, settings: Settings) -> None:
    module = types.ModuleType("readme_example")
    sys.modules["readme_example"] = module
    try:
        exec(compile(blocks("python")[0], str(README), "exec"), module.__dict__)
        greeter = module.__dict__["greeter"]
        assert isinstance(greeter, Agent)
        async with Worker([greeter], nats=nats_server.url, settings=settings):
            async with await Client.connect(nats_server.url, settings=settings) as client:
                run_id = await client.start("greeter", {"name": "Ada", "email": "a@example.com"})
                out = await client.result(run_id, timeout=30)
        assert out == f"sent to a@example.com with key {run_id}/1"
    finally:
        del sys.modules["readme_example"]
