"""The gateway's one vocabulary: every problem code, the intake's reject codes included, has
one HTTP status; every code the gateway can answer with is documented in docs/gateway.md."""

from __future__ import annotations

import re

from sojourn.schemas.gateway import GATEWAY_CODES, HTTP_STATUS, problem_title
from sojourn.schemas.wire import REJECT_CODES
from tests.conftest import ROOT


def test_every_code_has_one_status() -> None:
    assert set(HTTP_STATUS) == set(REJECT_CODES) | set(GATEWAY_CODES)
    assert not set(REJECT_CODES) & set(GATEWAY_CODES)
    assert all(400 <= s <= 599 for s in HTTP_STATUS.values())
    assert problem_title("unknown_run") == "Unknown run"


def test_every_code_is_documented() -> None:
    doc = (ROOT / "docs" / "gateway.md").read_text(encoding="utf-8")
    for code, status in HTTP_STATUS.items():
        assert re.search(rf"^\| `{code}` \| {status} \|", doc, re.M), code
