"""Approvals by authenticated identity (docs/guide.md, "Approvals"; docs/operations.md, "Security").

Who decides a ``ctx.approval`` is the signal's sender as the broker authenticated it, where it
does: the intake records whether it did (``SignalReceived.sender_verified``), the wait's
completion copies it, and ``judge`` (pure) decides from it. A decision from someone who is not
the approver asked is refused and journaled (a ``refusal`` value naming the sender) while the
run keeps waiting; without authentication the payload's ``by`` is a claim that stands. The
rule is tested pure, by replaying hand-made and recorded histories, and end to end on a real
nats-server with users: mallory claiming to be alice is refused, alice's decision counts as
hers whatever her payload claims.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors import ApprovalRefused, Client, Context, Worker, agent
from sojourn.actors.agents.patterns import Accepted, judge
from sojourn.actors.core.replay import replay_run
from sojourn.actors.core.state import fold
from sojourn.broker import EmbeddedServer
from sojourn.schemas.auth import Role
from sojourn.schemas.codec import from_raw, to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import (
    RunCompleted,
    RunEvent,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepStarted,
    ValueRecorded,
    WaitCompleted,
    WaitStarted,
)
from tests.actors.cli.test_cli import sojourn
from tests.conftest import wait_for
from tests.deployments import authenticated_server, passwords, serving

# --- the rule, pure ------------------------------------------------------------------------------

names = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
claims = st.one_of(st.none(), st.text(max_size=20))
notes = st.text(max_size=20)


def answer(approve: bool, by: str | None = None, note: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"approve": approve, "note": note}
    if by is not None:
        body["by"] = by
    return body


@given(approver=names, approve=st.booleans(), claim=claims, note=notes, stage=st.integers(0, 5))
def test_an_authenticated_approver_decides_as_itself_whatever_it_claims(
    approver: str, approve: bool, claim: str | None, note: str, stage: int
) -> None:
    verdict = judge(
        answer(approve, claim, note), approver, True, name="n", stage=stage, approver=approver
    )
    assert verdict == Accepted(approve=approve, by=approver, note=note, verified=True)


@given(
    sender=names,
    approver=names,
    allowed=st.frozensets(names, max_size=3),
    claim=claims,
    stage=st.integers(0, 5),
)
def test_an_authenticated_sender_who_may_not_decide_is_refused(
    sender: str, approver: str, allowed: frozenset[str], claim: str | None, stage: int
) -> None:
    verdict = judge(
        answer(True, claim), sender, True, name="n", stage=stage, approver=approver, allowed=allowed
    )
    if sender == approver or sender in allowed:
        assert verdict == Accepted(approve=True, by=sender, note="", verified=True)
    else:
        assert isinstance(verdict, ApprovalRefused)
        assert (verdict.by, verdict.approval, verdict.stage) == (sender, "n", stage)
        assert approver in verdict.reason


def test_claiming_to_be_the_approver_is_refused_and_so_is_a_malformed_answer() -> None:
    kw: dict[str, Any] = {"name": "deploy", "stage": 0, "approver": "alice"}
    refused = judge(answer(True, "alice"), "mallory", True, **kw)
    assert refused == ApprovalRefused(
        by="mallory", approval="deploy", stage=0, reason="not the approver asked (alice)"
    )
    assert isinstance(judge({"approve": "yes"}, "mallory", True, **kw), ApprovalRefused)
    assert judge({"approve": "yes"}, "alice", True, **kw) is None  # the approver's: ignored
    # After an escalation only the approver asked now decides, unless ``allowed``.
    esc: dict[str, Any] = {"name": "deploy", "stage": 1, "approver": "bob"}
    assert isinstance(judge(answer(True), "alice", True, **esc), ApprovalRefused)
    assert judge(answer(True), "alice", True, allowed={"alice"}, **esc) == Accepted(
        approve=True, by="alice", note="", verified=True
    )


@given(sender=st.one_of(st.none(), names), claim=claims, approve=st.booleans(), note=notes)
def test_without_authentication_the_claim_stands(
    sender: str | None, claim: str | None, approve: bool, note: str
) -> None:
    # Nobody is checked against the approvers: anyone may claim to be anyone.
    verdict = judge(answer(approve, claim, note), sender, False, name="n", stage=0, approver="a")
    by = claim or sender  # an empty claim is none
    if by is None:
        assert verdict is None  # nobody named: ignored, as a malformed answer
    else:
        assert verdict == Accepted(approve=approve, by=by, note=note, verified=False)
    # ``True`` without a sender (the anonymous form) is no authentication either.
    assert judge(answer(approve, claim, note), None, True, name="n", stage=0, approver="a") == (
        None if not claim else Accepted(approve=approve, by=claim, note=note, verified=False)
    )


@given(sender=st.one_of(st.none(), names), claim=claims, approve=st.booleans())
def test_histories_from_before_are_judged_as_then(
    sender: str | None, claim: str | None, approve: bool
) -> None:
    """``sender_verified`` not recorded: the claim, and a payload without ``by`` is ignored
    (as sojourn decided before it recorded senders' verification), so such runs replay."""
    verdict = judge(answer(approve, claim), sender, None, name="n", stage=0, approver="a")
    if claim is None:
        assert verdict is None
    else:
        assert verdict == Accepted(approve=approve, by=claim, note="", verified=False)


# --- replays ------------------------------------------------------------------------------------


def after_approval(by: str) -> str:
    return by


@agent("appr_gate")
async def appr_gate(ctx: Context, _: None) -> dict[str, Any]:
    d = await ctx.approval("deploy", approvers=["alice"], timeout=3600)
    await ctx.step(after_approval, d.by)  # a replay that decided otherwise diverges here
    return {
        "approved": d.approved,
        "by": d.by,
        "verified": d.verified,
        "note": d.note,
        "via": d.via,
        "stage": d.stage,
    }


def approval_history(signals: list[tuple[dict[str, Any], str, bool | None]]) -> list[RunEvent]:
    """The history ``appr_gate`` writes when each of ``signals`` (payload, sender, verified)
    in turn arrives while it waits, by the rule of today (a refusal is recorded for those
    ``judge`` refuses), the last one deciding."""

    def stamp(t: float) -> ValueRecorded:  # a ``ctx.now()`` at ``pos``
        return ValueRecorded(
            position=pos, kind="now", value=to_raw(datetime.fromtimestamp(t, UTC)), at=t
        )

    events: list[RunEvent] = [RunStarted(run_id="g1", agent="appr_gate", input=to_raw(None))]
    pos, t = 0, 1000.0
    events.append(stamp(t))  # the stage's deadline
    pos += 1
    decided = None
    for n, (payload, sender, verified) in enumerate(signals):
        events.append(stamp(t))  # the loop's now
        pos += 1
        events.append(
            WaitStarted(
                position=pos, key="signal:approval.deploy", signals=("approval.deploy",), at=t
            )
        )
        sid = f"s{n}"
        events.append(
            SignalReceived(
                name="approval.deploy",
                payload=to_raw(payload),
                signal_id=sid,
                sent_by=sender,
                sender_verified=verified,
                at=t,
            )
        )
        events.append(
            WaitCompleted(
                position=pos,
                key="signal:approval.deploy",
                outcome="signal",
                payload=to_raw(payload),
                signal="approval.deploy",
                signal_id=sid,
                sent_by=sender,
                sender_verified=verified,
                at=t,
            )
        )
        pos += 1
        verdict = judge(payload, sender, verified, name="deploy", stage=0, approver="alice")
        if isinstance(verdict, ApprovalRefused):
            events.append(ValueRecorded(position=pos, kind="refusal", value=to_raw(verdict)))
            pos += 1
        elif isinstance(verdict, Accepted):
            decided = verdict
            break
        t += 1.0
    assert decided is not None, "the last signal must decide"
    events.append(stamp(t))  # the decision's time
    pos += 1
    events += [
        StepStarted(position=pos, name="after_approval"),
        StepCompleted(position=pos, name="after_approval", result=to_raw(decided.by)),
        RunCompleted(output=to_raw(None)),
    ]
    return events


def test_a_history_from_before_replays_by_the_rules_of_then() -> None:
    """Written before ``sender_verified`` existed (``None`` everywhere): a payload without
    ``by`` was ignored and the run went on waiting. Read as a claim with ``sent_by`` as the
    fallback, it would decide there and the replay would diverge."""
    events = approval_history(
        [({"approve": True}, "client", None), ({"approve": True, "by": "ann"}, "client", None)]
    )
    result = replay_run(appr_gate, events)
    assert result.ok, result.describe()
    assert result.checked == len(fold(events).ops)


def test_a_refused_decision_replays_as_refused() -> None:
    events = approval_history(
        [
            ({"approve": True, "by": "alice"}, "mallory", True),
            ({"approve": False, "by": "bob"}, "alice", True),
        ]
    )
    state = fold(events)
    assert [op.kind for op in state.ops].count("refusal") == 1
    result = replay_run(appr_gate, events)
    assert result.ok, result.describe()
    assert result.checked == len(state.ops)
    # The recorded wait gives the code the sender the history holds, not what a replay
    # computes: without it the refusal would not be taken again and the replay would diverge.
    mallory_wait = next(op for op in state.ops if op.kind == "wait")
    assert (mallory_wait.sent_by, mallory_wait.sender_verified) == ("mallory", True)


# --- end to end, with authentication ------------------------------------------------------------

PREFIX = "apprauth"
SETTINGS = Settings(prefix=PREFIX, lease_ttl=2.0)
USERS: dict[str, Role] = {"alice": "client", "mallory": "client", "worker": "worker"}
PASSWORDS = passwords(USERS)
DEADLINE = 60.0


@pytest_asyncio.fixture(scope="module")
async def server(
    processes: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("nats-approvals")
    async with authenticated_server(store, USERS, PASSWORDS, PREFIX) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module")
async def worker(server: EmbeddedServer) -> AsyncIterator[Worker]:
    async with serving(server.url_for("worker"), [appr_gate], SETTINGS) as w:
        yield w


async def connect(server: EmbeddedServer, user: str) -> Client:
    return await Client.connect(server.url_for(user), settings=SETTINGS)


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def test_only_the_authenticated_approver_decides(
    server: EmbeddedServer, worker: Worker
) -> None:
    alice, mallory = await connect(server, "alice"), await connect(server, "mallory")
    try:
        assert (alice.broker.user, mallory.broker.user) == ("alice", "mallory")
        run_id = await alice.start("appr_gate", None, wait=True, timeout=DEADLINE)

        async def waiting() -> bool:
            st = await alice.state(run_id)
            return st.status == "waiting" and "signal:approval.deploy" in st.waiting_on

        await wait_for(waiting, DEADLINE, what="the run to wait for approval.deploy")
        first_wait = next(e for e in await events_of(alice, run_id) if isinstance(e, WaitStarted))

        # mallory claims to be alice: the broker says it is mallory, who is not the approver.
        await mallory.signal(run_id, "approval.deploy", {"approve": True, "by": "alice"})

        async def refused() -> bool:
            evs = await events_of(alice, run_id)
            return any(isinstance(e, ValueRecorded) and e.kind == "refusal" for e in evs)

        await wait_for(refused, DEADLINE, what="mallory's decision to be refused")
        evs = await events_of(alice, run_id)
        (sig,) = [e for e in evs if isinstance(e, SignalReceived)]
        assert (sig.sent_by, sig.sender_verified) == ("mallory", True)
        (rec,) = [e for e in evs if isinstance(e, ValueRecorded) and e.kind == "refusal"]
        assert from_raw(rec.value, ApprovalRefused) == ApprovalRefused(
            by="mallory", approval="deploy", stage=0, reason="not the approver asked (alice)"
        )
        took = next(e for e in evs if isinstance(e, WaitCompleted))
        assert (took.sent_by, took.sender_verified) == ("mallory", True)
        # Still waiting, to the same deadline.
        st = await alice.state(run_id)
        assert st.status == "waiting" and "signal:approval.deploy" in st.waiting_on
        waits = [e for e in evs if isinstance(e, WaitStarted)]
        assert len(waits) == 2
        assert waits[0].deadline is not None and waits[1].deadline is not None
        assert waits[0] == first_wait and abs(waits[1].deadline - waits[0].deadline) < 1.0

        # The refusal is in ``sojourn history``, with its sender.
        hist = await sojourn(
            "history", run_id, "--nats", server.url_for("alice"), "--prefix", PREFIX
        )
        assert hist.rc == 0, hist
        (line,) = [ln for ln in hist.out.splitlines() if "refused" in ln]
        assert '"by":"mallory"' in line and '"approval":"deploy"' in line, line

        # alice decides; her payload claims "bob": the name comes from the subject.
        await alice.signal(
            run_id, "approval.deploy", {"approve": True, "by": "bob", "note": "ship it"}
        )
        out = await alice.result(run_id, timeout=DEADLINE)
        assert out == {
            "approved": True,
            "by": "alice",
            "verified": True,
            "note": "ship it",
            "via": "decision",
            "stage": 0,
        }

        # The recorded history replays to the same refusal and the same decision.
        evs = await events_of(alice, run_id)
        result = replay_run(appr_gate, evs)
        assert result.ok, result.describe()
        assert result.checked == len(fold(evs).ops)
    finally:
        await alice.close()
        await mallory.close()
