"""sojourn.projections: read models built from run events.

- ``summary``: the compact per-run fold (``RunSummary``), pure;
- ``views``: a run's ``RunView`` from its summary, pure;
- ``model``: the run model that follows the streams (the watchdog's and the projector's);
- ``liveness`` / ``anomaly``: judgements made from it, pure;
- ``projector``: run views in the runs KV bucket and change messages (``sojourn projector``),
  with its parts ``viewstore``, ``leadership``, ``snapshots``, ``pending``, ``rebuild`` and
  ``sink`` (what it hands a read model);
- ``sqlite``: the SQLite read model the projector feeds, its ``tables`` and ``queries``.

Imports ``sojourn.schemas`` and ``sojourn.broker``, never ``sojourn.actors``.
"""

__all__: list[str] = []
