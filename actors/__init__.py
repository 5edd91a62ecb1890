"""sojourn.actors: write durable agents and run them.

Example:
    >>> import msgspec
    >>> from sojourn.actors import agent
    >>> class Greeting(msgspec.Struct):
    ...     name: str
    >>> def compose(name: str) -> str:
    ...     return f"Hello, {name}!"
    >>> @agent("greeter")
    ... async def greeter(ctx, req: Greeting) -> str:
    ...     return await ctx.step(compose, req.name)
    >>> greeter.name
    'greeter'
"""

from sojourn.schemas.errors import NondeterminismError, StepError

from .agent import Agent, agent
from .client import Client, RunCancelledError, RunFailedError, StartReceipt, TriggerRejected
from .context import Context, StepInfo, current_step
from .state import RunState, evolve, fold
from .worker import Worker

__all__ = [
    "Agent",
    "Client",
    "Context",
    "NondeterminismError",
    "RunCancelledError",
    "RunFailedError",
    "RunState",
    "StartReceipt",
    "StepError",
    "StepInfo",
    "TriggerRejected",
    "Worker",
    "agent",
    "current_step",
    "evolve",
    "fold",
]
