"""sojourn.actors.testing: a kit for testing agents, in pytest or any other runner.

``SojournEnv`` starts a deployment for a test (a nats-server, a worker serving the agents, a
client) and always tears it down; ``mock_step`` stands in for a step function (a poll's check
too), ``mock_model`` for an agent's model (a script of ``turn``s) and ``mock_mcp`` for an MCP
server's tools, each keeping its calls; ``replay`` checks that today's code still replays
recorded histories.
``sojourn.actors.testing.plugin`` is a pytest plugin (registered through the ``pytest11``
entry point, so installed with sojourn) with the fixtures ``sojourn_server``,
``sojourn_agents`` and ``sojourn_env``.

Nothing here imports pytest (nor pydantic-ai, until a mock's target is a Pydantic AI
object), and ``import sojourn.actors`` does not import this package.

Example:
    >>> from sojourn.actors.testing import SojournEnv
    >>> async def test_greeter() -> None:                      # doctest: +SKIP
    ...     async with SojournEnv([greeter]) as env:
    ...         run_id = await env.start(greeter, {"name": "Ada"})
    ...         assert await env.result(run_id, type=str) == "Hello, Ada!"
"""

from .clock import VirtualClock
from .env import SojournEnv
from .explorer import CrashExplorationFailed, Exploration, ExploredCrash, Seam
from .mocks import StepCall, StepMock, mock_step
from .models import ModelCall, ModelMock, mock_model, turn
from .replay import ReplayFailed, replay
from .tools import MCPCall, MCPMock, mock_mcp

__all__ = [
    "CrashExplorationFailed",
    "Exploration",
    "ExploredCrash",
    "MCPCall",
    "MCPMock",
    "ModelCall",
    "ModelMock",
    "ReplayFailed",
    "Seam",
    "SojournEnv",
    "StepCall",
    "StepMock",
    "VirtualClock",
    "mock_mcp",
    "mock_model",
    "mock_step",
    "replay",
    "turn",
]
