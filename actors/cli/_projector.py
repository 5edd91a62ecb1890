"""``sojourn projector``: keep the read side (run views, change messages, SQLite model)."""

from __future__ import annotations

import argparse

__all__ = ["cmd_projector"]


async def cmd_projector(args: argparse.Namespace) -> int:
    raise NotImplementedError("sojourn projector is being built")
