"""The subject parser is the intake's first line of defence: properties over any string."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.broker.names import Names
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.names import (
    CHILD_RUN_ID,
    TOKEN_PATTERN,
    valid_reply_subject,
    validate_signal_name,
    validate_token,
)

NAMES = Names("sojourn")
TOKEN = re.compile(TOKEN_PATTERN)
tokens = st.from_regex(r"\A[A-Za-z0-9_-]{1,20}\Z")
nasty = st.text(
    alphabet=st.sampled_from([*"ab.*> \n\t\r-_$", "\x00", "é"]), min_size=0, max_size=30
)


@given(st.one_of(nasty, st.text(max_size=40)))
@settings(max_examples=500)
def test_a_parsed_subject_names_only_valid_tokens(subject: str) -> None:
    for candidate in (subject, f"sojourn.{subject}", f"sojourn.as.{subject}"):
        try:
            parsed = NAMES.parse_inbox(candidate)
        except InvalidName:
            continue
        assert TOKEN.fullmatch(parsed.target)
        assert parsed.sender is None or TOKEN.fullmatch(parsed.sender)
        if parsed.kind == "signal":
            validate_signal_name(parsed.name)
        # What the intake builds from it never escapes its run's subject.
        if parsed.kind != "start" and parsed.kind != "spawn":
            assert NAMES.events(parsed.target).count(".") == 2
        elif parsed.name:  # a start naming its run id
            assert NAMES.events(parsed.name).count(".") == 2


@given(tokens, tokens, st.lists(tokens, min_size=1, max_size=3))
def test_every_subject_the_client_builds_parses_back(
    sender: str, run: str, parts: list[str]
) -> None:
    name = ".".join(parts)
    for who in (None, sender):
        assert NAMES.parse_inbox(NAMES.start(run, who)).target == run
        got = NAMES.parse_inbox(NAMES.start(run, who, f"{run}-x"))
        assert (got.kind, got.target, got.name, got.sender) == ("start", run, f"{run}-x", who)
        assert NAMES.parse_inbox(NAMES.cancel(run, who)).target == run
        got = NAMES.parse_inbox(NAMES.signal(run, name, who))
        assert (got.kind, got.target, got.name, got.sender) == ("signal", run, name, who)
    assert NAMES.parse_inbox(NAMES.resume(run, sender)).kind == "resume"
    assert NAMES.parse_inbox(NAMES.spawn(run, sender)).kind == "spawn"
    got = NAMES.parse_inbox(NAMES.decide(run, 3, 2, sender))
    assert (got.kind, got.target, got.name) == ("decide", run, "3.2")
    got = NAMES.parse_inbox(NAMES.child_end(run, f"{run}-c1", sender))
    assert (got.kind, got.target, got.name) == ("child", run, f"{run}-c1")


@pytest.mark.parametrize(
    "subject",
    [
        "sojourn.resume.r1",  # control subjects have no anonymous form
        "sojourn.decide.r1.1.1",
        "sojourn.child.p.c",
        "sojourn.spawn.kid",
        "sojourn.as.bob.decide.r1.x.1",
        "sojourn.as.bob.decide.r1.01.1",
        "sojourn.as.b*b.start.g",
        "sojourn.as.start",
        "sojourn.start",
        "sojourn.start.g.v2.x",
        "sojourn.start.g.r*1",
        "sojourn.as.bob.start.g.r.1",
        "sojourn.signal.r1",
        "sojourn.signal.r1.a..b",
        "sojourn.cancel.r1\n",
        "other.start.g",
        "sojourn.ev.r1",
    ],
)
def test_malformed_subjects_are_refused(subject: str) -> None:
    with pytest.raises(InvalidName):
        NAMES.parse_inbox(subject)


def test_every_inbox_subject_pattern_is_captured_by_exactly_one_form() -> None:
    patterns = NAMES.inbox_subjects
    assert len(patterns) == len(set(patterns))
    assert all(p.startswith("sojourn.") for p in patterns)


@given(st.text(max_size=300))
def test_reply_subjects_are_inboxes_only(value: str) -> None:
    if valid_reply_subject(value):
        assert value.startswith("_INBOX.") and len(value) <= 256
        assert all(TOKEN.fullmatch(t) for t in value.split(".")[1:])
        assert not value.startswith("sojourn") and not value.startswith("$")


@pytest.mark.parametrize(
    "value",
    ["_INBOX.abc", "_INBOX.abc.def", "_INBOX.PT7Dw5iAgUPE5XJ1kwnGbq.1"],
)
def test_ordinary_inboxes_are_answered(value: str) -> None:
    assert valid_reply_subject(value)


@pytest.mark.parametrize(
    "value",
    [
        "_INBOX",
        "_INBOX.",
        "_INBOX.a\n",
        "_INBOX.>",
        "_INBOX.*",
        "_INBOX.a b",
        "sojourn.ev.x",
        "$JS.API.STREAM.DELETE.X",
        "_INBOXX.a",
        "_INBOX." + "a" * 250,
    ],
)
def test_everything_else_is_not(value: str) -> None:
    assert not valid_reply_subject(value)


@pytest.mark.parametrize("value", ["abc\n", "a.b", "*", ">", "", "x" * 129, "a b"])
def test_tokens_are_matched_whole(value: str) -> None:
    with pytest.raises(InvalidName):
        validate_token(value, "run_id")


@pytest.mark.parametrize("value", ["p-c0", "p-c12", "a-h0123-c7"])
def test_child_run_ids_are_recognised(value: str) -> None:
    assert CHILD_RUN_ID.fullmatch(value)


@pytest.mark.parametrize("value", ["p-c", "p-c01", "pc1", "p-cx", "r0123"])
def test_other_ids_are_not_child_ids(value: str) -> None:
    assert not CHILD_RUN_ID.fullmatch(value)
