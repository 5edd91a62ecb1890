"""``sojourn watch``: follow one run live until it ends."""

from __future__ import annotations

import argparse

__all__ = ["cmd_watch"]


async def cmd_watch(args: argparse.Namespace) -> int:
    raise NotImplementedError("sojourn watch is being built")
