"""A client user that speaks for others (an HTTP gateway's callers, ``AuthUser.speaks_for``):
what it may publish as each name, and nothing more; rendering and the CLI (pure, and the CLI
as a process). The broker enforcing it is tests/actors/gateway/test_gateway_callers.py."""

from __future__ import annotations

import re
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.broker import Names
from sojourn.broker.auth import AuthUser, default_users, permissions_for, render_accounts
from sojourn.schemas.auth import ROLES
from sojourn.schemas.errors import InvalidName
from tests.conftest import PYTHON, ROOT, subprocess_env

NAMES = Names("sj")
_AS = re.compile(r"sj\.as\.([^.]+)\.(.+)")


def senders(publish: tuple[str, ...]) -> dict[str, set[str]]:
    """What each ``as.<sender>`` of an allow list may send: sender -> the subject's rest."""
    out: dict[str, set[str]] = {}
    for subject in publish:
        m = _AS.fullmatch(subject)
        if m:
            out.setdefault(m.group(1), set()).add(m.group(2))
    return out


CLIENT_FORMS = {
    *(f"{lane}start.*" for lane in ("", "p1.", "p2.", "p4.", "p5.")),  # a lane each (0049)
    *(f"{lane}start.*.*" for lane in ("", "p1.", "p2.", "p4.", "p5.")),
    "signal.*.>",
    "update.*.>",
    "cancel.*",
    "schedule.*",
}


def test_a_gateway_may_send_as_its_callers_what_a_client_sends_and_no_control() -> None:
    perms = permissions_for(NAMES, "gw", "client", speaks_for=("bob", "alice"))
    assert perms is not None
    assert senders(perms.publish_allow) == {
        "gw": CLIENT_FORMS,
        "alice": CLIENT_FORMS,
        "bob": CLIENT_FORMS,
    }
    plain = permissions_for(NAMES, "gw", "client")
    assert plain is not None and senders(plain.publish_allow) == {"gw": CLIENT_FORMS}
    # Everything else is the client's, unchanged.
    extra = set(perms.publish_allow) - set(plain.publish_allow)
    assert all(_AS.fullmatch(s) for s in extra)
    assert perms.publish_deny == plain.publish_deny
    # and it hears the intake's answers to what it sends as each of them, in their inboxes
    extra_subs = set(perms.subscribe_allow) - set(plain.subscribe_allow)
    assert extra_subs == {"_INBOX.alice.>", "_INBOX.bob.>"}
    assert set(plain.subscribe_allow) <= set(perms.subscribe_allow)


@settings(max_examples=100, derandomize=True)
@given(st.lists(st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True), max_size=12))
def test_exactly_the_names_given_and_the_user_itself(names: list[str]) -> None:
    perms = permissions_for(NAMES, "gw", "client", speaks_for=names)
    assert perms is not None
    assert set(senders(perms.publish_allow)) == {"gw", *names}
    assert all(forms == CLIENT_FORMS for forms in senders(perms.publish_allow).values())


def test_auth_user_keeps_its_names_sorted_once_without_itself() -> None:
    u = AuthUser("gw", "pw", "client", speaks_for=("bob", "alice", "bob", "gw"))
    assert u.speaks_for == ("alice", "bob")
    assert AuthUser("gw", "pw", "client").speaks_for == ()


@pytest.mark.parametrize("role", [r for r in ROLES if r != "client"])
def test_only_a_client_speaks_for_others(role: str) -> None:
    with pytest.raises(ValueError, match="only a client user"):
        AuthUser("gw", "pw", role, speaks_for=("alice",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only a client user"):
        permissions_for(NAMES, "gw", role, speaks_for=("alice",))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["al.ice", "*", ">", "", "a b", "x" * 129])
def test_a_name_to_speak_for_is_a_token(name: str) -> None:
    with pytest.raises(InvalidName):
        AuthUser("gw", "pw", "client", speaks_for=(name,))
    with pytest.raises(InvalidName):
        permissions_for(NAMES, "gw", "client", speaks_for=(name,))


def test_one_string_is_not_a_list_of_names() -> None:
    with pytest.raises(TypeError, match="a sequence of names, not one string"):
        AuthUser("gw", "pw", "client", speaks_for="alice")  # type: ignore[arg-type]


def test_rendered_with_its_names_and_never_for_a_user_of_its_own() -> None:
    gw = AuthUser("gw", "pw", "client", speaks_for=("alice", "bob"))
    text = render_accounts("sj", [gw, AuthUser("worker", "pw", "worker")])
    assert "# role: client, speaks for alice, bob" in text
    assert '"sj.as.alice.signal.*.>"' in text and '"sj.as.bob.cancel.*"' in text
    assert "sj.as.alice.resume" not in text and "sj.as.alice.decide" not in text
    with pytest.raises(ValueError, match="'gw' may not speak for 'worker'"):
        speaker = AuthUser("gw", "pw", "client", speaks_for=("worker",))
        render_accounts("sj", [speaker, AuthUser("worker", "pw", "worker")])
    clash = [AuthUser("gw", "pw", "client", speaks_for=("admin",)), AuthUser("admin", "p", "admin")]
    with pytest.raises(ValueError, match="that is a user of its own"):
        render_accounts("sj", clash)
    # A user of another deployment's prefix is another identity: no clash.
    other = AuthUser("admin", "p", "admin", prefix="other")
    assert "speaks for admin" in render_accounts("sj", [clash[0], other])


def test_default_users_take_names_for_their_users_only() -> None:
    users = default_users([("gw", "client"), ("worker", "worker")], {"gw": ["alice"]})
    assert [u.speaks_for for u in users] == [("alice",), ()]
    with pytest.raises(ValueError, match="'nobody', which is not one of the users"):
        default_users([("gw", "client")], {"nobody": ["alice"]})


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "sojourn.broker.auth", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.usefixtures("processes")
def test_the_cli_renders_a_gateway_speaking_for_its_callers(processes: None) -> None:
    done = _cli(
        "--prefix",
        "sj",
        "--user",
        "gw:client",
        "--user",
        "worker:worker",
        "--speaks-for",
        "gw=alice,bob",
        "--speaks-for",
        "gw=carol",
    )
    assert done.returncode == 0, done.stderr
    assert "# role: client, speaks for alice, bob, carol" in done.stdout
    assert '"sj.as.carol.start.*"' in done.stdout
    assert "password: $SOJOURN_GW_PASSWORD" in done.stdout
    for args, says in (
        (("--user", "gw:client", "--speaks-for", "gw=al.ice"), "invalid name to speak for"),
        (("--user", "gw:client", "--speaks-for", "gw"), "use USER=NAME[,NAME...]"),
        (("--user", "gw:client", "--speaks-for", "x=alice"), "'x', which is not one of the"),
        (("--user", "gw:worker", "--speaks-for", "gw=alice"), "only a client user"),
        (("--user", "gw:client", "--user", "bob:client", "--speaks-for", "gw=bob"), "its own"),
    ):
        done = _cli(*args)
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
