"""Updates: a request to a live run that wants an answer (``client.update``, decision 0042).

The wire body a caller publishes on ``<prefix>[.as.<sender>].update.<run_id>.<name>``
(``UpdateBody``), the answer the gateway and ``sojourn update --json`` give (``UpdateAnswer``),
why an update was refused (``UpdateRejectCode``), the bounds, and the error a caller gets for a
refusal (``UpdateRejectedError``). Pure: nothing here reads the broker.
"""

from __future__ import annotations

import re
import typing
from typing import Any, Literal

import msgspec

from .errors import SojournError

__all__ = [
    "UPDATE_ANSWER_MAX",
    "UPDATE_ID_MAX",
    "UPDATE_MESSAGE_MAX",
    "UPDATE_REJECT_CODES",
    "UpdateAnswer",
    "UpdateBody",
    "UpdateRejectCode",
    "UpdateRejectedError",
    "valid_update_id",
]

UPDATE_ID_MAX = 128
"""Characters of an update id (``Idempotency-Key``): ASCII letters, digits and ``-_.:``."""

UPDATE_ANSWER_MAX = 64 * 1024
"""Bytes of JSON of a handler's answer: a larger one is recorded as the handler's failure
(``PayloadTooLarge``), with the handler's changes standing."""

UPDATE_MESSAGE_MAX = 1024
"""Characters of a rejection's or failure's message, as recorded."""

_UPDATE_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")

UpdateRejectCode = Literal[
    "rejected",
    "failed",
    "unknown_update",
    "run_ended",
    "unknown_run",
    "refused",
    "timeout",
]
"""Why ``client.update`` raised: the validator refused it (``rejected``: nothing changed), the
handler raised (``failed``: its changes stand), the run's code has no handler of that name
where it waits (``unknown_update``), the run ended before deciding it (``run_ended``), no such
run (``unknown_run``), the intake refused the message (``refused``: ``intake_code`` says why),
or no answer within the caller's timeout (``timeout``: the update may still be applied; ask
again with the same id)."""

UPDATE_REJECT_CODES: tuple[UpdateRejectCode, ...] = typing.get_args(UpdateRejectCode)


def valid_update_id(update_id: str) -> bool:
    """Whether ``update_id`` may name an update (what the intake and the gateway accept)."""
    return isinstance(update_id, str) and _UPDATE_ID.fullmatch(update_id) is not None


class UpdateBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an update message carries: its id (a caller's retries send the same one, and the
    run applies it once) and the payload its handler gets (any JSON)."""

    update_id: str
    payload: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))


class UpdateAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """An update's outcome as the gateway answers it and ``sojourn update --json`` prints it:
    ``answer`` (the handler's return value) when ``ok``, else ``code`` and ``message``."""

    run_id: str
    update_id: str
    name: str
    ok: bool
    answer: Any = None
    code: UpdateRejectCode | None = None
    message: str = ""


class UpdateRejectedError(SojournError):
    """``client.update`` did not get an answer: ``code`` (an ``UpdateRejectCode``) says why,
    ``intake_code`` the intake's reject code when it refused the message itself."""

    def __init__(
        self,
        code: UpdateRejectCode,
        message: str,
        *,
        run_id: str | None = None,
        update_id: str | None = None,
        intake_code: str | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}", run_id=run_id)
        self.code: UpdateRejectCode = code
        self.reason = message
        self.update_id = update_id
        self.intake_code = intake_code
