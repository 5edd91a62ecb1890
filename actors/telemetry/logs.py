"""Log records for log pipelines: ``--log-format json`` (one JSON object a line) and the
current span's trace and span ids on every record (``trace_id``, ``span_id``) when the process
traces. Imports no OpenTelemetry unless something else did."""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["LOG_FORMATS", "JsonFormatter", "TextFormatter", "TraceIds", "setup_logging"]

LOG_FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TraceIds(logging.Filter):
    """Sets ``trace_id`` and ``span_id`` on each record (empty outside a span)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = None
        if "opentelemetry.trace" in sys.modules:
            from ._otel import current_ids

            ids = current_ids()
        record.trace_id, record.span_id = ids or ("", "")
        return True


class TextFormatter(logging.Formatter):
    """The usual line, with ``trace_id=... span_id=...`` after it inside a span."""

    def __init__(self) -> None:
        super().__init__(_TEXT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            line += f" trace_id={trace_id} span_id={getattr(record, 'span_id', '')}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a record: time (RFC 3339, UTC), level, logger, message, the trace and
    span ids inside a span, the exception's text if any."""

    def format(self, record: logging.LogRecord) -> str:
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, object] = {
            "time": f"{at}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            doc["trace_id"] = trace_id
            doc["span_id"] = getattr(record, "span_id", "")
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup_logging(level: str, log_format: str = "text") -> None:
    """The root logger on stderr at ``level``, as ``log_format`` says (``text`` or ``json``),
    with trace ids."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TraceIds())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])
