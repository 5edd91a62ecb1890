"""The gateway's OpenAPI 3.1 document, generated from the same msgspec types as
``sojourn schemas`` (``sojourn.schemas.export.WIRE_SCHEMAS``): one definition of every body,
so the document cannot drift from what the gateway sends."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from sojourn.schemas.export import WIRE_SCHEMAS
from sojourn.schemas.gateway import HTTP_STATUS, PROBLEM_TYPE
from sojourn.schemas.vocabulary import BUDGET_LIMITS

__all__ = ["openapi_document"]

_REF: Final = "#/components/schemas/{name}"
_JSON: Final = "application/json"
_PROBLEM: Final = "application/problem+json"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(name=name)}


def _body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _problems(*statuses: int) -> dict[str, Any]:
    codes = {s: sorted(c for c, st in HTTP_STATUS.items() if st == s) for s in statuses}
    return {
        str(s): {
            "description": "a problem document; code: " + ", ".join(codes[s]),
            "content": {_PROBLEM: {"schema": _ref("Problem")}},
        }
        for s in statuses
    }


def _sse(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }


def _param(name: str, where: str, description: str, *, required: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "description": description,
        "schema": {"type": "string"},
    }


_RUN_ID = _param("run_id", "path", "the run id")


def _events_of_run(
    summary: str, *, after: str, resume: str, events: str, security: list[dict[str, list[str]]]
) -> dict[str, Any]:
    """A ``GET`` of server-sent events on one run, resumed with ``after`` (a query parameter)
    or ``Last-Event-ID``; ``events`` says what it sends."""
    return {
        "get": {
            "summary": summary,
            "security": security,
            "parameters": [
                _RUN_ID,
                _param("after", "query", after),
                _param("Last-Event-ID", "header", resume),
            ],
            "responses": {"200": _sse(events), **_problems(400, 401, 403, 404, 503)},
        }
    }


_ANY_JSON: Final[dict[str, Any]] = {"description": "any JSON value"}

_CONTROL_ANSWER: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"run_id": {"type": "string"}, "requested": {"type": "string"}},
    "required": ["run_id", "requested"],
}


def _control(summary: str, body: dict[str, Any], auth: list[dict[str, list[str]]]) -> Any:
    """An operator control on one run (admin tokens only): ``body`` the request's properties."""
    return {
        "post": {
            "summary": summary + " (admin only)",
            "security": auth,
            "parameters": [_RUN_ID],
            "requestBody": {"content": {_JSON: {"schema": {"type": "object", "properties": body}}}},
            "responses": {
                "202": _body(_CONTROL_ANSWER, "stored for the run"),
                **_problems(400, 401, 403, 404, 409, 413, 415, 503),
            },
        }
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document served at ``/v1/openapi.json`` (and by ``sojourn gateway
    --openapi``)."""
    names = {
        "Problem": WIRE_SCHEMAS["http-problem"],
        "StartAnswer": WIRE_SCHEMAS["http-start-answer"],
        "SignalAnswer": WIRE_SCHEMAS["http-signal-answer"],
        "CallbackAnswer": WIRE_SCHEMAS["http-callback-answer"],
        "CancelAnswer": WIRE_SCHEMAS["http-cancel-answer"],
        "HistoryEntry": WIRE_SCHEMAS["http-history-entry"],
        "UpdateAnswer": WIRE_SCHEMAS["http-update-answer"],
        "RunView": WIRE_SCHEMAS["run-view"],
        "RunSteps": WIRE_SCHEMAS["run-steps"],
        "OutputChunk": WIRE_SCHEMAS["output-chunk"],
    }
    types = list(names.values())
    (schemas_in_order, components) = msgspec.json.schema_components(types, ref_template=_REF)
    refs = dict(zip(names, schemas_in_order, strict=True))
    idem = _param("Idempotency-Key", "header", "the run id: the same key started twice is one run")
    signal_idem = _param(
        "Idempotency-Key", "header", "the signal id: the same id sent twice is one signal"
    )
    auth: list[dict[str, list[str]]] = [{"bearer": []}]
    paths: dict[str, Any] = {
        "/v1/agents/{agent}/runs": {
            "post": {
                "summary": "Start a run of an agent (the body is its input)",
                "security": auth,
                "parameters": [_param("agent", "path", "the agent's name"), idem],
                "requestBody": {"content": {_JSON: {"schema": _ANY_JSON}}},
                "responses": {
                    "201": _body(refs["StartAnswer"], "created"),
                    "200": _body(refs["StartAnswer"], "it existed (the same Idempotency-Key)"),
                    "202": _body(refs["StartAnswer"], "stored; no worker has taken it yet"),
                    **_problems(400, 401, 403, 404, 413, 415, 422, 503),
                },
            }
        },
        "/v1/runs": {
            "get": {
                "summary": "List runs (the read side: needs a projector)",
                "security": auth,
                "parameters": [
                    _param("agent", "query", "only this agent's runs"),
                    _param("status", "query", "only runs in these statuses (comma-separated)"),
                    _param("liveness", "query", "only runs judged so (comma-separated)"),
                    _param("since", "query", "only runs updated since (unix seconds)"),
                    _param("schedule", "query", "only runs this schedule started"),
                    _param("parent", "query", "only children of this run"),
                    _param("limit", "query", "at most this many (1-1000, default 100)"),
                    _param("after", "query", "the `next` of the previous page"),
                ],
                "responses": {
                    "200": _body(
                        {
                            "type": "object",
                            "properties": {
                                "runs": {"type": "array", "items": refs["RunView"]},
                                "next": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                            },
                        },
                        "one page, most recently updated first",
                    ),
                    **_problems(400, 401, 403, 503),
                },
            }
        },
        "/v1/runs/{run_id}": {
            "get": {
                "summary": "A run's status (what `sojourn status RUN --json` prints)",
                "security": auth,
                "parameters": [_RUN_ID],
                "responses": {
                    "200": _body({"type": "object"}, "the status report"),
                    **_problems(400, 401, 403, 404, 503),
                },
            }
        },
        "/v1/runs/{run_id}/history": {
            "get": {
                "summary": "A run's history (what `sojourn history RUN --json` prints)",
                "security": auth,
                "parameters": [_RUN_ID],
                "responses": {
                    "200": _body({"type": "array", "items": refs["HistoryEntry"]}, "decisions"),
                    **_problems(400, 401, 403, 404, 503),
                },
            }
        },
        "/v1/runs/{run_id}/steps": {
            "get": {
                "summary": "A run's step list and the spend of every budget kind (the read side)",
                "security": auth,
                "parameters": [_RUN_ID],
                "responses": {
                    "200": _body(refs["RunSteps"], "the run's RunSteps"),
                    **_problems(400, 401, 403, 404, 503),
                },
            }
        },
        "/v1/runs/{run_id}/signals/{name}": {
            "post": {
                "summary": "Send a signal to a run (the body is its payload)",
                "security": auth,
                "parameters": [_RUN_ID, _param("name", "path", "the signal's name"), signal_idem],
                "requestBody": {"content": {_JSON: {"schema": _ANY_JSON}}},
                "responses": {
                    "202": _body(refs["SignalAnswer"], "stored for the run"),
                    **_problems(400, 401, 403, 404, 409, 413, 415, 429, 503),
                },
            }
        },
        "/v1/runs/{run_id}/updates/{name}": {
            "post": {
                "summary": "Send an update to a run and wait for its answer (the body is the "
                "handler's payload; the `signal` action)",
                "security": auth,
                "parameters": [
                    _RUN_ID,
                    _param("name", "path", "the update's name (`ctx.on_update`)"),
                    _param("Idempotency-Key", "header", "the update id: applied once per id"),
                    _param("timeout", "query", "seconds to wait for the answer (30; at most 300)"),
                ],
                "requestBody": {"content": {_JSON: {"schema": _ANY_JSON}}},
                "responses": {
                    "200": _body(refs["UpdateAnswer"], "the run's answer"),
                    **_problems(400, 401, 403, 404, 409, 413, 415, 429, 503, 504),
                },
            }
        },
        "/v1/runs/{run_id}/cancel": {
            "post": {
                "summary": "Cancel a run",
                "security": auth,
                "parameters": [_RUN_ID],
                "requestBody": {
                    "content": {
                        _JSON: {
                            "schema": {
                                "type": "object",
                                "properties": {"reason": {"type": "string"}},
                            }
                        }
                    }
                },
                "responses": {
                    "202": _body(refs["CancelAnswer"], "stored"),
                    **_problems(400, 401, 403, 404, 409, 413, 415, 503),
                },
            }
        },
        "/v1/runs/{run_id}/fork": {
            "post": {
                "summary": "Fork a run: a new run that reuses its history before a position "
                "and executes from there (the `start` action; the run is not changed)",
                "security": auth,
                "parameters": [
                    _RUN_ID,
                    _param("Idempotency-Key", "header", "the fork's run id: one fork per key"),
                ],
                "requestBody": {
                    "content": {
                        _JSON: {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "from_step": {"type": "integer", "minimum": 0},
                                    "from_failure": {"type": "boolean"},
                                    "input": _ANY_JSON,
                                    "signal": {"type": "string"},
                                    "payload": _ANY_JSON,
                                },
                            }
                        }
                    }
                },
                "responses": {
                    "201": _body(refs["StartAnswer"], "created"),
                    "200": _body(refs["StartAnswer"], "it existed (the same Idempotency-Key)"),
                    "202": _body(refs["StartAnswer"], "stored; no worker has taken it yet"),
                    **_problems(400, 401, 403, 404, 413, 415, 422, 503),
                },
            }
        },
        "/v1/runs/{run_id}/terminate": _control(
            "Terminate a run: a cancel without compensation",
            {"reason": {"type": "string"}},
            auth,
        ),
        "/v1/runs/{run_id}/resume": _control(
            "Resume a suspended run", {"note": {"type": "string"}}, auth
        ),
        "/v1/runs/{run_id}/pause": _control(
            "Hold a run at its next step", {"reason": {"type": "string"}}, auth
        ),
        "/v1/runs/{run_id}/unpause": _control(
            "Lift a run's pause", {"note": {"type": "string"}}, auth
        ),
        "/v1/agents/{agent}/{verb}": {
            "post": {
                "summary": "Hold every run of an agent at its next step, or let them go on "
                "(admin only)",
                "security": auth,
                "parameters": [
                    _param("agent", "path", "the agent's name"),
                    _param("verb", "path", "pause or unpause"),
                ],
                "requestBody": {
                    "content": {
                        _JSON: {
                            "schema": {
                                "type": "object",
                                "properties": {"reason": {"type": "string"}},
                            }
                        }
                    }
                },
                "responses": {
                    "200": _body(
                        {"type": "object"},
                        "the agent's hold (agent, paused) and, for an unpause, how many held "
                        "runs it resumed (resumed)",
                    ),
                    **_problems(400, 401, 403, 404, 413, 415, 503),
                },
            }
        },
        "/v1/runs/{run_id}/budget": _control(
            "Set limits of a run's budget (the others stay); a run suspended on one resumes",
            {b: {"type": "number", "minimum": 0} for b in BUDGET_LIMITS},
            auth,
        ),
        "/v1/schedules/{name}/{verb}": {
            "post": {
                "summary": "Pause or resume a schedule (admin only)",
                "security": auth,
                "parameters": [
                    _param("name", "path", "the schedule's name"),
                    _param("verb", "path", "pause or resume"),
                ],
                "responses": {
                    "200": _body({"type": "object"}, "the schedule's record after it"),
                    **_problems(400, 401, 403, 404, 503),
                },
            }
        },
        "/v1/runs/{run_id}/events": _events_of_run(
            "The run's views as they change (server-sent events `view`, then `end`; `id` is "
            "the view's last_seq, Last-Event-ID resumes after it)",
            after="skip views up to this last_seq",
            resume="resume after this id",
            events="`event: view` with a RunView, then `event: end`",
            security=auth,
        ),
        "/v1/runs/{run_id}/stream": _events_of_run(
            "The run's output chunks (server-sent events `chunk`, then `end`; `id` is the "
            "chunk's offset, Last-Event-ID resumes after it)",
            after="only chunks after this offset",
            resume="resume after this offset",
            events="`event: chunk` with an output chunk and its offset",
            security=auth,
        ),
        "/v1/callbacks/{token}": {
            "post": {
                "summary": "Deliver the callback token's one signal to its run (no bearer "
                "token: the callback token is the credential; a repeat is the same signal)",
                "parameters": [_param("token", "path", "the token `ctx.callback` gave the run")],
                "requestBody": {"content": {_JSON: {"schema": _ANY_JSON}}},
                "responses": {
                    "200": _body(refs["CallbackAnswer"], "delivered (every repeat answers so)"),
                    **_problems(400, 401, 404, 409, 410, 413, 415, 503),
                },
            }
        },
        "/v1/webhooks/{route}/{token}": {
            "post": {
                "summary": "A signed webhook (the route's HMAC scheme) delivering a callback "
                "token's signal",
                "parameters": [
                    _param("route", "path", "the webhook route's name (--webhook)"),
                    _param("token", "path", "the token `ctx.callback` gave the run"),
                ],
                "requestBody": {"content": {_JSON: {"schema": _ANY_JSON}}},
                "responses": {
                    "200": _body(refs["CallbackAnswer"], "delivered"),
                    **_problems(400, 401, 404, 409, 410, 413, 415, 503),
                },
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sojourn gateway",
            "version": "1",
            "description": "sojourn's client API over HTTP. Errors are problem documents "
            f"(RFC 9457) whose type is {PROBLEM_TYPE}<code>.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
