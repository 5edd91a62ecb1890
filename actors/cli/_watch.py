"""``sojourn watch``: follow one run live until it ends, as a timeline.

The timeline is made from the run's events (``follow_history``), not from the projector's
views, so it works on any deployment: the history so far, then each event as it is appended.
One line per event: its time (the writer's clock, UTC), the time since the previous line, the
event's type and what it means for the run (a wait and its deadline, a failed attempt and when
the next one is due, a signal received or consumed, a suspension, a child, the end). With
``--json`` each line is one JSON object instead. Exit 0 when the run ends; 1 (one line) when
the run does not exist; Ctrl-C is the CLI's 130.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sojourn.schemas import events
from sojourn.schemas.codec import encode
from sojourn.schemas.errors import RunNotFound
from sojourn.schemas.names import validate_token

from ..client.watching import follow_history, presence
from ._args import Command, add_json, add_run_id
from ._common import EXIT_OK, connect_client, require_deployment
from ._render import clock, describe_event, iso, one_line, out, short

__all__ = ["COMMANDS", "OUTPUT_SHOWN", "Timeline", "cmd_watch", "elapsed", "what_happened"]

OUTPUT_SHOWN = 400
"""Characters of a run's output its last line shows (``sojourn status`` shows it whole)."""


def elapsed(seconds: float) -> str:
    """A time between two lines: ``+0.004s``, ``+12.500s``, ``+3m07s``, ``+2h05m``
    (``-`` for a writer's clock behind the previous one's)."""
    sign = "-" if seconds < 0 else "+"
    s = abs(seconds)
    if s < 60:
        return f"{sign}{s:.3f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _until(deadline: float, at: float) -> str:
    return f"{clock(deadline)} (in {max(deadline - at, 0.0):.3f}s)"


def what_happened(e: events.RunEvent) -> str:
    """What ``e`` means for the run, in words: the events a watcher cares about are spelled
    out (waits, retries, signals, children), the others are ``describe_event``'s fields."""
    match e:
        case events.WaitStarted():
            on = ", ".join(
                [*(f"signal {s}" for s in e.signals), *(f"child {c}" for c in e.children)]
            )
            if e.key in (f"signal:{s}" for s in e.signals):
                on = ""  # the key says it all
            until = f" until {_until(e.deadline, e.at)}" if e.deadline is not None else ""
            return f"waiting at pos={e.position} for {e.key}" + (f" ({on})" if on else "") + until
        case events.WaitCompleted():
            match e.outcome:
                case "signal":
                    how = f"by signal {e.signal} (id {e.signal_id}) payload={short(e.payload, 40)}"
                case "child":
                    how = f"child ended: {e.child_status or '?'} payload={short(e.payload, 40)}"
                case "timeout":
                    how = "deadline passed"
                case other:
                    how = str(other)
            return f"resumed at pos={e.position} ({e.key}): {how}"
        case events.StepThrottled():
            return (
                f"{e.name} pos={e.position} attempt {e.attempt} waits for its slot of limit "
                f"{e.limit} at {_until(e.slot, e.at)}"
            )
        case events.StepFailed() if e.retry_at is not None:
            return (
                f"{e.name} pos={e.position} attempt {e.attempt} failed after {e.duration:.3f}s: "
                f"{e.error.type}: {one_line(e.error.message)}; attempt {e.attempt + 1} at "
                f"{_until(e.retry_at, e.at)}"
            )
        case events.StepFailed():
            return (
                f"{e.name} pos={e.position} attempt {e.attempt} failed for good: "
                f"{e.error.type}: {one_line(e.error.message)}"
            )
        case events.SignalReceived():
            by = f" from {e.sent_by}" if e.sent_by else ""
            return f"signal {e.name} received{by} (id {e.signal_id}) payload={short(e.payload, 40)}"
        case events.ChildStarted():
            return f"child {e.child_run_id} started (agent {e.agent}) at pos={e.position}"
        case events.RunCompleted():
            return f"completed: output={short(e.output, OUTPUT_SHOWN)}"
        case _:
            return describe_event(e)[1]


class Timeline:
    """Prints a run's events as they come, one line each, with the time since the last."""

    def __init__(self, *, json: bool) -> None:
        self.json = json
        self.previous: float | None = None

    def line(self, seq: int, e: events.RunEvent) -> str:
        """The line of event ``e`` of the decision stored at ``seq``; remembers its time."""
        since = 0.0 if self.previous is None else e.at - self.previous
        self.previous = e.at
        kind = describe_event(e)[0]
        text = what_happened(e)
        if self.json:
            body: dict[str, Any] = {
                "seq": seq,
                "time": iso(e.at),
                "at": e.at,
                "since_previous": round(since, 6),
                "type": kind,
                "text": text,
                "event": e,
            }
            return encode(body).decode()
        return f"{clock(e.at)}  {elapsed(since):>9}  {kind:<15} {text}"


async def cmd_watch(args: argparse.Namespace) -> int:
    validate_token(args.run_id, "run_id")
    async with await connect_client(args) as client:
        await require_deployment(client, args.run_id)
        state = await presence(client.broker, client.names, args.run_id)
        if state == "missing":
            raise RunNotFound(f"no run with id '{args.run_id}'", run_id=args.run_id)
        if state == "pending":
            note = (
                f"run {args.run_id} is pending: its start is stored and no worker has taken "
                "it yet; waiting for it to start"
            )
            print(note, file=sys.stderr if args.json else sys.stdout, flush=True)
        timeline = Timeline(json=args.json)
        async for decision in follow_history(client.broker, client.names, args.run_id):
            for e in decision.events:
                out(timeline.line(decision.seq, e))
    return EXIT_OK


def _arguments(p: argparse.ArgumentParser) -> None:
    add_run_id(p)
    add_json(p, "print each view as one JSON line")


COMMANDS = (
    Command(
        "watch",
        cmd_watch,
        "Follow a run live: its waits, retries, signals and timings, until it ends.",
        "sojourn watch 5f0c9e2d",
        detail="Prints the run's timeline so far, then each change as it happens; exits 0 "
        "when the run ends (1 if it never existed).",
        arguments=_arguments,
    ),
)
