"""Membership and lease cover, pure: who is alive, and whose lease a heartbeat vouches for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.core.membership import Membership
from sojourn.schemas.health import ActiveRun, WorkerBeat, lease_covered
from sojourn.schemas.wire import LeaseHolder

DEAD_AFTER = 1.5


def beat(wid: str = "w1", at: float = 100.0, started: float = 1.0, **kw: object) -> WorkerBeat:
    return WorkerBeat(worker_id=wid, at=at, started_at=started, **kw)  # type: ignore[arg-type]


def test_a_worker_whose_beats_go_on_stays_alive() -> None:
    m = Membership(DEAD_AFTER)
    for i in range(20):
        assert m.observe([(i + 1, beat(at=100.0 + i))], now=i * 1.0) == []
    assert m.alive("w1")


def test_a_worker_whose_beats_stop_dies_once_after_dead_after() -> None:
    m = Membership(DEAD_AFTER)
    m.observe([(7, beat())], now=0.0)
    assert m.observe([(7, beat())], now=1.5) == []  # not yet: strictly more than dead_after
    died = m.observe([(7, beat())], now=1.6)
    assert [b.worker_id for b in died] == ["w1"] and not m.alive("w1")
    assert m.observe([(7, beat())], now=5.0) == []  # reported once
    m.observe([(8, beat(at=110.0))], now=6.0)  # it beats again (SIGCONT): alive again
    assert m.alive("w1")


def test_a_first_look_credits_the_beats_age_but_always_watches_a_third_itself() -> None:
    m = Membership(DEAD_AFTER)
    beats = [(1, beat(at=100.0)), (2, beat("w2", at=90.0)), (3, beat("w3", at=101.4))]
    assert m.observe(beats, now=0.0, wall=101.5) == []  # never dead at first sight
    assert m.alive("w1") and m.alive("w2")
    # w2 (10 s old) and w1 (1.5 s old) were credited 1.0 s: dead 0.5 s later; w3 (0.1 s) not.
    died = m.observe(beats, now=0.51, wall=102.01)
    assert sorted(b.worker_id for b in died) == ["w1", "w2"] and m.alive("w3")


def test_after_a_blind_spell_silence_counts_from_the_resume() -> None:
    m = Membership(DEAD_AFTER)
    m.observe([(1, beat())], now=0.0)
    m.resume(10.0)  # this process could not look from 0 to 10 s (a broker restart)
    assert m.observe([(1, beat())], now=10.1) == [] and m.alive("w1")
    assert [b.worker_id for b in m.observe([(1, beat())], now=11.6)] == ["w1"]


def test_a_restart_under_the_same_id_ends_the_old_incarnation() -> None:
    m = Membership(DEAD_AFTER)
    old = beat(started=1.0, runs=(ActiveRun("r1", "a"),))
    m.observe([(1, old)], now=0.0)
    died = m.observe([(2, beat(started=2.0))], now=0.2)
    assert died == [old] and m.alive("w1")


def test_a_graceful_stop_is_dead_and_a_vanished_beat_too() -> None:
    m = Membership(DEAD_AFTER)
    m.observe([(1, beat()), (2, beat("w2"))], now=0.0)
    died = m.observe([(3, beat(stopped=True)), (2, beat("w2"))], now=0.2)
    assert died == [] and not m.alive("w1")  # stopped: its leases were released
    assert [b.worker_id for b in m.observe([], now=0.3)] == ["w2"]  # its beat expired


def holder(worker: str = "w1", acquired: float = 100.0) -> LeaseHolder:
    return LeaseHolder(owner=f"{worker}.3", worker=worker, acquired_at=acquired)


def test_a_beat_vouches_for_the_runs_it_lists_and_for_leases_taken_after_it() -> None:
    b = beat(at=100.0, runs=(ActiveRun("r1", "a"),))
    assert lease_covered(holder(acquired=50.0), b, "r1")  # listed
    assert not lease_covered(holder(acquired=50.0), b, "r2")  # ended before the beat
    assert lease_covered(holder(acquired=100.5), b, "r2")  # taken after the last beat
    assert not lease_covered(holder("w2", 100.5), b, "r2")  # another worker's lease
    assert not lease_covered(holder(acquired=100.5), beat(stopped=True), "r2")
    assert not lease_covered(holder(), None, "r1")
    released = LeaseHolder(owner=None, worker="w1", acquired_at=100.5)
    assert not lease_covered(released, b, "r1")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.floats(min_value=0.0, max_value=3.0)), min_size=1, max_size=40
    )
)
def test_dead_exactly_when_silent_longer_than_dead_after(steps: list[tuple[bool, float]]) -> None:
    """Random beats and silences: after each look, a worker is alive exactly when its last new
    beat was seen at most ``dead_after`` ago, and each death is reported once per silence."""
    m = Membership(DEAD_AFTER)
    now, seq, changed_at, reported = 0.0, 1, 0.0, 0
    m.observe([(seq, beat())], now=now)
    for beats, gap in steps:
        now += gap
        if beats:
            seq += 1
            changed_at = now
        died = m.observe([(seq, beat())], now=now)
        dead = now - changed_at > DEAD_AFTER
        assert m.alive("w1") is not dead
        reported += len(died)
        assert len(died) <= 1
        if died:
            assert dead
    deaths = 0  # count silences longer than dead_after, replayed
    now, changed_at, was_dead = 0.0, 0.0, False
    for beats, gap in steps:
        now += gap
        if beats:
            changed_at, was_dead = now, False
        if now - changed_at > DEAD_AFTER and not was_dead:
            deaths, was_dead = deaths + 1, True
    assert reported == deaths


# --- asking after a late worker's connection (``overdue``, ``condemn``) ------------------------

ASK = 0.375


def test_a_late_worker_that_answers_is_asked_after_once_per_silence() -> None:
    m = Membership(DEAD_AFTER)
    m.observe([(1, beat(answers=True))], now=0.0)
    assert m.overdue(0.3, ASK) == []  # not late yet
    assert [b.worker_id for b in m.overdue(0.4, ASK)] == ["w1"]
    assert m.overdue(0.5, ASK) == []  # asked already: not again in the same silence
    m.observe([(2, beat(at=101.0, answers=True))], now=0.6)  # it beat again
    assert m.overdue(0.9, ASK) == [] and len(m.overdue(1.0, ASK)) == 1


def test_a_worker_that_does_not_answer_or_is_dead_is_never_asked_after() -> None:
    m = Membership(DEAD_AFTER)
    m.observe([(1, beat()), (2, beat("w2", answers=True, stopped=True))], now=0.0)
    assert m.overdue(1.0, ASK) == []  # w1 answers nothing (an older worker); w2 stopped


def test_a_condemned_worker_is_dead_at_once_reported_once_and_alive_again_if_it_beats() -> None:
    m = Membership(DEAD_AFTER)
    held = beat(answers=True, runs=(ActiveRun("r1", "a"),))
    m.observe([(1, held)], now=0.0)
    assert m.holder("r1") == "w1"
    assert m.condemn("w1") == held
    assert not m.alive("w1") and m.holder("r1") is None
    assert m.condemn("w1") is None and m.condemn("nobody") is None
    assert m.observe([(1, held)], now=2.0) == []  # not reported dead a second time
    m.observe([(2, beat(at=103.0, answers=True))], now=2.1)  # its connection came back
    assert m.alive("w1")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.floats(min_value=0.0, max_value=1.0)), min_size=1, max_size=40
    )
)
def test_asked_after_exactly_once_per_silence_longer_than_the_ask_delay(
    steps: list[tuple[bool, float]],
) -> None:
    m = Membership(DEAD_AFTER)
    now, seq, changed_at, asked = 0.0, 1, 0.0, False
    m.observe([(seq, beat(answers=True))], now=now)
    for beats, gap in steps:
        now += gap
        if beats:
            seq, changed_at, asked = seq + 1, now, False
        m.observe([(seq, beat(at=100.0 + seq, answers=True))], now=now)
        late = m.overdue(now, ASK)
        due = m.alive("w1") and not asked and now - changed_at > ASK
        assert len(late) == (1 if due else 0)
        asked = asked or due


def test_an_agent_is_served_elsewhere_while_a_live_other_worker_names_it() -> None:
    m = Membership(DEAD_AFTER)
    assert not m.serving("a")
    m.observe([(1, beat("w1", agents=("a", "b"))), (2, beat("w2", agents=("c",)))], now=0.0)
    assert m.serving("a") and m.serving("c") and not m.serving("d")
    assert not m.serving("a", besides="w1")  # a worker's own beat does not count for it
    assert m.serving("c", besides="w1")
    m.observe(
        [(3, beat("w1", agents=("a", "b"), stopped=True)), (2, beat("w2", agents=("c",)))], now=0.1
    )
    assert not m.serving("a")  # stopped
    assert m.serving("c")
    assert m.condemn("w2") is not None and not m.serving("c")  # its connection is gone
