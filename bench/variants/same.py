"""For ``python -m bench.paired``: A and B are the same code, so the difference printed is the
layout's own noise (run it before trusting a difference of the same size)."""

from __future__ import annotations

DESCRIPTION = "A and B the same code (the layout's own noise)"


def toggle(side: str) -> None:
    """Nothing to put in place: both sides run the code as it is."""
