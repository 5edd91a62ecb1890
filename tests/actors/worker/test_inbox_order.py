"""The intake hands each run's messages out in the order the inbox stored them, whatever order
a batch brought them in (``InboxLoop._in_run_order``).

Redeliveries come back in the order their ack waits and pauses ran out: a signal handed back
while its run's start was held by a worker that then died can come in the same batch as that
start, ahead of it. Handled first, it would find no run and be handed back for up to 30 s
more, with the run created meanwhile waiting for it (seen in ``python -m bench.chaos``: a
gate signal recorded 26 s after its run parked on it). No server: the batch is built here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg

from sojourn.actors.worker.inbox import InboxLoop
from sojourn.actors.worker.refusals import Refusals
from sojourn.broker.delivery import Delivery
from sojourn.broker.names import Names
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings

SETTINGS = Settings(prefix="t")
NAMES = Names("t")


def _loop() -> InboxLoop:
    refusals = Refusals(cast(Any, SimpleNamespace(user=None)), NAMES, SETTINGS)
    return InboxLoop(cast(Any, SimpleNamespace(refusals=refusals)), SETTINGS)


def _delivery(subject: str, seq: int, data: bytes = b"{}", delivered: int = 1) -> Delivery:
    reply = f"$JS.ACK.T_INBOX.intake.{delivered}.{seq}.{seq}.1796600000000000000.0"
    return Delivery(Msg(_client=cast(Any, None), subject=subject, reply=reply, data=data))


def _stored(runs: int, per_run: list[int], bad: int) -> list[Delivery]:
    """What the inbox stored, in order: each run's start, then its signals and a cancel
    (``per_run[i]`` of them), the runs' messages interleaved, and ``bad`` messages no
    screening accepts (refused at once, they are in no run's order)."""
    pending = [[NAMES.start("a", run_id=f"r{i}")] for i in range(runs)]
    for i, n in enumerate(per_run[:runs]):
        for k in range(n):
            run = f"r{i}"
            pending[i].append(NAMES.cancel(run) if k == n - 1 else NAMES.signal(run, f"s{k}"))
    subjects: list[str] = []
    while any(pending):
        for queue in pending:
            if queue:
                subjects.append(queue.pop(0))
    subjects += [f"t.nonsense.{j}" for j in range(bad)]
    return [_delivery(s, seq) for seq, s in enumerate(subjects, start=1)]


@settings(max_examples=300, deadline=None)
@given(
    runs=st.integers(1, 5),
    per_run=st.lists(st.integers(0, 4), min_size=5, max_size=5),
    bad=st.integers(0, 3),
    data=st.data(),
)
def test_each_runs_messages_go_in_stored_order_in_the_places_the_batch_gave_it(
    runs: int, per_run: list[int], bad: int, data: st.DataObject
) -> None:
    stored = _stored(runs, per_run, bad)
    batch = data.draw(st.permutations(stored))
    loop = _loop()
    out = loop._in_run_order(list(batch))

    assert sorted(id(m) for m, _, _ in out) == sorted(id(m) for m in batch)
    keys = [key for _, _, key in out]
    for place, (m, screened, key) in enumerate(out):
        if m.subject.startswith("t.nonsense."):
            assert key == "" and screened is not None and screened.rejected is not None
            assert batch[place] is m  # a refused message keeps its place
        else:
            assert key == _run_key(m)
    # Each run keeps the places the batch gave it, and its messages fill them in stored order.
    for key in set(keys) - {""}:
        places = [i for i, k in enumerate(keys) if k == key]
        assert places == [i for i, m in enumerate(batch) if _run_key(m) == key]
        seqs = [out[i][0].stream_seq for i in places]
        assert seqs == sorted(seqs)


def _run_key(m: Delivery) -> str:
    parts = m.subject.split(".")
    if parts[1] == "start":
        return f"run:{parts[3]}"
    return "" if parts[1] == "nonsense" else f"run:{parts[2]}"


def test_a_signal_redelivered_ahead_of_its_start_goes_after_it() -> None:
    """The case ``bench.chaos`` met: the start (stored first) and its run's gate signal both
    redelivered many times, the signal ahead of the start in one batch, with another run's
    message between them."""
    start = _delivery(NAMES.start("a", run_id="r33"), 46, delivered=30)
    signal = _delivery(NAMES.signal("r33", "gate"), 47, data=encode(True), delivered=28)
    other = _delivery(NAMES.signal("r7", "go"), 48, data=encode(1))
    out = _loop()._in_run_order([signal, other, start])
    assert [(m.subject, key) for m, _, key in out] == [
        ("t.start.a.r33", "run:r33"),
        ("t.signal.r7.go", "run:r7"),
        ("t.signal.r33.gate", "run:r33"),
    ]
