"""The intake, fuzzed: generated hostile bodies and headers on every inbox subject, against a real
worker on a real nats-server. Each message is answered within one delivery (an acceptance or a
refusal naming its reason), nothing is redelivered, and the worker keeps serving.

Fixed seed and a bounded budget here; ``python -m bench.fuzz --examples 5000`` is the long run.
Hypothesis drives a synchronous test; the worker and the attacker's connection live on an
event loop in a thread of their own (``FuzzTarget``), which ``bench.fuzz`` uses as well.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from sojourn.schemas.wire import REJECT_CODES
from tests.fuzzing import KINDS, FuzzTarget
from tests.hostile import hostile_bodies, hostile_headers


@pytest.fixture
def target(nats_server: EmbeddedServer, settings: Settings) -> Iterator[FuzzTarget]:
    with FuzzTarget(nats_server.url, settings) as t:
        yield t


def test_every_generated_message_is_answered_once(target: FuzzTarget) -> None:
    @settings(
        max_examples=120,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.sampled_from(KINDS), hostile_bodies, hostile_headers)
    def one(kind: str, body: bytes, headers: dict[str, str]) -> None:
        answer = target.send(kind, body, headers)
        if "error" in answer:
            assert answer["error"]["code"] in REJECT_CODES, answer
            assert answer["error"]["message"]
        else:
            assert "run_id" in answer or "schedule" in answer, answer

    one()
    assert target.sent >= 100  # the budget was spent on sending, not on filtering
    target.check_settled()
    assert target.good_start_works()
