"""``retry_unsettled``: what a cluster between states answers (no answer, 503, no peers to place
a replicated stream on) is retried for ``settle_for`` seconds; every other error, and the last
unsettled one once the time is up, is raised (the CI failure this came from: a chaos run whose
client created its streams while the meta leader still believed a node offline)."""

from __future__ import annotations

import pytest

from sojourn.broker.connection import JetStreamError
from sojourn.broker.topology import retry_unsettled
from sojourn.schemas.errors import BrokerUnavailable, PermissionDenied

NO_PEERS = JetStreamError(
    "$JS.API.STREAM.CREATE.S: no suitable peers for placement, peer offline",
    code=500,
    err_code=10005,
)
NO_RESPONDERS = JetStreamError("no responders", code=503, err_code=0)
SILENCE = BrokerUnavailable("JetStream did not answer in 5.0s")


class Flaky:
    """Raises ``errors`` in turn, then answers ``"done"``; counts the calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


async def test_unsettled_answers_are_retried_until_the_call_succeeds() -> None:
    call = Flaky(NO_PEERS, NO_RESPONDERS, SILENCE)
    assert await retry_unsettled(call, 30.0) == "done"
    assert call.calls == 4


@pytest.mark.parametrize(
    "error",
    [
        JetStreamError("insufficient resources", code=500, err_code=10023),
        JetStreamError("stream name already in use", code=400, err_code=10058),
        PermissionDenied("may not", subject="$JS.API.STREAM.CREATE.S"),
    ],
)
async def test_a_refusal_is_raised_at_once(error: BaseException) -> None:
    call = Flaky(error)
    with pytest.raises(type(error)):
        await retry_unsettled(call, 30.0)
    assert call.calls == 1


async def test_the_last_unsettled_answer_is_raised_when_the_time_is_up() -> None:
    call = Flaky(NO_PEERS, NO_PEERS, NO_PEERS)
    with pytest.raises(JetStreamError) as info:
        await retry_unsettled(call, 0.0)
    assert info.value.err_code == 10005
    assert call.calls == 1
