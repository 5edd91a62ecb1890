"""``sojourn runs``: list runs from a projector's read model."""

from __future__ import annotations

import argparse

__all__ = ["cmd_runs"]


async def cmd_runs(args: argparse.Namespace) -> int:
    raise NotImplementedError("sojourn runs is being built")
