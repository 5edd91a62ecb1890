"""Deployment settings shared by workers, clients and tools (closed: unknown keys are errors)."""

from __future__ import annotations

import msgspec

__all__ = ["Settings"]


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Knobs of one sojourn deployment.

    Attributes:
        prefix: subject/stream prefix; several deployments can share one NATS server.
        max_payload: largest accepted trigger or signal body in bytes (default 1 MiB).
        lease_ttl: seconds a worker owns a run without renewing; after it another worker
            may take the run over. Renewed every third of it while the run executes.
        dedup_window: seconds the broker remembers ``Nats-Msg-Id`` values.
        append_timeout: seconds an event append keeps retrying through a broker outage before
            the worker gives the run up (it is re-woken later, nothing is lost).
    """

    prefix: str = "sojourn"
    max_payload: int = 1024 * 1024
    lease_ttl: float = 30.0
    dedup_window: float = 120.0
    append_timeout: float = 60.0
