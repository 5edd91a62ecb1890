"""sojourn.actors.testing: a kit for testing agents, in pytest or any other runner.

``SojournEnv`` starts a deployment for a test (a nats-server, a worker serving the agents, a
client) and always tears it down; ``mock_step`` stands in for a step function, keeping its
calls; ``replay`` checks that today's code still replays recorded histories.
``sojourn.actors.testing.plugin`` is a pytest plugin (registered through the ``pytest11``
entry point, so installed with sojourn) with the fixtures ``sojourn_server``,
``sojourn_agents`` and ``sojourn_env``.

Nothing here imports pytest, and ``import sojourn.actors`` does not import this package.

Example:
    >>> from sojourn.actors.testing import SojournEnv
    >>> async def test_greeter() -> None:                      # doctest: +SKIP
    ...     async with SojournEnv([greeter]) as env:
    ...         run_id = await env.start(greeter, {"name": "Ada"})
    ...         assert await env.result(run_id, type=str) == "Hello, Ada!"
"""

from .env import SojournEnv
from .mocks import StepCall, StepMock, mock_step
from .replay import ReplayFailed, replay

__all__ = ["ReplayFailed", "SojournEnv", "StepCall", "StepMock", "mock_step", "replay"]
