"""``actors/telemetry/_otel.py`` is the one module of the library that imports OpenTelemetry
(read from the source, as ``tests/test_layering.py`` reads it: nothing is imported)."""

from __future__ import annotations

from tests.test_layering import imports_in, sources, within

OTEL_ROOM = "actors/telemetry/_otel.py"


def otel_imports(rel: str, source: str) -> list[str]:
    return [
        f"{rel}:{i.line} imports {i.target}"
        for i in imports_in(rel, source)
        if within(i.target, "opentelemetry")
    ]


def test_only_the_telemetry_room_imports_opentelemetry() -> None:
    found = [
        v for rel, src in sources().items() if rel != OTEL_ROOM for v in otel_imports(rel, src)
    ]
    assert found == []
    assert otel_imports(OTEL_ROOM, sources()[OTEL_ROOM]), "the room itself imports it"


def test_an_import_elsewhere_is_caught() -> None:
    assert otel_imports("actors/worker/x.py", "from opentelemetry import trace\n")
    assert otel_imports("actors/core/x.py", "def f():\n    import opentelemetry.sdk.trace\n")
    assert not otel_imports("actors/worker/x.py", "from sojourn.actors import telemetry\n")
