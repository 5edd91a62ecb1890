"""JSON Schemas exported for clients in other languages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

from sojourn.schemas.events import RunEvent
from sojourn.schemas.export import WIRE_SCHEMAS, export_schemas
from sojourn.schemas.vocabulary import BUDGET_LIMITS

GOLDEN = Path(__file__).with_name("golden_events.jsonl")
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def load(path: Path) -> dict[str, Any]:
    schema = json.loads(path.read_text())
    assert isinstance(schema, dict)
    return schema


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follow a local ``$ref`` (msgspec puts every struct in ``$defs``)."""
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/$defs/"), ref
        node = schema["$defs"][ref.removeprefix("#/$defs/")]
    return node


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for v in node.values() for r in refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in refs(v)]
    return []


def test_one_valid_file_per_wire_schema(tmp_path: Path) -> None:
    out = tmp_path / "nested" / "schemas"  # created on demand
    written = export_schemas(out)
    assert written == [out / f"{name}.schema.json" for name in WIRE_SCHEMAS]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)
    for name, path in zip(WIRE_SCHEMAS, written, strict=True):
        assert path.read_bytes().endswith(b"\n")
        schema = load(path)
        assert schema["$schema"] == DRAFT, name
        assert schema["title"] == name
        assert "$ref" in schema or "type" in schema or "anyOf" in schema, name
        for ref in refs(schema):
            resolve(schema, {"$ref": ref})  # every reference resolves


def test_export_is_deterministic(tmp_path: Path) -> None:
    first = {p.name: p.read_bytes() for p in export_schemas(tmp_path / "a")}
    second = {p.name: p.read_bytes() for p in export_schemas(tmp_path / "b")}
    assert first == second
    export_schemas(tmp_path / "a")  # overwriting is fine
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == first


def test_the_start_trigger_schema_is_closed_and_requires_input(tmp_path: Path) -> None:
    (path,) = [p for p in export_schemas(tmp_path) if p.name == "start-trigger.schema.json"]
    schema = load(path)
    trigger = resolve(schema, schema)
    assert trigger["type"] == "object"
    assert set(trigger["properties"]) == {
        "input",
        "run_id",
        "parent_run_id",
        "budget",
        "attributes",
        "fork",
        "singleton_key",
        "debounce",
        "concurrency",
    }
    assert trigger["required"] == ["input"]
    assert trigger["additionalProperties"] is False
    assert trigger["properties"]["input"] == {}  # any JSON value
    # a budget is closed too: a misspelt limit is refused, never silently no limit
    budget = resolve(schema, trigger["properties"]["budget"]["anyOf"][0])
    assert budget["additionalProperties"] is False
    assert set(budget["properties"]) == set(BUDGET_LIMITS)


def test_event_schemas_are_open_world_and_cover_every_tag(tmp_path: Path) -> None:
    export_schemas(tmp_path)
    tags = {cls.__struct_config__.tag for cls in get_args(RunEvent)}
    for name in ["run-event", "run-event-message"]:
        schema = load(tmp_path / f"{name}.schema.json")
        union = schema["items"] if name == "run-event-message" else schema
        assert set(union["discriminator"]["mapping"]) == tags
        assert union["discriminator"]["propertyName"] == "type"
        for tag, ref in union["discriminator"]["mapping"].items():
            event = resolve(schema, {"$ref": ref})
            assert event["properties"]["type"] == {"enum": [tag]}
            # Older readers must accept newer writers' extra fields.
            assert event.get("additionalProperties", True) is not False, tag


def test_golden_samples_carry_every_required_field(tmp_path: Path) -> None:
    """A small check of the exported event schema against the golden samples (no validator
    library is installed): each sample's tag is in the schema and its required fields are set."""
    export_schemas(tmp_path)
    schema = load(tmp_path / "run-event-message.schema.json")
    assert schema["type"] == "array"
    mapping = schema["items"]["discriminator"]["mapping"]
    for line in GOLDEN.read_text().splitlines():
        for obj in json.loads(line):
            event = resolve(schema, {"$ref": mapping[obj["type"]]})
            assert set(event["required"]) <= set(obj), obj["type"]
            assert set(obj) <= set(event["properties"]), obj["type"]
