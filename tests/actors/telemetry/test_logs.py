"""``--log-format json`` and the trace ids on log records (``sojourn.actors.telemetry.logs``)."""

from __future__ import annotations

import json
import logging

from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from sojourn.actors.telemetry.logs import JsonFormatter, TextFormatter, TraceIds

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331


def _record(message: str) -> logging.LogRecord:
    record = logging.LogRecord("sojourn.worker", logging.WARNING, __file__, 1, message, (), None)
    TraceIds().filter(record)
    return record


def test_json_lines_carry_the_current_spans_ids() -> None:
    span = NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, False, TraceFlags(1)))
    token = context.attach(trace.set_span_in_context(span))
    try:
        inside = _record('a step failed: "quoted"\nand a new line')
    finally:
        context.detach(token)
    line = JsonFormatter().format(inside)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "warning" and doc["logger"] == "sojourn.worker"
    assert doc["message"] == 'a step failed: "quoted"\nand a new line'
    assert doc["trace_id"] == f"{TRACE_ID:032x}" and doc["span_id"] == f"{SPAN_ID:016x}"
    assert doc["time"].endswith("Z")
    text = TextFormatter().format(inside)
    assert text.endswith(f"trace_id={TRACE_ID:032x} span_id={SPAN_ID:016x}")


def test_outside_a_span_there_are_no_ids() -> None:
    outside = _record("idle")
    assert "trace_id" not in json.loads(JsonFormatter().format(outside))
    assert "trace_id=" not in TextFormatter().format(outside)
