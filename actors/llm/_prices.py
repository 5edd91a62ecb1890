"""What a model request costs: USD per million input and output tokens, per model name.

A ``PriceTable`` maps model names to prices. A key is an exact name (``gpt-4o``) or a glob
(``gpt-4o-mini*``, ``*/llama-3.1-8b*``): an exact match wins, else the longest matching
pattern (the most specific), so ``gpt-4o-mini*`` beats ``gpt-4o*`` for ``gpt-4o-mini-2024``.
Providers answer with dated names (``gpt-4o-2024-08-06``), hence the globs.

A model the table does not know costs 0, and a warning says so once per name: a run's money
budget cannot see it, and silence would hide that.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from sojourn.schemas.codec import decode_json

__all__ = ["Price", "PriceTable"]

log = logging.getLogger("sojourn.llm")

PRICE_MAX = 1e6
"""USD per million tokens: far above any real price, low enough to catch a unit mistake."""

WARNED_MAX = 1024
"""Model names warned about at most (then silently): names come from providers' answers."""


class Price(msgspec.Struct, frozen=True, kw_only=True):
    """USD per million tokens."""

    input: float
    output: float

    def __post_init__(self) -> None:
        for name in ("input", "output"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 <= value <= PRICE_MAX):
                raise ValueError(f"a price's {name} is USD per million tokens, 0 to {PRICE_MAX:g}")


PriceSpec = Price | tuple[float, float] | list[float] | Mapping[str, float]
"""A price as given: ``Price(...)``, ``(input, output)`` or ``{"input": .., "output": ..}``."""


def _price(spec: Any) -> Price:
    if isinstance(spec, Price):
        return spec
    if isinstance(spec, tuple | list) and len(spec) == 2:
        return Price(input=float(spec[0]), output=float(spec[1]))
    if isinstance(spec, Mapping) and set(spec) == {"input", "output"}:
        return Price(input=float(spec["input"]), output=float(spec["output"]))
    raise ValueError(
        f"a price is (input, output) or {{'input': .., 'output': ..}} in USD per million "
        f"tokens, not {spec!r}"
    )


class PriceTable:
    """USD per million input/output tokens per model name (exact, or a glob pattern).

    Example:
        >>> prices = PriceTable({"gpt-4o-mini*": (0.15, 0.60), "gpt-4o*": (2.50, 10.00)})
        >>> round(prices.cost("gpt-4o-mini-2024-07-18", 1000, 500), 6)
        0.00045
    """

    def __init__(self, prices: Mapping[str, PriceSpec] | None = None) -> None:
        self._exact: dict[str, Price] = {}
        self._patterns: list[tuple[str, Price]] = []
        for key, spec in (prices or {}).items():
            if not isinstance(key, str) or not 0 < len(key) <= 200:
                raise ValueError(f"a price table's key is a model name or pattern, not {key!r}")
            price = _price(spec)
            if any(c in key for c in "*?["):
                self._patterns.append((key, price))
            else:
                self._exact[key] = price
        self._patterns.sort(key=lambda kp: -len(kp[0]))
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        """Read a table from a JSON or TOML file (by its suffix) mapping each model name or
        pattern to ``{"input": .., "output": ..}`` (or ``[input, output]``)::

            ["gpt-4o-mini*"]
            input = 0.15
            output = 0.60
        """
        p = Path(path)
        data = p.read_bytes()
        if len(data) > 1024 * 1024:
            raise ValueError(f"{p}: a price table is at most 1 MiB")
        if p.suffix.lower() == ".toml":
            table: Any = tomllib.loads(data.decode())
        else:
            table = decode_json(data)
        if not isinstance(table, dict):
            raise ValueError(f"{p}: a price table maps model names to prices")
        return cls(table)

    def price(self, model: str) -> Price | None:
        """The price of ``model``: its exact entry, else the longest matching pattern's."""
        found = self._exact.get(model)
        if found is not None:
            return found
        for pattern, price in self._patterns:
            if fnmatch.fnmatchcase(model, pattern):
                return price
        return None

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        """USD for a request of ``model``; 0 (with a warning, once per name) if unknown."""
        price = self.price(model)
        if price is None:
            self._warn(model)
            return 0.0
        usd = (input_tokens * price.input + output_tokens * price.output) / 1e6
        return usd if math.isfinite(usd) else 0.0

    def _warn(self, model: str) -> None:
        with self._lock:
            if model in self._warned or len(self._warned) >= WARNED_MAX:
                return
            self._warned.add(model)
        log.warning(
            "no price for model %r: its requests are counted as costing 0 USD (add it to the "
            "price table, see docs/llm.md)",
            model[:200],
        )

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.price(model) is not None

    def __repr__(self) -> str:
        return f"PriceTable({len(self._exact) + len(self._patterns)} entries)"
