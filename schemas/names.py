"""Name rules: what a name users type (agent, run id, signal, schedule, user) may be.

Names users type must be single subject tokens: a ``.`` would silently change which subject a
message lands on, and ``*``/``>`` would turn it into a wildcard. Some run id forms are reserved:
only sojourn makes them (a child's, a continued run's, a scheduled fire's). Pure: patterns and
validators, no I/O. The subjects and streams of a deployment are ``sojourn.broker.names.Names``.
"""

from __future__ import annotations

import re

from sojourn.schemas.errors import InvalidName
from sojourn.schemas.flow import DEBOUNCED_RUN_ID

__all__ = [
    "CHAIN_RUN_ID",
    "CHILD_RUN_ID",
    "REPLY_PREFIX",
    "RESERVED_SIGNAL_PREFIX",
    "SCHEDULED_RUN_ID",
    "SCHEDULE_NAME_PATTERN",
    "TOKEN_PATTERN",
    "inbox_prefix",
    "reserved_run_id",
    "user_inboxes",
    "valid_reply_subject",
    "validate_schedule_name",
    "validate_signal_name",
    "validate_token",
]

TOKEN_PATTERN = r"[A-Za-z0-9_-]{1,128}"
_TOKEN = re.compile(TOKEN_PATTERN)

CHILD_RUN_ID = re.compile(r".*-c(0|[1-9][0-9]*)")
"""Run ids of this form are child runs' (``<parent>-c<position>``): only a spawn makes them,
so no client can take a child's id before its parent starts it."""

CHAIN_RUN_ID = re.compile(r".*-g([2-9]|[1-9][0-9]+)")
"""Run ids of this form are the later runs of a continue-as-new chain (``<root>-g<n>``, n >=
2): only ``ctx.continue_as_new`` makes them, so no client can take the next run's id before
the conversation gets there."""


SCHEDULED_RUN_ID = re.compile(r".*-at[0-9]{8}T[0-9]{6}Z(-t[1-9][0-9]*)?")
"""Run ids of this form are started by schedules: ``<schedule>-at<YYYYMMDDTHHMMSS>Z`` (the fire
time in UTC), and ``...Z-t<inbox sequence>`` for a ``trigger``. Only a fire makes them, so no
client can take a fire's run id before it."""

SCHEDULE_NAME_PATTERN = r"[A-Za-z0-9_-]{1,100}"
"""A schedule name: a subject token short enough that its runs' ids (the name and 19 more
characters) are tokens too."""
_SCHEDULE_NAME = re.compile(SCHEDULE_NAME_PATTERN)


def validate_schedule_name(value: object) -> str:
    """Return ``value`` if it may name a schedule, else raise ``InvalidName`` saying why."""
    if not isinstance(value, str) or not _SCHEDULE_NAME.fullmatch(value):
        raise InvalidName(
            f"invalid schedule name {value!r}: use 1-100 characters from A-Z a-z 0-9 _ - "
            "(its runs are named <schedule>-at<time>)"
        )
    return value


def reserved_run_id(run_id: str) -> str | None:
    """Why a trigger may not name ``run_id`` (a form only sojourn itself makes), else ``None``."""
    if CHILD_RUN_ID.fullmatch(run_id):
        return (
            "has the form of a child run's id (<parent>-c<number>), which only a run starting "
            "its child may use"
        )
    if CHAIN_RUN_ID.fullmatch(run_id):
        return (
            "has the form of a continued run's id (<run>-g<number>), which only "
            "ctx.continue_as_new may use"
        )
    if SCHEDULED_RUN_ID.fullmatch(run_id):
        return (
            "has the form of a scheduled run's id (<schedule>-at<YYYYMMDDTHHMMSS>Z), which only "
            "a schedule's fire may use"
        )
    if DEBOUNCED_RUN_ID.fullmatch(run_id):
        return (
            "has the form of a debounced burst's run id (d<20 hex digits>-b<number>), which "
            "only a debounced burst may use"
        )
    return None


RESERVED_SIGNAL_PREFIX = "sojourn-"
"""Signal names sojourn records itself (resume, decisions, child notices) start with this.
They arrive only on control subjects; a signal subject naming one is refused."""

REPLY_PREFIX = "_INBOX"
"""The only subjects the intake answers on: core NATS request/reply inboxes, which can never
name a sojourn subject (every sojourn subject starts with a lower-case prefix)."""

_SIGNAL = re.compile(rf"{TOKEN_PATTERN}(\.{TOKEN_PATTERN})*")
_REPLY = re.compile(rf"{REPLY_PREFIX}(\.{TOKEN_PATTERN})+")
_REPLY_MAX = 256


def inbox_prefix(user: str | None) -> str:
    """The reply inboxes of a connection start with this: ``_INBOX.<user>`` for a connection
    with a user name, ``_INBOX`` for an anonymous one. Every inbox the connection makes (a
    request's reply subject, a PubAck's, a direct get's, a pull request's, the
    ``Sojourn-Reply-To`` the intake answers on) is ``<this>.<tokens>``, so the broker can let
    each user subscribe to its own replies only (``user_inboxes``), and every one of them is
    still an ``_INBOX.`` subject the intake answers on (``valid_reply_subject``).

    An anonymous connection's inboxes are ``_INBOX.<nuid>...``, a nuid being 22 random letters
    and digits: a user name of that shape could in principle equal one, with odds of one in
    62**22 (about 2**131) per name, and anonymous connections exist only where a connection
    may have no user name at all.

    Raises:
        InvalidName: ``user`` is not a subject token.
    """
    if user is None:
        return REPLY_PREFIX
    return f"{REPLY_PREFIX}.{validate_token(user, 'user name')}"


def user_inboxes(user: str) -> str:
    """What ``user`` may subscribe to for its replies, and no other user may:
    ``_INBOX.<user>.>`` (``inbox_prefix``)."""
    return f"{inbox_prefix(user)}.>"


def valid_reply_subject(value: str) -> bool:
    """Whether ``value`` may be answered on: ``_INBOX.<tokens>``, at most 256 characters."""
    return len(value) <= _REPLY_MAX and _REPLY.fullmatch(value) is not None


def validate_signal_name(value: object) -> str:
    """Signal names are dot-separated tokens (``docs.signed``), at most 256 characters."""
    if not isinstance(value, str) or len(value) > 256 or not _SIGNAL.fullmatch(value):
        raise InvalidName(
            f"invalid signal name {value!r}: use dot-separated parts of A-Z a-z 0-9 _ - "
            "(for example 'docs.signed'), at most 256 characters"
        )
    return value


def validate_token(value: object, what: str) -> str:
    """Return ``value`` if it is a valid name token, else raise ``InvalidName`` saying why."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise InvalidName(
            f"invalid {what} {value!r}: use 1-128 characters from A-Z a-z 0-9 _ - "
            "(it becomes one NATS subject token)"
        )
    return value
