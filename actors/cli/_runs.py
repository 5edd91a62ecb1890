"""The commands on runs: ``start``, ``status``, ``history``, ``cancel``, ``signal``, ``resume``,
``decide``, ``schemas`` (the wire schemas) and ``replay`` (histories against code)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sojourn.schemas.attributes import InvalidAttributes, parse_attribute_args
from sojourn.schemas.codec import encode
from sojourn.schemas.errors import RunNotFound, SojournError, UnknownAgent
from sojourn.schemas.events import RunEvent, RunStarted
from sojourn.schemas.export import export_schemas
from sojourn.schemas.names import validate_token
from sojourn.schemas.vocabulary import SuspendReason

from ..agents.agent import Agent
from ..client.base import TriggerRejected
from ..client.client import Client, PendingRun
from ..client.reports import history_report, lookup, status_report
from ..core.replay import Divergence, decode_history_file, replay_run
from ..core.state import RunState
from ..history.values import values_for
from ..ops.watchdog import Watchdog
from ..worker.app import load_app
from ._args import Command, add_json, add_json_value, add_run_id, add_seconds
from ._budget import add_budget_arguments, budget_from_args
from ._common import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    cli_sender,
    connect_client,
    has_deployment,
    parse_input,
    require_deployment,
    to_run,
)
from ._concurrency import add_concurrency_arguments, concurrency_options
from ._flow import add_flow_arguments, flow_options
from ._holds import agent_hold, pause_arguments, unpause_arguments
from ._keyed import add_keyed_arguments, keyed_options, keyed_outcome
from ._render import (
    clock,
    describe_event,
    one_line,
    out,
    pending_rows,
    public_status,
    stamp,
    status_rows,
)

__all__ = [
    "COMMANDS",
    "INTAKE_WAIT",
    "cmd_cancel",
    "cmd_decide",
    "cmd_history",
    "cmd_pause",
    "cmd_replay",
    "cmd_resume",
    "cmd_schemas",
    "cmd_signal",
    "cmd_start",
    "cmd_status",
    "cmd_terminate",
    "cmd_unpause",
]

INTAKE_WAIT = 2.0
"""Seconds ``start`` waits for the intake's answer when ``--wait`` is not given."""

_DECIDABLE: frozenset[SuspendReason] = frozenset({"in_doubt", "crash_loop"})
"""The suspensions ``decide`` settles: a step whose end was never recorded, or cut off too
often in a row."""


async def cmd_start(args: argparse.Namespace) -> int:
    payload = parse_input(args.input)
    validate_token(args.agent, "agent name")
    if args.run_id is not None:
        validate_token(args.run_id, "run_id")
    timeout: float | None = args.timeout
    intake_timeout = (timeout or 86_400.0) if args.wait else (timeout or INTAKE_WAIT)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    keyed = keyed_options(args)  # a singleton key or a debounce: the intake names the run
    w = f"worker serving {args.agent} starts"
    limited = {**concurrency_options(args), **flow_options(args)}  # decisions 0048, 0049
    run_id = args.run_id or (None if "debounce" in keyed else uuid.uuid4().hex)
    try:
        attributes = parse_attribute_args(args.attr)
    except InvalidAttributes as e:
        raise UsageError(f"--attr: {e.message}") from None
    async with await connect_client(args) as client:
        trigger = asyncio.ensure_future(
            client.trigger(
                args.agent,
                payload,
                run_id=run_id,
                wait=True,
                timeout=intake_timeout,
                budget=budget_from_args(args),
                attributes=attributes,
                **keyed,
                **limited,
            )
        )
        if not keyed:
            out(f"run_id: {run_id}")
        if args.wait:
            done, _ = await asyncio.wait({trigger}, timeout=INTAKE_WAIT)
            if not done:
                out(
                    f"queued: no worker answered yet; waiting for a worker serving "
                    f"{args.agent} (the trigger is stored: Ctrl-C stops only the waiting)"
                )
        try:
            receipt = await trigger
        except UnknownAgent as e:
            raise TriggerRejected("unknown_agent", e.message, run_id=run_id or "") from None
        if receipt.queued:
            out(f"queued: no worker answered yet; the trigger is stored and will run when a {w}")
        elif keyed or receipt.created:
            out(keyed_outcome(receipt) if keyed else "accepted: new run")
        else:
            out("accepted: a run with this id already exists (it was not started again)")
        if not args.wait:
            return EXIT_OK
        remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
        try:
            result = await client.result(receipt.run_id, timeout=remaining)
        except TimeoutError:
            raise SojournError(
                f"run {receipt.run_id} did not finish within {timeout:g}s; it keeps going "
                f"(see `sojourn status {receipt.run_id}`)",
                run_id=receipt.run_id,
            ) from None
        out(f"output: {encode(result).decode()}")
    return EXIT_OK


def _queued(pending: PendingRun) -> str:
    return f"pending: its start has been queued since {stamp(pending.queued_at)}"


async def cmd_status(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    async with await connect_client(args) as client:
        await require_deployment(client, args.run_id)
        if args.json:
            out(encode(await status_report(client, args.run_id)).decode())
            return EXIT_OK
        state = await lookup(client, args.run_id)
        liv = None if isinstance(state, PendingRun) else await client.liveness(args.run_id)
        # queued on its concurrency key: where it stands (decision 0048)
        detail = None if isinstance(state, PendingRun) else await client.queued_detail(state)
    if isinstance(state, PendingRun):
        for key, value in pending_rows(state):
            out(f"{key:<10} {value}")
        return EXIT_OK
    assert liv is not None
    for key, value in status_rows(state, liv, args.run_id):
        out(f"{key:<10} {value}")
    if detail is not None:
        out(f"{'detail':<10} {detail}")
    return EXIT_OK


async def cmd_history(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    async with await connect_client(args) as client:
        await require_deployment(client, args.run_id)
        history = await client.history(args.run_id)
        pending = None if history else await client.pending(args.run_id)
    if not history and pending is None:
        raise RunNotFound(f"no run with id '{args.run_id}'", run_id=args.run_id)
    if args.json:
        out(encode(history_report(history)).decode())
        return EXIT_OK
    if pending is not None:
        out(f"run {args.run_id} has no history yet ({_queued(pending)})")
        return EXIT_OK
    width = max(len("writer"), *(len(d.writer) for d in history))
    out(f"{'seq':>5}  {'time (UTC)':<12}  {'writer':<{width}}  event")
    for d in history:
        for e in d.events:
            name, detail = describe_event(e)
            out(f"{d.seq:>5}  {clock(e.at):<12}  {d.writer:<{width}}  {name:<15} {detail}")
    return EXIT_OK


async def _stop(args: argparse.Namespace, *, terminate: bool) -> RunState | PendingRun | None:
    """Ask the run to stop (``cancel``, or ``terminate``: without its compensation); the run as
    it stood, or ``None`` when it had already ended (said on stdout)."""
    async with to_run(args) as (client, state):
        if isinstance(state, RunState) and state.terminal:
            verb = "terminate" if terminate else "cancel"
            out(f"run {args.run_id} already ended ({state.status}): nothing to {verb}")
            return None
        stop = client.terminate if terminate else client.cancel
        await stop(args.run_id, args.reason, by=cli_sender(client))
    return state


async def cmd_cancel(args: argparse.Namespace) -> int:
    state = await _stop(args, terminate=False)
    if isinstance(state, PendingRun):
        out(
            f"cancel requested for run {args.run_id} ({_queued(state)}): it ends cancelled "
            f"without running a step when a worker serving {state.agent} takes it"
        )
        return EXIT_OK
    if state is not None:
        out(
            f"cancel requested for run {args.run_id}: its running step is interrupted, its "
            "compensation (if any) runs and it ends cancelled "
            f"(see `sojourn status {args.run_id}`)"
        )
    return EXIT_OK


async def cmd_terminate(args: argparse.Namespace) -> int:
    if await _stop(args, terminate=True) is None:
        return EXIT_OK
    out(
        f"terminate requested for run {args.run_id}: its running step is interrupted and it "
        f"ends cancelled without compensation (see `sojourn status {args.run_id}`)"
    )
    return EXIT_OK


async def cmd_signal(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    payload = parse_input(args.payload, "--payload")
    async with to_run(args) as (client, state):  # a typo'd run id is an error, not a dead letter
        if isinstance(state, RunState) and state.terminal:
            raise UsageError(f"run {args.run_id} has ended ({state.status}): signal not sent")
        sid = await client.signal(
            args.run_id, args.name, payload, signal_id=args.signal_id, sender=args.sender
        )
    if isinstance(state, PendingRun):
        out(
            f"signal {args.name} sent to run {args.run_id} (id {sid}; the run is "
            f"{_queued(state)}): it is recorded once a worker serving {state.agent} starts "
            "the run, and buffered until the run waits for it"
        )
        return EXIT_OK
    out(
        f"signal {args.name} sent to run {args.run_id} (id {sid}); it is buffered until the "
        "run waits for it"
    )
    return EXIT_OK


async def cmd_resume(args: argparse.Namespace) -> int:
    async with to_run(args) as (client, state):
        if isinstance(state, PendingRun):
            raise UsageError(f"run {args.run_id} is {_queued(state)}; not suspended")
        if state.status != "suspended":
            raise UsageError(f"run {args.run_id} is {public_status(state)}, not suspended")
        by = cli_sender(client)
        await client.resume(args.run_id, args.note, by=by)
    out(f"resume requested for run {args.run_id} (it was suspended: {state.suspended_reason})")
    return EXIT_OK


async def cmd_pause(args: argparse.Namespace) -> int:
    held = await agent_hold(args, pause=True)
    if held is not None:
        return held
    async with to_run(args) as (client, state):
        if isinstance(state, PendingRun):
            raise UsageError(f"run {args.run_id} is {_queued(state)}; it has no step to hold at")
        if state.terminal:
            raise UsageError(f"run {args.run_id} has ended ({public_status(state)})")
        await client.pause(args.run_id, args.reason, by=cli_sender(client))
    out(f"pause requested for run {args.run_id}: it holds at its next step")
    return EXIT_OK


async def cmd_unpause(args: argparse.Namespace) -> int:
    held = await agent_hold(args, pause=False)
    if held is not None:
        return held
    async with to_run(args) as (client, state):
        if isinstance(state, PendingRun) or (
            state.pause is None and state.suspended_reason != "manual"
        ):
            raise UsageError(f"run {args.run_id} is not paused")
        await client.unpause(args.run_id, args.note, by=cli_sender(client))
    out(f"unpause requested for run {args.run_id}")
    return EXIT_OK


async def cmd_decide(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    result = parse_input(args.result, "--result")
    async with to_run(args) as (client, state):
        if isinstance(state, PendingRun):
            raise UsageError(f"run {args.run_id} is {_queued(state)}; it has no step yet")
        if state.status != "suspended" or state.suspended_reason not in _DECIDABLE:
            raise UsageError(f"run {args.run_id} is not suspended on an in-doubt step")
        by = cli_sender(client)
        op = state.op(args.position)
        if op is None or op.kind != "step" or op.status != "started":
            raise UsageError(
                f"position {args.position} of run {args.run_id} is not an in-doubt step"
                + (f" (it holds a {op.kind} that is {op.status})" if op is not None else "")
                + "; `sojourn status` names the step that waits for a decision"
            )
        await client.decide(args.run_id, args.position, args.action, result, by=by)
    out(f"decided {args.action} for step {args.position} of run {args.run_id}; it resumes")
    return EXIT_OK


async def cmd_schemas(args: argparse.Namespace) -> int:
    for path in export_schemas(args.out):
        out(path)
    return EXIT_OK


# --- replay ------------------------------------------------------------------------------------

REPLAY_READERS = 16
"""Histories ``replay`` reads from the broker at once."""


@dataclasses.dataclass(frozen=True)
class _History:
    """A history to replay: its events and where they came from (a file, or ``None``: the
    deployment)."""

    events: list[RunEvent]
    source: str | None = None


@dataclasses.dataclass(frozen=True)
class _Checked:
    run_id: str
    agent: str
    source: str | None
    ok: bool
    checked: int
    text: str
    divergence: Divergence | None = None


def _read_history_file(path: str) -> _History:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"--from-file {path}: cannot read: {e.strerror or e}") from None
    try:
        events = decode_history_file(data)
    except ValueError as e:
        raise UsageError(f"--from-file {path}: {one_line(str(e))}") from None
    if not any(isinstance(e, RunStarted) for e in events):
        raise UsageError(
            f"--from-file {path}: no run.started.v1 event: not the history of a run "
            "(save one with `sojourn history RUN --json > FILE`)"
        )
    return _History(events, source=path)


async def _live_run_ids(client: Client, agent: str | None) -> list[str]:
    """Every run of the deployment that has not ended (of ``agent`` only, if given)."""
    if not await has_deployment(client):
        raise SojournError(
            f"nothing has run with prefix '{client.settings.prefix}' on {client.broker.url} "
            "(check --prefix/--nats)"
        )
    judged = await Watchdog(broker=client.broker, settings=client.settings).survey()
    return sorted(r for r, liv in judged.items() if agent is None or liv.agent == agent)


async def _read_runs(client: Client, run_ids: Sequence[str], *, named: bool) -> list[_History]:
    """The histories of ``run_ids``; a named run that does not exist is an error."""
    sem = asyncio.Semaphore(REPLAY_READERS)

    async def read(run_id: str) -> list[RunEvent]:
        async with sem:
            events = [e for d in await client.history(run_id) for e in d.events]
            # Large values are replayed as the run saw them, not as their references.
            return await values_for(client.broker, client.names, client.settings).resolve(events)

    found = await asyncio.gather(*(read(r) for r in run_ids))
    for run_id, events in zip(run_ids, found, strict=True):
        if named and not events:
            raise RunNotFound(f"no run with id '{run_id}'", run_id=run_id)
    return [_History(events) for events in found if events]


def _check(history: _History, agents: dict[str, Agent[Any, Any]], app: str) -> _Checked:
    start = next((e for e in history.events if isinstance(e, RunStarted)), None)
    if start is None:  # a stored history that does not begin a run (files are checked earlier)
        return _Checked("?", "?", history.source, False, 0, "no run.started.v1 event")
    agent = agents.get(start.agent)
    if agent is None:
        text = f"agent '{start.agent}' is not in {app}"
        return _Checked(start.run_id, start.agent, history.source, False, 0, text)
    try:
        result = replay_run(agent, history.events)
    except Exception as e:  # the replay itself broke: one line, a failure, not a traceback
        text = f"cannot replay: {type(e).__name__}: {one_line(str(e))}"
        return _Checked(start.run_id, start.agent, history.source, False, 0, text)
    return _Checked(
        result.run_id,
        result.agent,
        history.source,
        result.ok,
        result.checked,
        result.describe(),
        result.divergence,
    )


async def cmd_replay(args: argparse.Namespace) -> int:
    run_ids = list(dict.fromkeys(args.runs))
    if run_ids and args.all_live:
        raise UsageError(
            "--run and --all-live exclude each other: name the runs, or take every live run"
        )
    if not (run_ids or args.all_live or args.files):
        raise UsageError(
            "nothing to replay: give --run ID, --all-live or --from-file FILE "
            "(a `sojourn history RUN --json` output)"
        )
    for run_id in run_ids:
        validate_token(run_id, "run_id")
    if args.agent is not None:
        validate_token(args.agent, "agent name")
    histories = [_read_history_file(path) for path in args.files]
    app = load_app(args.app)
    if run_ids or args.all_live:
        async with await connect_client(args) as client:
            if run_ids:
                await require_deployment(client, run_ids[0])
                stored = await _read_runs(client, run_ids, named=True)
            else:
                live = await _live_run_ids(client, args.agent)
                stored = await _read_runs(client, live, named=False)
        histories = stored + histories
    agents = {a.name: a for a in app.agents}
    results = [
        _check(h, agents, app.name)
        for h in histories
        if args.agent is None or _agent_of(h) == args.agent
    ]
    if args.json:
        out(encode([_replay_json(r) for r in results]).decode())
    elif not results:
        what = "live runs" if args.all_live and not args.files else "histories"
        out(f"no {what}" + (f" of agent {args.agent}" if args.agent else "") + " to replay")
    else:
        w_run = max(len(r.run_id) for r in results)
        w_agent = max(len(r.agent) for r in results)
        for r in results:
            out(f"{r.run_id:<{w_run}}  {r.agent:<{w_agent}}  {r.text}")
    return EXIT_OK if all(r.ok for r in results) else EXIT_ERROR


def _agent_of(history: _History) -> str | None:
    return next((e.agent for e in history.events if isinstance(e, RunStarted)), None)


def _replay_json(r: _Checked) -> dict[str, Any]:
    d = r.divergence
    return {
        "run_id": r.run_id,
        "agent": r.agent,
        "source": r.source,
        "ok": r.ok,
        "checked": r.checked,
        "result": r.text,
        "divergence": None if d is None else dataclasses.asdict(d),
    }


# --- arguments ---------------------------------------------------------------------------------


def _start_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("agent", metavar="AGENT", help="agent name")
    add_json_value(
        p, "--input", "the run's input as JSON, or @FILE to read it from a file (default: null)"
    )
    p.add_argument(
        "--run-id",
        metavar="ID",
        default=None,
        help="idempotency: starting the same run id twice is one run (default: a fresh id)",
    )
    p.add_argument(
        "--wait", action="store_true", help="wait for the run's result and print its output"
    )
    add_budget_arguments(p, "each replaces the agent's own for this run")
    p.add_argument(
        "--attr",
        metavar="KEY=TEXT|KEY:=JSON",
        action="append",
        default=[],
        help="a search attribute (repeatable): tier=gold is a string, tier:=3 or vip:=true "
        "a typed value",
    )
    add_keyed_arguments(p)
    add_concurrency_arguments(p)
    add_flow_arguments(p)
    add_seconds(
        p,
        "--timeout",
        "give up waiting after this long (default: 2 for the intake's answer; "
        "no limit with --wait)",
    )


def _status_arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    add_json(p, "print one JSON object")


def _history_arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    add_json(p, "print a JSON array of {seq, writer, events}")


def _stop_arguments(p: argparse.ArgumentParser) -> None:
    """``cancel`` and ``terminate``."""
    add_run_id(p)
    p.add_argument("--reason", metavar="TEXT", default="", help="recorded in the history")


def _signal_arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    p.add_argument("name", metavar="NAME", help="signal name, e.g. docs.signed")
    add_json_value(p, "--payload", "the signal's payload as JSON, or @FILE (default: null)")
    p.add_argument(
        "--signal-id", metavar="ID", default=None, help="idempotency id (default: a fresh one)"
    )
    p.add_argument("--sender", metavar="WHO", default=None, help="recorded in the history")


def _resume_arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    p.add_argument("--note", metavar="TEXT", default="", help="recorded in the history")


def _decide_arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    p.add_argument("position", metavar="POSITION", type=int, help="the step's position")
    p.add_argument("action", choices=("retry", "skip", "fail"), help="what to do")
    add_json_value(p, "--result", "the step's result for skip, as JSON (default: null)")


def _replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--app",
        metavar="MODULE",
        required=True,
        help="module whose module-level agents to check, imported as `sojourn worker --app` "
        "does (e.g. examples.greeter)",
    )
    p.add_argument(
        "--run",
        metavar="ID",
        action="append",
        default=[],
        dest="runs",
        help="a run to replay, ended or not (repeatable)",
    )
    p.add_argument(
        "--all-live", action="store_true", help="every run that has not ended (not with --run)"
    )
    p.add_argument(
        "--from-file",
        metavar="FILE",
        action="append",
        default=[],
        dest="files",
        help="a history saved with `sojourn history RUN --json > FILE` (repeatable; no "
        "server needed)",
    )
    p.add_argument("--agent", metavar="AGENT", default=None, help="only histories of this agent")
    add_json(p, "print a JSON array, one object per run")


def _schemas_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="DIR", required=True, help="directory to write into")


COMMANDS = (
    Command(
        "start",
        cmd_start,
        "Start a run of an agent and print its run id.",
        'sojourn start greeter --input \'{"name": "Ada", "email": "a@b.c"}\' --wait',
        detail="Prints the run id and the intake's answer. Without a worker serving the "
        "agent the trigger is stored and runs when one starts.",
        arguments=_start_arguments,
    ),
    Command(
        "status",
        cmd_status,
        "Show a run's status, steps, times, error and output.",
        "sojourn status 5f0c9e2d --json",
        arguments=_status_arguments,
    ),
    Command(
        "history",
        cmd_history,
        "Show a run's history, one line per event.",
        "sojourn history 5f0c9e2d",
        arguments=_history_arguments,
    ),
    Command(
        "cancel",
        cmd_cancel,
        "Ask a run to stop: its running step is interrupted, its compensation runs.",
        "sojourn cancel 5f0c9e2d --reason 'wrong customer'",
        arguments=_stop_arguments,
    ),
    Command(
        "terminate",
        cmd_terminate,
        "End a run at once, without its compensation (on_cancel).",
        "sojourn terminate 5f0c9e2d --reason 'runaway loop'",
        arguments=_stop_arguments,
    ),
    Command(
        "signal",
        cmd_signal,
        "Send a signal to a run (buffered until the run waits for it).",
        'sojourn signal 5f0c9e2d docs.signed --payload \'{"by": "ada@example.com"}\'',
        detail="Durable: the run need not be waiting, nor any worker running. The same "
        "--signal-id sent twice counts once.",
        arguments=_signal_arguments,
    ),
    Command(
        "resume",
        cmd_resume,
        "Lift a run's suspension (a poll cap or budget reached, a fixed non-determinism).",
        "sojourn resume 5f0c9e2d --note 'job is slow today'",
        arguments=_resume_arguments,
    ),
    Command(
        "pause",
        cmd_pause,
        "Hold a run, or every run of an agent, at its next step (a step in flight finishes; "
        "timers keep firing).",
        "sojourn pause 5f0c9e2d --reason 'bad deploy, investigating'",
        detail="The run suspends itself (reason manual) before its next step, until "
        "`sojourn unpause`. With --agent AGENT instead of a run: every live run of AGENT, and "
        "every new one before its first step, until `sojourn unpause --agent AGENT`; --list "
        "shows the agents held. Needs the admin role where the deployment authenticates.",
        arguments=pause_arguments,
    ),
    Command(
        "unpause",
        cmd_unpause,
        "Lift a pause of a run (or of an agent: --agent): it goes on from where it held.",
        "sojourn unpause 5f0c9e2d --note 'fixed'",
        arguments=unpause_arguments,
    ),
    Command(
        "decide",
        cmd_decide,
        "Settle an in-doubt step of a suspended run, then resume it.",
        "sojourn decide 5f0c9e2d 3 skip --result '\"ch_123\"'",
        detail='For steps declared @step(in_doubt="ask"), and runs suspended as a crash loop '
        "(Settings.crash_loop_limit): retry runs the step again with the same idempotency "
        "key; skip records --result as its result without running it; fail fails the step.",
        arguments=_decide_arguments,
    ),
    Command(
        "replay",
        cmd_replay,
        "Replay stored histories against an app's code, executing nothing; exit 1 on a divergence.",
        "sojourn replay --app myapp.agents --all-live --from-file golden/order.json",
        detail="Prints one line per history: RUN_ID  AGENT  ok, or RUN_ID  AGENT  diverges at "
        "position N: recorded X, code now calls Y. Exits 0 when every history replays, 1 on "
        "any divergence (or a history of an agent the app does not define): a gate before a "
        "deploy. --from-file reads what `sojourn history RUN --json` prints and needs no "
        "server; --run and --all-live read the deployment's histories.",
        arguments=_replay_arguments,
    ),
    Command(
        "schemas",
        cmd_schemas,
        "Write JSON Schemas of the wire messages into a directory.",
        "sojourn schemas --out ./schemas-json",
        arguments=_schemas_arguments,
    ),
)
