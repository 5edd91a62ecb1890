"""Priority lanes in names (decision 0049): every laned subject parses back to what made it,
the inbox's lanes never overlap (it is a work queue: a message is one lane's), and a lane
token anywhere but before a start or spawn is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.broker.names import Names
from sojourn.broker.topology import consumer_configs
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.priority import LANED, PRIORITIES, lane_token, validate_priority

NAMES = Names("sj")
tokens = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
senders = st.none() | tokens
priorities = st.sampled_from(PRIORITIES)


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    if p[-1] == ">":
        return len(s) >= len(p) and all(a in ("*", b) for a, b in zip(p[:-1], s, strict=False))
    return len(p) == len(s) and all(a in ("*", b) for a, b in zip(p, s, strict=True))


def _lane_of(subject: str) -> list[str]:
    """The intake consumers whose filters take ``subject``."""
    return [
        c["durable_name"]
        for stream, c in consumer_configs(NAMES, Settings())
        if stream == NAMES.inbox_stream and any(_matches(f, subject) for f in c["filter_subjects"])
    ]


@settings(max_examples=200, derandomize=True)
@given(agent=tokens, run_id=tokens, sender=senders, priority=priorities)
def test_a_start_parses_back_and_is_taken_by_its_lane_only(
    agent: str, run_id: str, sender: str | None, priority: int
) -> None:
    p = validate_priority(priority)
    for subject in (NAMES.start(agent, sender, run_id, p), NAMES.start(agent, sender, None, p)):
        parsed = NAMES.parse_inbox(subject)
        assert (parsed.kind, parsed.target, parsed.sender, parsed.priority) == (
            "start", agent, sender, p,
        )  # fmt: skip
        assert any(_matches(s, subject) for s in NAMES.inbox_subjects)
        assert _lane_of(subject) == [NAMES.intake_lane_consumer(p)]


@settings(max_examples=100, derandomize=True)
@given(agent=tokens, sender=tokens, priority=priorities)
def test_a_spawn_keeps_its_lane(agent: str, sender: str, priority: int) -> None:
    p = validate_priority(priority)
    subject = NAMES.spawn(agent, sender, p)
    parsed = NAMES.parse_inbox(subject)
    assert (parsed.kind, parsed.target, parsed.priority) == ("spawn", agent, p)
    assert _lane_of(subject) == [NAMES.intake_lane_consumer(p)]


@settings(max_examples=100, derandomize=True)
@given(agent=tokens, run_id=tokens, priority=priorities)
def test_a_wake_goes_to_its_agents_lane_and_parses_back(
    agent: str, run_id: str, priority: int
) -> None:
    p = validate_priority(priority)
    subject = NAMES.wake(run_id, agent, p)
    assert NAMES.parse_wake(subject) == (agent, run_id)
    assert _matches(NAMES.agent_wakes(agent, p), subject)
    assert [q for q in PRIORITIES if _matches(NAMES.agent_wakes(agent, q), subject)] == [p]
    assert sum(_matches(s, subject) for s in NAMES.wake_subjects) == 1


def test_every_other_inbox_message_is_the_default_lanes() -> None:
    for subject in (
        NAMES.signal("r1", "approve"),
        NAMES.cancel("r1", "alice"),
        NAMES.update("r1", "u", "alice"),
        NAMES.hold_request("agent", "admin"),
        NAMES.child_end("r1", "r1-c2", "w"),
    ):
        assert _lane_of(subject) == [NAMES.intake_consumer]


@pytest.mark.parametrize(
    "subject",
    [
        "sj.p3.start.a.r",  # priority 3 has no token: it is the default lane
        "sj.p9.start.a.r",
        "sj.p0.start.a.r",
        "sj.p1.signal.r.x",  # only starts and spawns have a lane
        "sj.as.alice.p1.cancel.r",
        "sj.as.alice.p1",
        "sj.p1",
        "sj.p1.p2.start.a.r",
        "sj.p1.as.alice.start.a.r",  # the lane comes after the sender
    ],
)
def test_a_lane_token_out_of_place_is_refused(subject: str) -> None:
    with pytest.raises(InvalidName):
        NAMES.parse_inbox(subject)
    assert not _lane_of(subject) or subject.startswith("sj.p1.as")


@pytest.mark.parametrize("bad", [0, 6, -1, True, 2.0, "1", None])
def test_a_priority_is_an_int_from_1_to_5(bad: object) -> None:
    with pytest.raises(InvalidName):
        validate_priority(bad)


def test_lane_consumer_names_never_collide_across_agents() -> None:
    # "wake-<agent>" and "wakep<n>-<agent>": no agent name makes one lane's name another's
    agents = ["x", "p1-x", "1-x", "p1", "wakep1-x"]
    made = [NAMES.agent_wake_consumer(a, p) for a in agents for p in PRIORITIES]
    assert len(set(made)) == len(made)
    assert {lane_token(p) for p in LANED} == {"p1", "p2", "p4", "p5"}
