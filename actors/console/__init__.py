"""The web console (docs/console.md): pages under ``/ui/`` served by the gateway, a run's
timeline, the approvals inbox, schedules, workers and dead letters, and the actions a signed-in
role may take. The pages are static files shipped in the wheel (Preact and htm, vendored:
docs/decisions/0036-the-web-console.md); everything they show comes from the gateway."""

from .routes import console_routes
from .timeline import Timeline, timeline_of

__all__ = ["Timeline", "console_routes", "timeline_of"]
