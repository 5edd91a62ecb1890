"""``sojourn stream``: print a run's output stream, resumable by offset."""

from __future__ import annotations

import argparse

__all__ = ["cmd_stream"]


async def cmd_stream(args: argparse.Namespace) -> int:
    raise NotImplementedError("sojourn stream is being built")
