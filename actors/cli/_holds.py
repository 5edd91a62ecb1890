"""``sojourn pause --agent A`` / ``unpause --agent A``: hold every run of an agent
(``Client.pause_agent``, decision 0039), and ``sojourn pause --list``: the agents held now."""

from __future__ import annotations

import argparse
import json

import msgspec

from ._args import add_json
from ._common import EXIT_OK, UsageError, cli_sender, connect_client
from ._render import out, stamp

__all__ = ["agent_hold", "pause_arguments", "unpause_arguments"]


def pause_arguments(p: argparse.ArgumentParser) -> None:
    """``pause``: a run, or ``--agent`` (every run of it), or ``--list``."""
    p.add_argument("run_id", metavar="RUN", nargs="?", help="run id (or --agent)")
    p.add_argument(
        "--agent", metavar="AGENT", help="hold every live and new run of AGENT instead of one run"
    )
    p.add_argument("--list", action="store_true", help="list the agents held now")
    p.add_argument("--reason", metavar="TEXT", default="", help="recorded in the history")
    add_json(p, "with --list: the holds as a JSON array")


def unpause_arguments(p: argparse.ArgumentParser) -> None:
    """``unpause``: a run, or ``--agent``."""
    p.add_argument("run_id", metavar="RUN", nargs="?", help="run id (or --agent)")
    p.add_argument("--agent", metavar="AGENT", help="let every run of AGENT go on")
    p.add_argument("--note", metavar="TEXT", default="", help="recorded in the history")


async def agent_hold(args: argparse.Namespace, *, pause: bool) -> int | None:
    """Carry out ``pause``/``unpause`` when it names an agent (or lists holds); ``None`` when
    it names one run (the caller's work).

    Raises:
        UsageError: both a run and an agent, or neither.
    """
    listing = pause and args.list
    if args.agent is None and not listing:
        if args.run_id is None:
            raise UsageError("name a run, or --agent AGENT")
        return None
    if args.run_id is not None:
        raise UsageError("name a run or --agent, not both")
    async with await connect_client(args) as client:
        if listing:
            holds = await client.agent_holds()
            if args.json:
                out(json.dumps([msgspec.to_builtins(x) for x in holds]))
            elif not holds:
                out("no agent is held")
            for x in [] if args.json else holds:
                why = f": {x.reason}" if x.reason else ""
                out(f"{x.agent}  held since {stamp(x.at)} by {x.by or '-'}{why}")
            return EXIT_OK
        by = cli_sender(client)
        if pause:
            await client.pause_agent(args.agent, args.reason, by=by)
            out(
                f"agent {args.agent} held: each of its runs suspends before its next step, "
                f"new ones before their first (`sojourn unpause --agent {args.agent}` goes on)"
            )
        else:
            answer = await client.unpause_agent(args.agent, by=by)
            out(f"agent {args.agent} unpaused: {answer.resumed} held run(s) resumed")
    return EXIT_OK
