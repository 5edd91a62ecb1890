"""``sojourn runs`` and ``sojourn watch``: list runs, follow one live."""

from __future__ import annotations

import argparse

__all__ = ["cmd_runs", "cmd_watch"]


async def cmd_runs(args: argparse.Namespace) -> int:
    raise NotImplementedError("sojourn runs is being built")


async def cmd_watch(args: argparse.Namespace) -> int:
    raise NotImplementedError("sojourn watch is being built")
