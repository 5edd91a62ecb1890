"""The seed's onboarding agent: weeks of waiting, no process held, every effect once.

``onboarding`` sends a welcome packet, waits for the new hire to sign their documents (three
days in production; seconds in tests, via the input), escalates to HR if they are late,
delegates IT provisioning to a child run (``it-provision``), waits for the hardware to arrive,
and finishes. Between those stages the run is *parked*: a recorded position plus a wake
condition kept by the broker, so workers may come and go (or crash) freely.

Effects go to the directory in ``$SOJOURN_ONBOARDING_OUTBOX`` (default: ``sojourn-onboarding``
in the system's temporary directory), one file per effect keyed by the step's idempotency key,
created only if absent: what a real API does with an ``Idempotency-Key`` header.
``effects.log`` records every time a step body runs, so re-executions stay visible.

Try it:

    SOJOURN_ONBOARDING_OUTBOX=/tmp/onb sojourn dev --app examples.onboarding
    sojourn start onboarding --input '{"name": "Ada", "email": "ada@example.com",
        "docs_deadline": 30, "hr_email": "hr@example.com"}'
    sojourn status RUN                        # waiting on signal:docs.signed, timer
    sojourn signal RUN docs.signed --payload '{"by": "ada@example.com"}'
    sojourn signal RUN hardware.delivered --payload '{"serial": "SN-1"}'

With ``"esign": true`` in the input the welcome packet carries a signing link instead: a
callback URL (``ctx.callback``) on the HTTP gateway (``$SOJOURN_GATEWAY_URL``, default
``http://127.0.0.1:8080``) that the e-signature service POSTs to when the hire has signed; it
delivers ``docs.signed`` to this run, once, and nothing else (docs/gateway.md). The worker
needs the callback keys (``sojourn dev`` makes them; elsewhere ``$SOJOURN_CALLBACK_KEYS``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import msgspec

from sojourn.actors import Context, agent, current_step

OUTBOX_ENV = "SOJOURN_ONBOARDING_OUTBOX"
GATEWAY_ENV = "SOJOURN_GATEWAY_URL"
DAY = 86_400.0


class Hire(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    email: str
    hr_email: str = "hr@example.com"
    docs_deadline: float = 3 * DAY
    """Seconds the hire has to sign before HR is paged."""
    hardware_deadline: float = 14 * DAY
    esign: bool = False
    """Send a signing link (a callback URL on the HTTP gateway) with the welcome packet."""


class Laptop(msgspec.Struct, frozen=True, kw_only=True):
    email: str
    account: str
    asset_tag: str


class Onboarded(msgspec.Struct, frozen=True, kw_only=True):
    email: str
    signed_by: str
    escalated: bool
    laptop: Laptop
    hardware: dict[str, object] | None


def outbox() -> Path:
    path = Path(os.environ.get(OUTBOX_ENV) or Path(tempfile.gettempdir()) / "sojourn-onboarding")
    path.mkdir(parents=True, exist_ok=True)
    return path


def effect(kind: str, text: str) -> str:
    """Apply an external effect once per idempotency key; log every execution."""
    info = current_step()
    key = info.idempotency_key.replace("/", "_")
    with (outbox() / "effects.log").open("a", encoding="utf-8") as log:
        log.write(f"{kind} {info.idempotency_key} attempt={info.attempt} pid={os.getpid()}\n")
    try:
        with (outbox() / f"{kind}-{key}.txt").open("x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        pass  # already done under this key: the provider deduplicates
    return key


def send_welcome_packet(hire: Hire, signing_link: str | None = None) -> str:
    sign = f"Sign here: {signing_link}\n" if signing_link else "Please sign your docs.\n"
    return effect("welcome", f"To: {hire.email}\nWelcome, {hire.name}! {sign}")


def signing_link(token: str) -> str:
    """Where the e-signature service calls back: the gateway's callback URL for ``token``."""
    base = os.environ.get(GATEWAY_ENV) or "http://127.0.0.1:8080"
    return f"{base.rstrip('/')}/v1/callbacks/{token}"


def page_hr(hire: Hire) -> str:
    return effect("escalation", f"To: {hire.hr_email}\n{hire.name} has not signed yet.\n")


def create_account(email: str) -> str:
    return "acct-" + effect("account", f"account for {email}\n")[-12:]


def order_laptop(email: str, account: str) -> str:
    return "LT-" + effect("laptop-order", f"laptop for {email} ({account})\n")[-8:]


@agent("it-provision")
async def it_provision(ctx: Context, email: str) -> Laptop:
    """The IT sub-agent: an account, then a laptop order."""
    account = await ctx.step(create_account, email)
    asset = await ctx.step(order_laptop, email, account)
    return Laptop(email=email, account=account, asset_tag=asset)


@agent("onboarding")
async def onboarding(ctx: Context, hire: Hire) -> Onboarded:
    if hire.esign:
        # Valid a day past the deadline: HR may still chase the hire after it.
        token = ctx.callback("docs.signed", ttl=hire.docs_deadline + DAY)
        await ctx.step(send_welcome_packet, hire, signing_link(token))
    else:
        await ctx.step(send_welcome_packet, hire)
    signed = await ctx.wait_for("docs.signed", timeout=hire.docs_deadline)
    escalated = signed is None
    if signed is None:
        await ctx.step(page_hr, hire)
        signed = await ctx.wait_for("docs.signed")
    laptop = await ctx.child("it-provision", hire.email, type=Laptop)
    hardware = await ctx.wait_for("hardware.delivered", timeout=hire.hardware_deadline)
    # Who signed, as the signing service reports it in its callback's body: data about the
    # documents, not who sent the signal (that is the history's ``sent_by``; an approval,
    # ``ctx.approval``, decides by the sender instead).
    by = signed.get("by", "?") if isinstance(signed, dict) else "?"
    return Onboarded(
        email=hire.email,
        signed_by=str(by),
        escalated=escalated,
        laptop=laptop,
        hardware=hardware if isinstance(hardware, dict) else None,
    )
