"""The onboarding agent: days of waiting, no process held, every effect once.

``onboarding`` takes a new hire through five stages, parked between them (a recorded position
plus a wake condition kept by the broker, so workers may come and go, or crash, freely):

1. **A model step.** The model drafts the hire's personal welcome note (``ctx.llm``).
2. **The welcome packet** goes out with the note (a step).
3. **The signature.** The run waits up to three days for ``docs.signed``. After one day
   without it, HR is paged (a step) and the run keeps waiting, to the same three-day
   deadline. Three days unsigned: the run ends with the outcome ``"unsigned"`` (HR, paged on
   day one, owns the case from there; nothing is ordered for someone who has not signed). A
   signature that comes later finds the run ended: start a new one.
4. **An approval.** The hire's manager approves the laptop they asked for
   (``ctx.approval("laptop", ...)``: the signal ``approval.laptop``), within two days; a
   denial, or no answer by then, orders the standard laptop instead.
5. **Provisioning** by a child run, ``it-provision``: an account, then the laptop order.

The run ends with an ``Onboarded``: the outcome, who signed, whether HR was paged, the
laptop, who decided on it, and the model's note. The deadlines are inputs in seconds
(``escalate_after``, ``docs_deadline``, ``approval_deadline``; days by default): give short
ones to watch the escalation in a demo. Tests keep the days and skip time instead
(``tests/actors/testing/test_onboarding_example.py``, with ``sojourn.actors.testing``).

The model is offline by default: a ``ScriptedModel`` that writes the note from the request,
the same every time. Set ``OPENAI_API_KEY`` (OpenAI), or ``SOJOURN_OPENAI_BASE_URL`` for any
OpenAI-compatible server, and ``SOJOURN_OPENAI_MODEL`` (default ``gpt-4o-mini``) to have a
real model write it, as in ``examples/chat.py``.

Effects go to the directory in ``$SOJOURN_ONBOARDING_OUTBOX`` (default: ``sojourn-onboarding``
in the system's temporary directory), one file per effect keyed by the step's idempotency key,
created only if absent: what a real API does with an ``Idempotency-Key`` header.
``effects.log`` records every time a step body runs, so re-executions stay visible.

Try it:

    SOJOURN_ONBOARDING_OUTBOX=/tmp/onb sojourn dev --app examples.onboarding
    sojourn start onboarding --run-id a1 --input '{"name": "Ada", "email": "ada@example.com",
        "manager": "grace", "escalate_after": 30, "docs_deadline": 300}'
    sojourn status a1        # waiting on signal:docs.signed, timer; HR paged after 30 s
    sojourn signal a1 docs.signed --payload '{"by": "ada@example.com"}'
    sojourn status a1        # waiting on signal:approval.laptop, timer (grace was asked)
    sojourn signal a1 approval.laptop --payload '{"approve": true, "by": "grace"}'
    sojourn status a1        # completed (the it-provision child ordered the laptop)
    sojourn history a1

With ``"esign": true`` in the input the welcome packet carries a signing link instead: a
callback URL (``ctx.callback``) on the HTTP gateway (``$SOJOURN_GATEWAY_URL``, default
``http://127.0.0.1:8080``) that the e-signature service POSTs to when the hire has signed; it
delivers ``docs.signed`` to this run, once, and nothing else (docs/gateway.md). The worker
needs the callback keys (``sojourn dev`` makes them; elsewhere ``$SOJOURN_CALLBACK_KEYS``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Literal

import msgspec

from sojourn.actors import Budget, Context, agent, current_step
from sojourn.actors.llm import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    OpenAIChat,
    PriceTable,
    ScriptedModel,
)

OUTBOX_ENV = "SOJOURN_ONBOARDING_OUTBOX"
GATEWAY_ENV = "SOJOURN_GATEWAY_URL"
DAY = 86_400.0
STANDARD_LAPTOP = "standard 14-inch laptop"

PRICES = PriceTable(
    {
        "gpt-4o-mini*": (0.15, 0.60),  # USD per million input / output tokens
        "gpt-4o*": (2.50, 10.00),
        "scripted-onboarding": (0.15, 0.60),  # the offline model, priced like a small one
    }
)


class Hire(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    email: str
    role: str = "engineer"
    manager: str = "manager@example.com"
    """Who approves the laptop (a user name under authentication)."""
    hr_email: str = "hr@example.com"
    laptop: str = "16-inch laptop"
    """The laptop the hire asked for; the manager approves it, or the standard one is ordered."""
    escalate_after: float = 1 * DAY
    """Seconds after the welcome packet without a signature before HR is paged."""
    docs_deadline: float = 3 * DAY
    """Seconds after the welcome packet the hire has to sign; then the run ends unsigned."""
    approval_deadline: float = 2 * DAY
    """Seconds the manager has to decide on the laptop; then the standard one is ordered."""
    esign: bool = False
    """Send a signing link (a callback URL on the HTTP gateway) with the welcome packet."""


class Order(msgspec.Struct, frozen=True, kw_only=True):
    """What the ``it-provision`` child run is asked for."""

    email: str
    laptop: str


class Laptop(msgspec.Struct, frozen=True, kw_only=True):
    email: str
    account: str
    model: str
    asset_tag: str


class Onboarded(msgspec.Struct, frozen=True, kw_only=True):
    email: str
    outcome: Literal["onboarded", "unsigned"]
    """``unsigned``: the docs deadline passed without a signature; nothing was provisioned."""
    signed_by: str | None
    escalated: bool
    """HR was paged (the hire had not signed after ``escalate_after``)."""
    laptop: Laptop | None
    laptop_decided_by: str | None
    """The manager's name, or ``policy`` when the approval's deadline decided."""
    note: str
    """The personal welcome note the model wrote."""


# -- the model ------------------------------------------------------------------------------


def welcome_prompt(hire: Hire) -> list[Message]:
    return [
        Message.system("You write short, warm welcome notes for new hires. Three sentences."),
        Message.user(f"Write a welcome note for {hire.name}, who joins as a {hire.role}."),
    ]


def scripted(request: ModelRequest) -> ModelResponse:
    """The offline model: a note from the request's own words. Deterministic, so the
    example's recorded runs replay."""
    asked = request.messages[-1].content or ""
    who = asked.split(" for ", 1)[-1].split(",", 1)[0] if " for " in asked else "you"
    return ModelResponse(
        text=f"Welcome aboard, {who}! We are glad you are here. Your first week is planned."
    )


def model_from_env() -> Model:
    base_url = os.environ.get("SOJOURN_OPENAI_BASE_URL")
    if base_url or os.environ.get("OPENAI_API_KEY"):
        return OpenAIChat(
            os.environ.get("SOJOURN_OPENAI_MODEL", "gpt-4o-mini"),
            base_url=base_url or "https://api.openai.com/v1",
            prices=PRICES,
        )
    return ScriptedModel(scripted, name="scripted-onboarding", prices=PRICES)


MODEL = model_from_env()


# -- the effects ----------------------------------------------------------------------------


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


def send_welcome_packet(hire: Hire, note: str, signing_link: str | None = None) -> str:
    sign = f"Sign here: {signing_link}\n" if signing_link else "Please sign your docs.\n"
    return effect("welcome", f"To: {hire.email}\n{note}\n{sign}")


def signing_link(token: str) -> str:
    """Where the e-signature service calls back: the gateway's callback URL for ``token``."""
    base = os.environ.get(GATEWAY_ENV) or "http://127.0.0.1:8080"
    return f"{base.rstrip('/')}/v1/callbacks/{token}"


def page_hr(hire: Hire) -> str:
    return effect("escalation", f"To: {hire.hr_email}\n{hire.name} has not signed yet.\n")


def ask_manager(manager: str, approval: str) -> str:
    """The approval's request (``ctx.approval``'s ``remind``): tell the manager what to do."""
    how = f"sojourn signal RUN approval.{approval} --payload '{{\"approve\": true}}'"
    return effect("approval-request", f"To: {manager}\nA laptop to approve: {how}\n")


def create_account(email: str) -> str:
    effect("account", f"account for {email}\n")
    return "acct-" + email.split("@", 1)[0]  # the directory's name for the hire


def order_laptop(email: str, account: str, laptop: str) -> str:
    effect("laptop-order", f"{laptop} for {email} ({account})\n")
    # The vendor's order number: the same for the same order, whichever run placed it.
    return "LT-" + hashlib.sha256(f"{account} {laptop}".encode()).hexdigest()[:8]


# -- the agents -----------------------------------------------------------------------------


@agent("it-provision")
async def it_provision(ctx: Context, order: Order) -> Laptop:
    """The IT sub-agent: an account, then the laptop order."""
    account = await ctx.step(create_account, order.email)
    asset = await ctx.step(order_laptop, order.email, account, order.laptop)
    return Laptop(email=order.email, account=account, model=order.laptop, asset_tag=asset)


@agent("onboarding", budget=Budget(usd=0.05, tokens=20_000))
async def onboarding(ctx: Context, hire: Hire) -> Onboarded:
    note = (await ctx.llm(MODEL, welcome_prompt(hire), max_tokens=200)).text
    link = None
    if hire.esign:
        # Valid a day past the deadline: a late callback is answered (the run has ended).
        link = signing_link(ctx.callback("docs.signed", ttl=hire.docs_deadline + DAY))
    await ctx.step(send_welcome_packet, hire, note, link)

    sent = ctx.now()
    signed = await ctx.wait_for("docs.signed", timeout=hire.escalate_after)
    escalated = signed is None
    if signed is None:
        await ctx.step(page_hr, hire)
        left = sent + timedelta(seconds=hire.docs_deadline) - ctx.now()
        signed = await ctx.wait_for("docs.signed", timeout=max(left, timedelta(0)))
    if signed is None:
        return Onboarded(
            email=hire.email,
            outcome="unsigned",
            signed_by=None,
            escalated=escalated,
            laptop=None,
            laptop_decided_by=None,
            note=note,
        )
    # Who signed, as the signing service reports it in its callback's body: data about the
    # documents, not who sent the signal (that is the history's ``sent_by``; the approval
    # below decides by the sender instead, under authentication).
    by = signed.get("by", "?") if isinstance(signed, dict) else "?"

    decision = await ctx.approval(
        "laptop",
        approvers=[hire.manager],
        timeout=hire.approval_deadline,
        remind=ask_manager,
        on_timeout="deny",
    )
    model = hire.laptop if decision.approved else STANDARD_LAPTOP
    laptop = await ctx.child("it-provision", Order(email=hire.email, laptop=model), type=Laptop)
    return Onboarded(
        email=hire.email,
        outcome="onboarded",
        signed_by=str(by),
        escalated=escalated,
        laptop=laptop,
        laptop_decided_by=decision.by,
        note=note,
    )
