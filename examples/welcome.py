"""The agent ``sojourn demo`` runs: a sign-up flow whose steps leave files you can count.

``welcome`` takes ``{"name", "email"}`` and runs four steps of about a second each:
``draft_email``, ``send_email`` ("Welcome!"), ``provision_account``, ``send_email`` again
("Your account is ready"). The effects land in the directory named by ``$SOJOURN_DEMO_OUTBOX``
(default: ``sojourn-outbox`` in the system's temporary directory):

- ``<run_id>_<position>.eml``: one file per email, created only if it does not exist yet,
  which is what an email provider does with an ``Idempotency-Key`` header;
- ``accounts/<run_id>_<position>.json``: the account, created the same way;
- ``raw_executions.log``: one line every time a step's function body runs, retries included.

A step that was running when its worker died runs again on the next worker ("in doubt") with
the same ``current_step().idempotency_key``, so the files show each effect exactly once while
``raw_executions.log`` shows the re-execution. Set ``$SOJOURN_DEMO_STEP_SECONDS`` to change
how long a step takes.

Run it yourself: ``SOJOURN_DEMO_OUTBOX=/tmp/outbox sojourn dev --app examples.welcome``, then
``sojourn start welcome --input '{"name": "Ada", "email": "ada@example.com"}' --wait``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

import msgspec

from sojourn.actors import Context, StepInfo, agent, current_step

OUTBOX_ENV = "SOJOURN_DEMO_OUTBOX"
STEP_SECONDS_ENV = "SOJOURN_DEMO_STEP_SECONDS"
RAW_LOG = "raw_executions.log"


class Signup(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    email: str


class Welcomed(msgspec.Struct, frozen=True, kw_only=True):
    welcome_email: str
    account_id: str
    ready_email: str


def outbox() -> Path:
    path = Path(os.environ.get(OUTBOX_ENV) or Path(tempfile.gettempdir()) / "sojourn-outbox")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _pause() -> None:
    time.sleep(float(os.environ.get(STEP_SECONDS_ENV) or 1.0))


def _file_name(info: StepInfo) -> str:
    return info.idempotency_key.replace("/", "_")


def _record_execution() -> StepInfo:
    """Append to the raw log: proof of how often the function body really ran."""
    info = current_step()
    with (outbox() / RAW_LOG).open("a", encoding="utf-8") as f:
        f.write(f"{info.idempotency_key} {info.name} attempt={info.attempt} pid={os.getpid()}\n")
    return info


def _create_once(path: Path, text: str) -> None:
    """Write ``path`` unless it exists: the dedup a provider does on an Idempotency-Key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        pass


def draft_email(name: str) -> str:
    _record_execution()
    _pause()
    return f"Hi {name},\n\nwelcome aboard! We are setting up your account now.\n"


def send_email(to: str, subject: str, body: str) -> str:
    info = _record_execution()
    message_id = f"{_file_name(info)}.eml"
    _create_once(outbox() / message_id, f"To: {to}\nSubject: {subject}\n\n{body}")
    _pause()
    return message_id


def provision_account(email: str) -> str:
    info = _record_execution()
    account_id = "acct-" + hashlib.sha256(info.idempotency_key.encode()).hexdigest()[:8]
    path = outbox() / "accounts" / f"{_file_name(info)}.json"
    _create_once(path, msgspec.json.encode({"id": account_id, "email": email}).decode() + "\n")
    _pause()  # waiting for the provider to confirm: a crash here leaves the step in doubt
    return account_id


@agent("welcome")
async def welcome(ctx: Context, signup: Signup) -> Welcomed:
    """Welcome a new user: two emails and an account, each exactly once."""
    body = await ctx.step(draft_email, signup.name)
    first = await ctx.step(send_email, signup.email, "Welcome!", body)
    account_id = await ctx.step(provision_account, signup.email)
    second = await ctx.step(
        send_email,
        signup.email,
        "Your account is ready",
        f"Hi {signup.name},\n\nyour account {account_id} is ready.\n",
    )
    return Welcomed(welcome_email=first, account_id=account_id, ready_email=second)
