"""Bearer tokens and the admin-only policy (pure): a token is recognised only whole and only
as ``Bearer``, and is its caller's name; a malformed tokens file names the line and never the
token."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.gateway import BearerTokens, Caller, Policy, parse_actions
from sojourn.schemas.auth import SENDER_PATTERN
from sojourn.schemas.gateway import ADMIN_ACTIONS, GATEWAY_ACTIONS, GATEWAY_ROLES, GatewayRole
from sojourn.schemas.names import TOKEN_PATTERN

CLIENT = "c" * 20
ADMIN = "Admin.Token_~+/=-0123"
TOKENS = BearerTokens.parse(f"# comment\n\n{CLIENT} client\n{ADMIN} admin  # trailing\n")


def test_roles_of_bearer_headers() -> None:
    assert TOKENS.role_of(f"Bearer {CLIENT}") == "client"
    assert TOKENS.role_of(f"bearer {ADMIN}") == "admin"
    assert TOKENS.role_of(f"  Bearer {ADMIN}  ") == "admin"
    for header in (
        None,
        "",
        CLIENT,
        f"Basic {CLIENT}",
        f"Bearer  {CLIENT}",
        f"Bearer {CLIENT} x",
        f"Bearer {CLIENT}c",
        f"Bearer {CLIENT[:-1]}",
        "Bearer " + "c" * 700,
    ):
        assert TOKENS.role_of(header) is None, header
    assert len(TOKENS) == 2 and CLIENT not in repr(TOKENS)


@settings(max_examples=300, derandomize=True)
@given(st.text(max_size=700))
def test_nothing_but_a_known_token_has_a_role(header: str) -> None:
    role = TOKENS.role_of(header)
    assert role is None or header.strip().split()[-1] in (CLIENT, ADMIN)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no tokens"),
        (f"{CLIENT}\n", "line 1: expected TOKEN ROLE"),
        (f"{CLIENT} client alice extra\n", "line 1: expected TOKEN ROLE NAME"),
        ("short client\n", "line 1: a token is 16 to 512"),
        (f"# x\n{CLIENT} worker\n", "line 2: role 'worker'"),
        (f"{CLIENT} client\n{CLIENT} admin\n", "line 2: the same token twice"),
        ("bad\u00e9token-xxxxxxxxxxxx client\n", "line 1: a token is"),
    ],
)
def test_a_malformed_tokens_file_names_the_line_never_the_token(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        BearerTokens.parse(text)
    assert says in str(info.value)
    assert CLIENT not in str(info.value) and "xxxxxxxxxxxx" not in str(info.value)


def test_the_admin_only_policy() -> None:
    assert parse_actions("cancel, signal") == {"cancel", "signal"}
    assert parse_actions("") == frozenset()
    with pytest.raises(ValueError, match="unknown action 'delete'"):
        parse_actions("cancel,delete")
    policy = Policy(parse_actions("cancel"))
    for action in GATEWAY_ACTIONS:
        assert policy.allows("admin", action)
        assert policy.allows("client", action) == (action not in {"cancel", *ADMIN_ACTIONS})
    # What only admins may do over NATS (resume, budgets, terminate) no client token may do.
    assert ADMIN_ACTIONS and all(not Policy().allows("client", a) for a in ADMIN_ACTIONS)
    assert all(Policy().allows("client", a) for a in GATEWAY_ACTIONS if a not in ADMIN_ACTIONS)


ALICE = "alice-token-0123456789"
BOB = "Bob.Token_~+/=-0123456"
NAMED = f"""
# TOKEN ROLE NAME
{ALICE} client alice
{BOB} admin bob   # the admin
{CLIENT} client
{ADMIN} client alice  # alice's second token (a rotation)
"""


def test_a_token_is_its_callers_name_and_role() -> None:
    tokens = BearerTokens.parse(NAMED)
    assert tokens.caller_of(f"Bearer {ALICE}") == Caller("client", "alice")
    assert tokens.caller_of(f"Bearer {BOB}") == Caller("admin", "bob")
    assert tokens.caller_of(f"Bearer {ADMIN}") == Caller("client", "alice")
    # TOKEN ROLE, the older form: no name, sent as the gateway's own NATS user
    assert tokens.caller_of(f"Bearer {CLIENT}") == Caller("client", None)
    assert tokens.caller_of(f"Bearer {ALICE}x") is None and tokens.caller_of(None) is None
    assert tokens.role_of(f"Bearer {BOB}") == "admin"
    assert tokens.names == {"alice", "bob"} and tokens.unnamed == 1 and len(tokens) == 4
    assert not any(t in repr(tokens) for t in (ALICE, BOB, "alice"))


def test_the_callers_name_rule_is_the_senders() -> None:
    assert SENDER_PATTERN == TOKEN_PATTERN


@pytest.mark.parametrize(
    "name",
    [
        "al.ice",  # a dot would change the subject it is sent on
        "*",
        ">",
        "alice*",
        "x" * 129,
        "\u00e9mile",
        "al\u200bice",
        "a/b",
        "a=b",
        "sojourn.as.admin",
    ],
)
def test_a_name_that_is_not_a_token_is_refused_with_its_line_never_quoted(name: str) -> None:
    with pytest.raises(ValueError) as info:
        BearerTokens.parse(f"# comment\n{ALICE} client alice\n\n{BOB} client {name}\n")
    message = str(info.value)
    assert "line 4: a name is 1 to 128 characters of A-Z a-z 0-9 _ -" in message
    assert name not in message and BOB not in message and ALICE not in message


def test_a_name_that_is_a_token_of_the_file_is_refused() -> None:
    """A name is recorded in histories, a token must never be: a token pasted in the NAME
    column (here one that is a valid name too) is refused, on either line's order."""
    for text, line in (
        (f"{ALICE} client {CLIENT}\n{CLIENT} client bob\n", 1),
        (f"{CLIENT} client bob\n# x\n{ALICE} admin {CLIENT}\n", 3),
        (f"{CLIENT} client {CLIENT}\n", 1),
    ):
        with pytest.raises(ValueError) as info:
            BearerTokens.parse(text)
        assert f"line {line}: the name is one of the file's tokens" in str(info.value)
        assert CLIENT not in str(info.value)


_TOKENS = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~+/=-",
    min_size=16,
    max_size=40,
)
_NAMES = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)


@settings(max_examples=200, derandomize=True)
@given(
    st.dictionaries(
        _TOKENS,
        st.tuples(st.sampled_from(GATEWAY_ROLES), st.none() | _NAMES),
        min_size=1,
        max_size=8,
    )
)
def test_every_written_file_reads_back_as_written(
    callers: dict[str, tuple[GatewayRole, str | None]],
) -> None:
    if any(name in callers for _, name in callers.values()):
        return  # a name that is a token is refused (above)
    text = "".join(f"{t} {r}" + (f" {n}" if n else "") + "  # c\n" for t, (r, n) in callers.items())
    tokens = BearerTokens.parse(text)
    for t, (role, name) in callers.items():
        assert tokens.caller_of(f"Bearer {t}") == Caller(role, name)
    assert tokens.names == {n for _, n in callers.values() if n}


SECRET = "S3cret-token-never-shown"
REFUSALS = {
    "tokens line 1: expected TOKEN ROLE NAME",
    "tokens line 1: a name is 1 to 128 characters of A-Z a-z 0-9 _ -",
    "tokens line 1: the name is one of the file's tokens (a name is recorded in histories; "
    "a token must never be)",
}


@settings(max_examples=400, derandomize=True)
@given(st.text(max_size=60).filter(lambda f: f.splitlines() in ([f], [])))
def test_any_third_field_is_a_name_or_refused_with_a_fixed_message(field: str) -> None:
    """Whatever follows ``TOKEN ROLE`` on a line is a caller's name (a subject token), nothing
    (blank, a comment), or a refusal that echoes nothing of the line."""
    try:
        tokens = BearerTokens.parse(f"{SECRET} client {field}\n")
    except ValueError as e:
        assert str(e) in REFUSALS
        return
    caller = tokens.caller_of(f"Bearer {SECRET}")
    assert caller is not None
    words = field.split("#", 1)[0].split()
    assert caller.name == (words[0] if words else None)
    assert caller.name is None or re.fullmatch(SENDER_PATTERN, caller.name)
