"""Loading the agents of an application module: what ``sojourn dev/worker --app MODULE`` serves.

There is no registry to consult: an app is a plain Python module, and the agents it serves are
its module-level ``Agent`` instances (what ``@agent("name")`` returns). The module is imported
with the current working directory on ``sys.path``, the way ``python -m`` would find it.

Example:
    >>> from sojourn.actors import load_app
    >>> app = load_app("examples.greeter")                                 # doctest: +SKIP
    >>> [a.name for a in app.agents]                                       # doctest: +SKIP
    ['greeter']
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from sojourn.schemas.errors import SojournError

from ..agents.agent import Agent

__all__ = ["App", "AppError", "load_app", "module_name"]


class AppError(SojournError):
    """``--app MODULE`` cannot be imported, or it defines no agent."""


@dataclass(frozen=True, slots=True)
class App:
    """An imported application module and the agents found in it (sorted by name)."""

    module: ModuleType
    agents: tuple[Agent[Any, Any], ...]

    @property
    def name(self) -> str:
        return self.module.__name__

    @property
    def agent_names(self) -> list[str]:
        return [a.name for a in self.agents]


def module_name(spec: str) -> str:
    """The module name for ``spec``: a dotted name as is, or a relative ``path/to/app.py``."""
    spec = spec.strip()
    if spec.endswith(".py"):
        path = Path(spec)
        if path.is_absolute() or ".." in path.parts:
            raise AppError(
                f"--app takes a module name (like myapp.agents), not the path {spec!r}:"
                " run from the directory that contains the package"
            )
        return ".".join(path.with_suffix("").parts)
    return spec


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc`` (the user's code, usually)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({exc.filename}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename]
    if not user:
        return ""
    last = user[-1]
    return f" ({last.filename}:{last.lineno})"


def _import(name: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing == name or name.startswith(missing + "."):
            raise AppError(
                f"cannot import app module '{name}': no module named '{missing}' (looked in "
                f"{cwd} and sys.path; run from the directory that contains it, or set "
                "PYTHONPATH)"
            ) from None
        raise AppError(f"importing app module '{name}' failed: {e}{_where(e)}") from None
    except Exception as e:
        raise AppError(
            f"importing app module '{name}' failed: {type(e).__name__}: {e}{_where(e)}"
        ) from None


def load_app(spec: str) -> App:
    """Import ``spec`` and collect its module-level agents.

    Args:
        spec: a module name (``examples.welcome``), or a relative ``examples/welcome.py``.

    Returns:
        The module and its agents, sorted by name.

    Raises:
        AppError: the module cannot be imported, raised while importing, defines no agent,
            or defines two different agents with the same name.
    """
    name = module_name(spec)
    if not name or any(not part.isidentifier() for part in name.split(".")):
        raise AppError(
            f"--app {spec!r} is not a module name (expected something like myapp.agents)"
        )
    module = _import(name)
    found: dict[str, tuple[str, Agent[Any, Any]]] = {}
    for attr, value in vars(module).items():
        if not isinstance(value, Agent):
            continue
        seen = found.get(value.name)
        if seen is not None and seen[1] is not value:
            raise AppError(
                f"app module '{name}' defines two different agents named "
                f"'{value.name}' ({seen[0]} and {attr})"
            )
        found.setdefault(value.name, (attr, value))
    if not found:
        raise AppError(
            f"app module '{name}' defines no agent: decorate an async function with "
            '@agent("name") (from sojourn.actors) at module level'
        )
    agents = tuple(found[n][1] for n in sorted(found))
    return App(module=module, agents=agents)
