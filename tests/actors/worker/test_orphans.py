"""Whose decision is it: the writer test behind finding a dead worker's runs claimed after its
last beat (``actors/worker/orphans.py``). The scan itself runs against a broker in
test_takeover.py and test_hostile_readers.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.worker.orphans import written_by

# Worker ids as Worker makes them (host-pid-hex) and as users pass them (dots allowed, as in a
# host name); no colon, which only the intake's writer uses.
IDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=30)


def writers(worker_id: str) -> st.SearchStrategy[str]:
    """Every writer the worker signs decisions with: its intake and its activations."""
    return st.one_of(
        st.just(f"intake:{worker_id}"),
        st.integers(min_value=1, max_value=10**12).map(lambda n: f"{worker_id}.{n}"),
    )


@given(IDS.flatmap(lambda w: st.tuples(st.just(w), writers(w))))
def test_a_workers_own_writers_are_its(pair: tuple[str, str]) -> None:
    worker_id, writer = pair
    assert written_by(writer, worker_id)


@given(IDS, IDS.flatmap(lambda w: st.tuples(st.just(w), writers(w))))
def test_no_other_workers_writer_is_taken_for_its(worker_id: str, other: tuple[str, str]) -> None:
    other_id, writer = other
    if other_id != worker_id:
        assert not written_by(writer, worker_id)


def test_writers_that_are_not_a_workers_are_nobodys() -> None:
    for writer in ("", "w", "w.", "w.x", "w.1x", "intake:", "intake:w.1", "client", "w.-1"):
        assert not written_by(writer, "w"), writer
