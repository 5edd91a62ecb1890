"""``sojourn start``'s keyed starts (decision 0047): ``--singleton-key``, and ``--debounce``
with ``--debounce-key`` and ``--debounce-inputs``."""

from __future__ import annotations

import argparse

from sojourn.schemas.flow import DEBOUNCE_INPUTS, KeyedOptions
from sojourn.schemas.flow import parse_window as parse_duration

from ..client.runs import StartReceipt
from ._common import UsageError

__all__ = ["add_keyed_arguments", "keyed_options", "keyed_outcome", "parse_window"]


def parse_window(text: str) -> float:
    """``--debounce``: seconds from a duration (``schemas.flow.parse_window``).

    Raises:
        argparse.ArgumentTypeError: not a duration within the bounds.
    """
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_keyed_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("keyed starts (a run per key)")
    g.add_argument(
        "--singleton-key",
        metavar="KEY",
        help="attach to the live run started with KEY for this agent instead of starting "
        "another (a new run once it has ended)",
    )
    g.add_argument(
        "--debounce",
        metavar="DURATION",
        type=parse_window,
        help="start one run DURATION after the last of a burst of starts with the same "
        "--debounce-key (500ms, 30s, 2m...); the run id is the burst's",
    )
    g.add_argument("--debounce-key", metavar="KEY", help="the key of a debounced start")
    g.add_argument(
        "--debounce-inputs",
        choices=DEBOUNCE_INPUTS,
        help="last (default): the run gets the last start's input; all: the list of every "
        "input of the burst",
    )


def keyed_options(args: argparse.Namespace) -> KeyedOptions:
    """The options of a keyed start (empty for a plain one).

    Raises:
        UsageError: the flags do not go together.
    """
    options: KeyedOptions = {}
    if args.singleton_key is not None:
        options["singleton_key"] = args.singleton_key
    if args.debounce is None:
        if args.debounce_key is not None or args.debounce_inputs is not None:
            raise UsageError("--debounce-key and --debounce-inputs go with --debounce")
        return options
    if args.debounce_key is None:
        raise UsageError("--debounce needs --debounce-key")
    if args.run_id is not None or args.singleton_key is not None:
        raise UsageError("a debounced start takes neither --run-id nor --singleton-key")
    options["debounce"] = args.debounce
    options["debounce_key"] = args.debounce_key
    if args.debounce_inputs is not None:
        options["debounce_inputs"] = args.debounce_inputs
    return options


def keyed_outcome(receipt: StartReceipt) -> str:
    """What ``sojourn start`` says of a keyed start the intake answered."""
    if receipt.debounced:
        return (
            f"run_id: {receipt.run_id}\naccepted: debounced; the run starts once no start with "
            "this key has come for the window"
        )
    if receipt.attached:
        return f"run_id: {receipt.run_id}\naccepted: attached to the key's live run"
    return f"run_id: {receipt.run_id}\naccepted: new run"
