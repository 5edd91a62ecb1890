"""``GET /v1/runs/{id}/steps``: a run's step list and spend from the read side (decision 0040).

The projector's ``RunSteps`` record (``sojourn.schemas.steps``): the latest ``STEPS_KEPT``
steps with their timings, attempts, retries, last error, outcome and in-doubt decision, the
count of all, and what the run used of every budget kind against its limit. Read with the
``read`` action, like a run's status; ``404 unknown_run`` when the read side holds none.
"""

from __future__ import annotations

import logging
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sojourn.schemas.errors import BrokerUnavailable, InvalidName
from sojourn.schemas.gateway import GatewayAction
from sojourn.schemas.names import validate_token

from ..client.client import Client
from ._auth import Caller
from ._http import HttpProblem, json_response, problem_response

__all__ = ["StepsHost", "steps_route"]

log = logging.getLogger("sojourn.gateway")


class StepsHost(Protocol):
    """What the route needs of the gateway."""

    client: Client

    def _authorize(self, request: Request, action: GatewayAction) -> Caller: ...


def steps_route(host: StepsHost) -> Route:
    """The route, bound to ``host``."""

    async def steps(request: Request) -> Response:
        try:
            host._authorize(request, "read")
            run_id = str(request.path_params["run_id"])
            try:
                validate_token(run_id, "run_id")
            except InvalidName as e:
                raise HttpProblem("invalid_run_id", e.message) from None
            record = await host.client.steps(run_id)
            if record is None:
                raise HttpProblem(
                    "unknown_run",
                    f"the read side holds no steps of run '{run_id}' (is a projector running?)",
                    run_id=run_id,
                )
            return json_response(record)
        except HttpProblem as p:
            return problem_response(p)
        except BrokerUnavailable as e:
            return problem_response(HttpProblem("unavailable", str(e)))
        except Exception:
            log.exception("GET %s failed", request.url.path)
            return problem_response(HttpProblem("internal", "the gateway failed; see its log"))

    return Route("/v1/runs/{run_id}/steps", steps, methods=["GET"])
