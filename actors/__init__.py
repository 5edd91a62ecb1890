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

from sojourn.schemas.config import Settings
from sojourn.schemas.errors import ChildRunError, NondeterminismError, StepError

from .agent import Agent, agent
from .client import Client, RunCancelledError, RunFailedError, StartReceipt, TriggerRejected
from .context import ChildHandle, Context, Selected, StepInfo, current_step
from .state import RunState, evolve, fold
from .worker import Worker

__all__ = [
    "Agent",
    "ChildHandle",
    "ChildRunError",
    "Client",
    "Context",
    "NondeterminismError",
    "RunCancelledError",
    "RunFailedError",
    "RunState",
    "Selected",
    "Settings",
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
