"""Priorities and fairness on the command line (decision 0049): ``sojourn start``'s
``--priority``, ``--fairness-key`` and ``--fairness-weight``."""

from __future__ import annotations

import argparse
from typing import Any

from sojourn.schemas.errors import InvalidName
from sojourn.schemas.fairness import FAIRNESS_WEIGHT_MAX, validate_fairness
from sojourn.schemas.priority import PRIORITIES

from ._common import UsageError

__all__ = ["add_flow_arguments", "flow_options"]


def add_flow_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("priority and fairness")
    g.add_argument(
        "--priority",
        type=int,
        choices=PRIORITIES,
        metavar="1-5",
        help="the run's lane: 1 is the most urgent, 5 bulk (default 3); its wakes and children "
        "keep it",
    )
    g.add_argument(
        "--fairness-key",
        metavar="KEY",
        help="share the workers fairly between keys (a tenant, a user): a burst of one key's "
        "starts does not starve another's",
    )
    g.add_argument(
        "--fairness-weight",
        type=int,
        metavar="W",
        help=f"the key's share against a weight-1 key's (1 to {FAIRNESS_WEIGHT_MAX}, default 1)",
    )


def flow_options(args: argparse.Namespace) -> dict[str, Any]:
    """``priority``, ``fairness_key`` and ``fairness_weight`` for ``Client.trigger`` (only
    those given).

    Raises:
        UsageError: a weight without a key, a bad key or weight.
    """
    options: dict[str, Any] = {}
    if args.priority is not None:
        options["priority"] = args.priority
    key, weight = args.fairness_key, args.fairness_weight
    if weight is not None and key is None:
        raise UsageError("--fairness-weight needs a --fairness-key")
    if key is not None:
        try:
            fairness = validate_fairness(key, 1 if weight is None else weight)
        except (InvalidName, ValueError) as e:
            raise UsageError(f"--fairness-key/--fairness-weight: {e}") from None
        options["fairness_key"] = fairness.key
        options["fairness_weight"] = fairness.weight
    return options
