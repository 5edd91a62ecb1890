"""The public names of ``sojourn.actors``, pinned: moving modules between the package's rooms
(core/, agents/, history/, worker/, client/, ops/, ...) must not add, drop or rename one.

A deliberate change to the public surface updates this list in the same commit.
"""

import sojourn.actors

PUBLIC = [
    "Agent",
    "ApprovalDecision",
    "ApprovalRefused",
    "ApprovalTimeout",
    "BrokerUnavailable",
    "Budget",
    "CallbackClaims",
    "CallbackKeys",
    "CallbackKeysMissing",
    "CallbackTokenExpired",
    "CallbackTokenInvalid",
    "ChildHandle",
    "ChildRunError",
    "Client",
    "Concurrency",
    "Context",
    "GatherError",
    "InvalidName",
    "Limit",
    "LimitRecord",
    "NOT_DONE",
    "NondeterminismError",
    "OutputChunk",
    "OutputReader",
    "PayloadTooLarge",
    "PendingRun",
    "PermissionDenied",
    "PollTimeout",
    "RateLimited",
    "RetryPolicy",
    "RetryableError",
    "RunCancelledError",
    "RunFailedError",
    "RunNotFound",
    "RunState",
    "ScheduleAnswer",
    "ScheduleError",
    "ScheduleRecord",
    "Selected",
    "Settings",
    "SojournError",
    "StartReceipt",
    "StepError",
    "StepInfo",
    "StepTimeout",
    "TerminalError",
    "TriggerRejected",
    "UnknownAgent",
    "UnknownLimit",
    "UpdateAnswer",
    "UpdateRejectedError",
    "Usage",
    "Watchdog",
    "Worker",
    "agent",
    "current_step",
    "evolve",
    "fold",
    "heartbeat",
    "idempotency_headers",
    "load_app",
    "read_output",
    "serve_metrics",
    "step",
    "stop_metrics",
]


def test_the_public_names_are_pinned() -> None:
    assert sorted(sojourn.actors.__all__) == PUBLIC


def test_every_public_name_resolves() -> None:
    missing = [name for name in PUBLIC if not hasattr(sojourn.actors, name)]
    assert missing == []


def test_the_documented_pydantic_ai_path_still_imports() -> None:
    from sojourn.actors.integrations import pydantic_ai as moved
    from sojourn.actors.pydantic_ai import Price, Prices, SojournAgent

    assert (Price, Prices, SojournAgent) == (moved.Price, moved.Prices, moved.SojournAgent)
