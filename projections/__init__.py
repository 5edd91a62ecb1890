"""sojourn.projections: read models built from run events (KV summaries, SQLite, watch APIs).

Imports ``sojourn.schemas`` and ``sojourn.broker``, never ``sojourn.actors``. The projector lands
with the observability work; today run status and history are read by folding the run's events
(``sojourn.actors.Client.state``), which is always exact.
"""

__all__: list[str] = []
