"""Budgets on the command line: the limit flags shared by ``start`` and ``budget``, and the
``budget`` command, which changes a live run's limits (and resumes it if it was suspended for
one of them)."""

from __future__ import annotations

import argparse
from typing import Any

from sojourn.schemas.events import BUDGET_LIMIT_MAX, Budget
from sojourn.schemas.names import validate_token
from sojourn.schemas.vocabulary import BUDGET_LIMITS, SuspendReason

from ..client.client import PendingRun
from ._args import Command, add_run_id
from ._common import EXIT_OK, UsageError, cli_sender, to_run
from ._render import out, public_status, spending

__all__ = ["COMMANDS", "add_budget_arguments", "budget_from_args", "cmd_budget"]

_BUDGET: SuspendReason = "budget"
"""Why a run that used up a limit is suspended."""

_INTEGRAL = {"tokens", "input_tokens", "output_tokens", "steps", "tool_calls", "polls"}
_HELP = {
    "usd": "money: model requests' cost plus ctx.spend, in USD",
    "tokens": "input plus output tokens",
    "input_tokens": "input (prompt) tokens",
    "output_tokens": "output (completion) tokens",
    "steps": "step executions of any kind (each retry counts)",
    "tool_calls": "step executions that are not model requests",
    "polls": "ctx.poll checks",
    "wall_seconds": "seconds since the run started, parked time included",
}


def _limit(unit: str) -> Any:
    def parse(text: str) -> float | int:
        try:
            value: float | int = int(text) if unit in _INTEGRAL else float(text)
        except ValueError:
            kind = "a whole number" if unit in _INTEGRAL else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}") from None
        if not 0 < value <= BUDGET_LIMIT_MAX:
            raise argparse.ArgumentTypeError(f"must be > 0 and <= {BUDGET_LIMIT_MAX:g}")
        return value

    return parse


def add_budget_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """``--usd``, ``--tokens``, ... ``--wall-seconds``: one flag per budget limit."""
    group = p.add_argument_group(f"budget limits ({what})")
    for unit in BUDGET_LIMITS:
        group.add_argument(
            f"--{unit.replace('_', '-')}",
            dest=f"budget_{unit}",
            metavar="N",
            type=_limit(unit),
            default=None,
            help=_HELP[unit],
        )


def budget_from_args(args: argparse.Namespace) -> Budget | None:
    """The limits given on the command line, ``None`` if none was."""
    given = {u: getattr(args, f"budget_{u}") for u in BUDGET_LIMITS}
    limits = {u: v for u, v in given.items() if v is not None}
    return Budget(**limits) if limits else None


async def cmd_budget(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    budget = budget_from_args(args)
    if budget is None:
        raise UsageError("name at least one limit, e.g. `sojourn budget RUN --usd 5`")
    async with to_run(args) as (client, state):
        if isinstance(state, PendingRun):
            raise UsageError(
                f"run {args.run_id} is pending (not started yet): give its budget with "
                "`sojourn start ... --usd N`"
            )
        if state.terminal:
            raise UsageError(f"run {args.run_id} has ended ({public_status(state)})")
        await client.set_budget(args.run_id, budget, by=cli_sender(client))
    used = spending(state)
    parts = []
    for unit in BUDGET_LIMITS:
        limit = getattr(budget, unit)
        if limit is None:
            continue
        spent = used.get(unit)
        parts.append(f"{unit} {limit:g}" + ("" if spent is None else f" (used {spent:g})"))
    out(f"budget change requested for run {args.run_id}: " + ", ".join(parts))
    if state.status == "suspended" and state.suspended_reason == _BUDGET:
        out(f"it was suspended ({state.suspended_detail}); it resumes with the new limits")
    return EXIT_OK


def _arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    add_budget_arguments(p, "the run's new limits")


COMMANDS = (
    Command(
        "budget",
        cmd_budget,
        "Change a run's budget limits; a run suspended for its budget resumes.",
        "sojourn budget 5f0c9e2d --usd 5 --steps 500",
        detail="Each limit given replaces the run's own (the others stay). A run suspended "
        "because it used up a limit resumes at once and checks its new limits at its next "
        "step: if one is still used up it is suspended again, naming it. Needs the admin role "
        "where the deployment authenticates.",
        arguments=_arguments,
    ),
)
