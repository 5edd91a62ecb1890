"""Bearer tokens and the admin-only policy (pure): a token is recognised only whole and only
as ``Bearer``; a malformed tokens file names the line and never the token."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.gateway import BearerTokens, Policy, parse_actions
from sojourn.schemas.gateway import GATEWAY_ACTIONS

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
        (f"{CLIENT} client extra\n", "line 1: expected TOKEN ROLE"),
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
        assert policy.allows("client", action) == (action != "cancel")
    assert all(Policy().allows("client", a) for a in GATEWAY_ACTIONS)
