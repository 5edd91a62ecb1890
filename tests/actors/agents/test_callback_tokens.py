"""Callback tokens (``actors/agents/callbacks.py``), pure: what a token lets its holder do, and
nothing more.

Written as an attacker holding one genuine token would probe the verifier: alter it, cut it,
pad it, re-sign claims with a key of their own, send garbage; and as an operator would get a
key file wrong. The token format is checked against an independent reading of the spec (the
MAC is computed here with ``hmac`` directly), so a change to the format fails loudly.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import string
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sojourn.actors import (
    CallbackClaims,
    CallbackKeys,
    CallbackTokenExpired,
    CallbackTokenInvalid,
    InvalidName,
)
from sojourn.actors.agents.callbacks import (
    CALLBACK_KEYS_ENV,
    KEYS_MAX,
    TOKEN_MAX,
    TTL_MAX,
    generate_key_file_text,
)

SECRET_1 = b"s" * 32
SECRET_2 = b"t" * 40
NOW = 1_700_000_000.0
RING = CallbackKeys([("k1", SECRET_1)])
TOKEN = RING.issue("order-7", "payment.settled", 3600, NOW, nonce="0123456789abcdef" * 2)

run_ids = st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True)
signal_parts = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
signals = (
    st.lists(signal_parts, min_size=1, max_size=6)
    .map(".".join)
    .filter(lambda s: not s.startswith("sojourn-"))
)
ttls = st.floats(min_value=1e-3, max_value=TTL_MAX, allow_nan=False)
nows = st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False)
URLSAFE = string.ascii_letters + string.digits + "-_"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(payload: str, *, kid: str = "k1", secret: bytes = SECRET_1) -> str:
    """A token for an arbitrary payload under a real key: what a leaked key (or an older
    issuer sharing it) could produce. The MAC as the format documents it."""
    signed = f"sjc1.{kid}.{payload}"
    mac = hmac.new(secret, signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{b64(mac)}"


def claims_json(**fields: Any) -> str:
    base: dict[str, Any] = {
        "run_id": "order-7",
        "signal": "payment.settled",
        "expires_at": int(NOW) + 3600,
        "nonce": "ab" * 16,
    }
    base.update(fields)
    return b64(json.dumps({k: v for k, v in base.items() if v is not ...}).encode())


def refused(keys: CallbackKeys, token: Any, now: float = NOW) -> None:
    """The token is refused as invalid: that exception and no other (not even expiry)."""
    with pytest.raises(CallbackTokenInvalid) as info:
        keys.verify(token, now)
    assert type(info.value) is CallbackTokenInvalid
    assert info.value.message == "the callback token is not valid"


# --- issue and verify --------------------------------------------------------------------------


@settings(max_examples=200, derandomize=True, deadline=None)
@given(run_ids, signals, ttls, nows)
def test_a_token_verifies_to_what_it_was_issued_for(
    run_id: str, signal: str, ttl: float, now: float
) -> None:
    token = RING.issue(run_id, signal, ttl, now)
    assert len(token) <= TOKEN_MAX
    claims = RING.verify(token, now)
    assert (claims.run_id, claims.signal) == (run_id, signal)
    assert claims.expires_at == math.ceil(now + ttl) and claims.expires_at >= now + ttl
    assert claims.signal_id == f"callback:{claims.nonce}"
    assert len(claims.nonce) == 32 and set(claims.nonce) <= set("0123456789abcdef")


def test_the_token_format_is_the_documented_one() -> None:
    version, kid, payload, _ = TOKEN.split(".")
    assert (version, kid) == ("sjc1", "k1")
    assert json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))) == {
        "run_id": "order-7",
        "signal": "payment.settled",
        "expires_at": int(NOW) + 3600,
        "nonce": "0123456789abcdef" * 2,
    }
    assert "=" not in TOKEN
    assert forge(payload) == TOKEN  # the MAC is HMAC-SHA256 over "sjc1.<kid>.<payload>"
    assert RING.verify(TOKEN, NOW).signal_id == "callback:" + "0123456789abcdef" * 2


def test_every_token_has_its_own_nonce_and_so_its_own_signal_id() -> None:
    a, b = (RING.verify(RING.issue("r", "s", 60, NOW), NOW) for _ in range(2))
    assert a.nonce != b.nonce and a.signal_id != b.signal_id


def test_the_longest_token_fits_the_bound() -> None:
    keys = CallbackKeys([("k" * 32, SECRET_1)])
    signal = ".".join(["x" * 127, "y" * 128])
    token = keys.issue("r" * 128, signal, TTL_MAX, 9_999_999_999.0)
    assert len(token) <= TOKEN_MAX
    assert keys.verify(token, NOW).signal == signal


@pytest.mark.parametrize(
    ("run_id", "signal"),
    [
        ("a.b", "s"),
        ("", "s"),
        ("r" * 129, "s"),
        ("r*", "s"),
        ("r", "sojourn-child.x"),
        ("r", "a..b"),
        ("r", ""),
        ("r", "a b"),
    ],
)
def test_issue_refuses_names_a_signal_could_not_carry(run_id: str, signal: str) -> None:
    with pytest.raises(InvalidName):
        RING.issue(run_id, signal, 60, NOW)


@pytest.mark.parametrize("ttl", [0, -1, 0.0, float("nan"), float("inf"), TTL_MAX + 0.5, True, "60"])
def test_ttl_bounds(ttl: Any) -> None:
    with pytest.raises(ValueError, match="ttl"):
        RING.issue("r", "s", ttl, NOW)


def test_ttl_at_the_bound_is_fine() -> None:
    assert RING.verify(RING.issue("r", "s", TTL_MAX, NOW), NOW).expires_at == NOW + TTL_MAX


@pytest.mark.parametrize("nonce", ["", "0" * 31, "0" * 33, "A" * 32, "g" * 32, "0" * 31 + "\n"])
def test_issue_refuses_a_nonce_that_is_not_32_hex_characters(nonce: str) -> None:
    with pytest.raises(ValueError, match="nonce"):
        RING.issue("r", "s", 60, NOW, nonce=nonce)


@pytest.mark.parametrize("now", [float("nan"), float("inf"), -float("inf"), -1.0, 1e300, True])
def test_issue_refuses_a_time_that_is_no_time(now: float) -> None:
    with pytest.raises(ValueError, match="now"):
        RING.issue("r", "s", 60, now)


# --- expiry ------------------------------------------------------------------------------------


def test_expiry_boundary() -> None:
    expires = int(NOW) + 3600
    assert RING.verify(TOKEN, expires - 0.001).expires_at == expires
    for now in (expires, expires + 0.001, expires + 10**9, float("inf"), float("nan")):
        with pytest.raises(CallbackTokenExpired) as info:
            RING.verify(TOKEN, now)
        assert info.value.code == "token_expired"


@settings(max_examples=100, derandomize=True, deadline=None)
@given(ttls, nows)
def test_a_token_lives_at_least_its_ttl_and_not_a_second_more(ttl: float, now: float) -> None:
    token = RING.issue("r", "s", ttl, now)
    RING.verify(token, now + ttl - min(ttl, 1e-6) / 2)
    with pytest.raises(CallbackTokenExpired):
        RING.verify(token, now + ttl + 1)


def test_an_expired_token_under_a_bad_mac_is_invalid_not_expired() -> None:
    """Expiry is only said of a genuine token: a forger learns nothing from the answer."""
    version, kid, payload, mac = TOKEN.split(".")
    swapped = "A" if mac[0] != "A" else "B"
    refused(RING, f"{version}.{kid}.{payload}.{swapped}{mac[1:]}", now=NOW + 10**6)


def test_the_errors_carry_the_gateway_codes() -> None:
    assert CallbackTokenInvalid.code == "invalid_token"
    assert CallbackTokenExpired.code == "token_expired"


# --- tampering ---------------------------------------------------------------------------------


@settings(max_examples=500, derandomize=True, deadline=None)
@given(st.integers(min_value=0, max_value=len(TOKEN) - 1), st.characters())
@example(len(TOKEN) - 1, "A")
@example(len(TOKEN) - 1, "B")
@example(len(TOKEN) - 1, "C")
@example(len(TOKEN) - 1, "D")
def test_any_single_character_change_is_refused(position: int, char: str) -> None:
    """Including the MAC's last character, whose low bits base64 does not use: the MAC is
    compared as the text that was written, not as the bytes it decodes to."""
    if TOKEN[position] == char:
        char = "A" if char != "A" else "B"
    refused(RING, TOKEN[:position] + char + TOKEN[position + 1 :])


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.integers(min_value=0, max_value=len(TOKEN)), st.sampled_from(URLSAFE + "."))
def test_a_character_inserted_or_removed_is_refused(position: int, char: str) -> None:
    refused(RING, TOKEN[:position] + char + TOKEN[position:])
    if position < len(TOKEN):
        refused(RING, TOKEN[:position] + TOKEN[position + 1 :])


def test_a_token_signed_by_a_key_not_in_the_ring_is_refused() -> None:
    same_kid_other_secret = CallbackKeys([("k1", b"x" * 32)])
    other_kid = CallbackKeys([("k9", SECRET_1)])
    refused(same_kid_other_secret, TOKEN)
    refused(other_kid, TOKEN)  # the same secret under another id is another key
    attacker = CallbackKeys([("k1", b"evil" * 8)])
    refused(RING, attacker.issue("order-7", "payment.settled", 60, NOW))


def test_a_token_moved_to_another_run_is_refused() -> None:
    _, kid, _, mac = TOKEN.split(".")
    other = claims_json(run_id="order-8", nonce="0123456789abcdef" * 2)
    refused(RING, f"sjc1.{kid}.{other}.{mac}")


def test_a_token_of_another_version_is_refused() -> None:
    refused(RING, "sjc2" + TOKEN[4:])
    refused(RING, "SJC1" + TOKEN[4:])


# --- rotation ----------------------------------------------------------------------------------


def test_rotation_new_key_signs_old_key_still_verifies() -> None:
    rotated = CallbackKeys([("k2", SECRET_2), ("k1", SECRET_1)])
    assert rotated.signing_kid == "k2" and rotated.kids == ("k2", "k1")
    assert rotated.verify(TOKEN, NOW).run_id == "order-7"  # issued before the rotation
    fresh = rotated.issue("order-7", "payment.settled", 60, NOW)
    assert fresh.split(".")[1] == "k2"
    assert rotated.verify(fresh, NOW).run_id == "order-7"
    refused(RING, fresh)  # a ring that does not have k2 yet
    retired = CallbackKeys([("k2", SECRET_2)])
    refused(retired, TOKEN)  # k1 dropped: its tokens are dead
    assert retired.verify(fresh, NOW).run_id == "order-7"


# --- garbage -----------------------------------------------------------------------------------


def test_oversize_tokens_are_refused_before_anything_else() -> None:
    refused(RING, TOKEN + "A" * (TOKEN_MAX - len(TOKEN) + 1))
    refused(RING, "sjc1.k1." + "A" * 10**6 + "." + "A" * 43)
    refused(RING, "x" * (TOKEN_MAX + 1))


@pytest.mark.parametrize("token", [None, b"sjc1.k1.e30.x", 7, ["sjc1"], ""])
def test_not_a_string_is_refused(token: Any) -> None:
    refused(RING, token)


@settings(max_examples=500, derandomize=True, deadline=None)
@given(st.text(max_size=2 * TOKEN_MAX) | st.binary(max_size=64).map(lambda b: b.decode("latin-1")))
def test_garbage_is_only_ever_invalid(text: str) -> None:
    refused(RING, text)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    st.from_regex(r"[A-Za-z0-9_-]{1,32}", fullmatch=True),
    st.text(URLSAFE, min_size=1, max_size=900),
    st.text(URLSAFE, min_size=43, max_size=43),
)
def test_well_shaped_garbage_is_only_ever_invalid(kid: str, payload: str, mac: str) -> None:
    refused(CallbackKeys([(kid, SECRET_1), ("k1", SECRET_2)]), f"sjc1.{kid}.{payload}.{mac}")


@pytest.mark.parametrize(
    "payload",
    [
        claims_json(run_id="a.b"),
        claims_json(run_id="*"),
        claims_json(run_id=""),
        claims_json(run_id="r" * 129),
        claims_json(run_id=7),
        claims_json(signal="sojourn-child.order-7"),
        claims_json(signal="a..b"),
        claims_json(signal="a>"),
        claims_json(nonce="short"),
        claims_json(nonce="AB" * 16),
        claims_json(expires_at="soon"),
        claims_json(expires_at=-1),
        claims_json(expires_at=0),
        claims_json(expires_at=True),
        claims_json(expires_at=10**40),
        claims_json(expires_at=2**53),
        claims_json(extra="field"),
        claims_json(nonce=...),
        b64(b"[]"),
        b64(b"null"),
        b64(b'{"run_id": "order-7"'),
        b64(b"\xff\xfe"),
        "A",  # base64 of no whole byte
        "AAAAA",
    ],
)
def test_bad_claims_under_a_valid_mac_are_refused(payload: str) -> None:
    """A key shared with a buggy issuer (or leaked) must not widen what a token can do: the
    claims are checked as strictly as any input."""
    refused(RING, forge(payload))


def test_good_claims_under_a_valid_mac_are_accepted() -> None:
    """The forging helper is right: the refusals above are about the claims."""
    assert RING.verify(forge(claims_json()), NOW).nonce == "ab" * 16


# --- keyrings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "wrong"),
    [
        ([], "1 to 8 keys"),
        ([(f"k{i}", SECRET_1) for i in range(KEYS_MAX + 1)], "1 to 8 keys"),
        ([("k.1", SECRET_1)], "key 1: a key id"),
        ([("", SECRET_1)], "key 1: a key id"),
        ([("k" * 33, SECRET_1)], "key 1: a key id"),
        ([("k1", SECRET_1), ("k2", b"short")], "key 2: the secret must be at least 32 bytes"),
        ([("k1", "s" * 32)], "key 1: the secret"),
        ([("k1", SECRET_1), ("k1", SECRET_2)], "key 2: the key id is already used by key 1"),
    ],
)
def test_a_keyring_refuses_keys_it_cannot_use(keys: Any, wrong: str) -> None:
    with pytest.raises(ValueError, match=wrong):
        CallbackKeys(keys)


def test_a_keyring_never_shows_its_secrets() -> None:
    assert repr(CallbackKeys([("k2", SECRET_2), ("k1", SECRET_1)])) == (
        "CallbackKeys(kids=('k2', 'k1'))"
    )


# --- key files ---------------------------------------------------------------------------------

GOOD_SECRET = "Zq3-" * 10


def test_a_key_file_parses_with_comments_and_blank_lines() -> None:
    text = (
        f"# rotated 2025-01\n\n  k2   {GOOD_SECRET}  \n# old one, drop after March\n"
        f"k1\t{'y' * 32}\n"
    )
    keys = CallbackKeys.parse(text)
    assert keys.kids == ("k2", "k1")
    token = keys.issue("r", "s", 60, NOW)
    assert forge(token.split(".")[2], kid="k2", secret=GOOD_SECRET.encode()) == token


def test_a_secret_is_its_utf8_text() -> None:
    secret = "é" * 32  # 32 characters, 64 bytes
    keys = CallbackKeys.parse(f"k1 {secret}")
    token = keys.issue("r", "s", 60, NOW)
    assert forge(token.split(".")[2], secret=secret.encode()) == token


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("", "no keys"),
        ("# only a comment\n\n", "no keys"),
        (f"# header\n\n{GOOD_SECRET}\n", "line 3: expected `KID SECRET`"),
        (f"k1 {GOOD_SECRET} trailing\n", "line 1: expected `KID SECRET`"),
        (f"k1 {GOOD_SECRET}\nk2 {GOOD_SECRET[:31]}\n", "line 2: the secret must be at least 32"),
        (f"k.1 {GOOD_SECRET}\n", "line 1: a key id"),
        (f"{GOOD_SECRET} k1\n", "line 1: the secret must be at least 32"),
        (
            f"k1 {GOOD_SECRET}\n\nk1 {GOOD_SECRET}x\n",
            "line 3: the key id is already used by line 1",
        ),
        ("".join(f"k{i} {GOOD_SECRET}\n" for i in range(9)), "1 to 8 keys"),
    ],
)
def test_key_file_errors_name_the_line_and_never_the_secret(text: str, wrong: str) -> None:
    with pytest.raises(ValueError, match=wrong) as info:
        CallbackKeys.parse(text)
    assert GOOD_SECRET[:8] not in str(info.value)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    st.text(URLSAFE + "!@$%^&*", min_size=12, max_size=31),
    st.integers(min_value=0, max_value=5),
    st.sampled_from(["short", "alone", "three", "badkid"]),
)
def test_no_key_file_error_contains_the_secret(secret: str, blanks: int, mistake: str) -> None:
    line = {
        "short": f"k1 {secret}",
        "alone": f"{secret}{secret}",
        "three": f"k1 {secret}{secret} {secret}",
        "badkid": f"{secret}. {secret}{secret}",
    }[mistake]
    with pytest.raises(ValueError) as info:
        CallbackKeys.parse("\n" * blanks + line + "\n")
    message = str(info.value)
    assert f"line {blanks + 1}:" in message
    assert secret not in message


def test_load_prefixes_the_path_and_refuses_what_is_not_a_key_file(tmp_path: Path) -> None:
    good = tmp_path / "keys"
    good.write_text(f"k1 {GOOD_SECRET}\n")
    assert CallbackKeys.load(good).kids == ("k1",)
    bad = tmp_path / "bad"
    bad.write_text(f"k1 {GOOD_SECRET[:20]}\n")
    with pytest.raises(ValueError, match=rf"^{bad}: line 1: the secret") as info:
        CallbackKeys.load(bad)
    assert GOOD_SECRET[:20] not in str(info.value)
    binary = tmp_path / "binary"
    binary.write_bytes(f"k1 {GOOD_SECRET}\nk2 ".encode() + b"\xff" * 40 + b"\n")
    with pytest.raises(ValueError, match=rf"^{binary}: line 2: not UTF-8 text$"):
        CallbackKeys.load(binary)
    huge = tmp_path / "huge"
    huge.write_text("#" * (64 * 1024 + 1))
    with pytest.raises(ValueError, match="at most"):
        CallbackKeys.load(huge)
    with pytest.raises(FileNotFoundError):
        CallbackKeys.load(tmp_path / "missing")


def test_from_env(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(generate_key_file_text("k7"))
    assert CallbackKeys.from_env({}) is None
    assert CallbackKeys.from_env({CALLBACK_KEYS_ENV: ""}) is None
    loaded = CallbackKeys.from_env({CALLBACK_KEYS_ENV: str(path)})
    assert loaded is not None and loaded.kids == ("k7",)
    with pytest.raises(FileNotFoundError):
        CallbackKeys.from_env({CALLBACK_KEYS_ENV: str(tmp_path / "nope")})


def test_generated_key_lines_are_fresh_and_parse() -> None:
    a, b = generate_key_file_text(), generate_key_file_text()
    assert a != b and a.startswith("k1 ") and a.endswith("\n")
    assert CallbackKeys.parse(a + generate_key_file_text("k0")).kids == ("k1", "k0")
    with pytest.raises(ValueError, match="key id"):
        generate_key_file_text("bad kid")


def test_claims_are_a_strict_wire_struct() -> None:
    claims = CallbackClaims(run_id="r", signal="s", expires_at=1, nonce="ab" * 16)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(
            b'{"run_id":"r","signal":"s","expires_at":1,"nonce":"x","y":1}', type=CallbackClaims
        )
    assert msgspec.json.decode(msgspec.json.encode(claims), type=CallbackClaims) == claims
