"""Package layering, read from the source with ``ast`` (nothing is imported).

schemas <- broker <- actors, and projections beside actors: ``schemas`` imports nothing of ours,
``broker`` only ``schemas``, ``projections`` never ``actors``. Folders are import names only
through the ``sojourn.`` prefix, and wire data is decoded in one module (``schemas/codec.py``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("schemas", "broker", "projections", "actors")
CODEC = "schemas/codec.py"

# Building a msgspec JSON decoder outside the codec module. Known exceptions, each with its
# reason; the test fails on any new one and on an entry that no longer applies.
DECODER_ALLOWED = {
    # The agent's input type is a user annotation, only known to the actor layer.
    "actors/agent.py",
    # Lease bodies are messages of the leases stream, private to it (LeaseHolder).
    "broker/leases.py",
}


@dataclass(frozen=True)
class Imported:
    file: str  # relative to the project root, e.g. "actors/state.py"
    line: int
    target: str  # absolute dotted name: "sojourn.schemas.events.RunEvent", "msgspec", ...
    level: int  # 0 for an absolute import


def module_of(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["sojourn", *parts])


def imports_in(rel: str, source: str) -> list[Imported]:
    tree = ast.parse(source, filename=rel)
    module = module_of(rel)
    package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
    out: list[Imported] = []
    for node in ast.walk(tree):  # includes imports inside functions and TYPE_CHECKING blocks
        if isinstance(node, ast.Import):
            out.extend(Imported(rel, node.lineno, a.name, 0) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            for a in node.names:
                target = origin if a.name == "*" else f"{origin}.{a.name}"
                out.append(Imported(rel, node.lineno, target, node.level))
    return out


def within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def layer_violations(rel: str, source: str) -> list[str]:
    folder = rel.split("/")[0]
    bad = []
    for imp in imports_in(rel, source):
        where = f"{imp.file}:{imp.line} imports {imp.target}"
        if imp.level == 0 and imp.target.split(".")[0] in FOLDERS:
            bad.append(f"{where} (a folder name: import it as sojourn.{imp.target})")
        if not within(imp.target, "sojourn"):
            continue
        if folder == "schemas" and not within(imp.target, "sojourn.schemas"):
            bad.append(f"{where} (schemas imports nothing of ours)")
        elif folder == "broker" and not any(
            within(imp.target, p) for p in ("sojourn.schemas", "sojourn.broker")
        ):
            bad.append(f"{where} (broker imports only sojourn.schemas)")
        elif folder == "projections" and within(imp.target, "sojourn.actors"):
            bad.append(f"{where} (projections never imports sojourn.actors)")
    return bad


def msgspec_json_uses(rel: str, source: str, attr: str) -> list[str]:
    """Lines of ``rel`` that reach ``msgspec.json.<attr>``, however msgspec was imported."""
    tree = ast.parse(source, filename=rel)
    aliases: dict[str, str] = {}
    hits = []
    wanted = f"msgspec.json.{attr}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                aliases[a.asname or a.name] = full
                if full == wanted:
                    hits.append(f"{rel}:{node.lineno} imports {wanted}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name) and isinstance(node.ctx, ast.Load):
            dotted = _dotted(node)
            if dotted is None:
                continue
            head, _, rest = dotted.partition(".")
            resolved = ".".join(filter(None, [aliases.get(head, head), rest]))
            if resolved == wanted and (isinstance(node, ast.Attribute) or head in aliases):
                hits.append(f"{rel}:{node.lineno} uses {wanted}")
    return hits


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def sources() -> dict[str, str]:
    found = {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
    }
    for folder in FOLDERS:  # a moved tree would otherwise pass vacuously
        assert f"{folder}/__init__.py" in found, f"no package at {ROOT / folder}"
    return found


# --- the rules, on the code -------------------------------------------------------------------


def test_layers() -> None:
    bad = [v for rel, src in sources().items() for v in layer_violations(rel, src)]
    assert bad == []


def test_only_the_codec_calls_msgspec_json_decode() -> None:
    bad = [
        hit
        for rel, src in sources().items()
        if rel != CODEC
        for hit in msgspec_json_uses(rel, src, "decode")
    ]
    assert bad == []


def test_msgspec_json_decoders_live_in_the_codec() -> None:
    uses = {rel for rel, src in sources().items() if msgspec_json_uses(rel, src, "Decoder")}
    assert uses - DECODER_ALLOWED - {CODEC} == set(), "decode wire data in schemas/codec.py"
    assert DECODER_ALLOWED - uses == set(), "stale allow-list entry: remove it"


# --- the checker itself can fail --------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("schemas/events.py", "from sojourn.broker import names\n"),
        ("schemas/events.py", "import sojourn.actors.state\n"),
        ("schemas/sub/x.py", "from ...actors import state\n"),  # relative, escaping schemas
        ("schemas/x.py", "from .. import actors\n"),
        ("broker/eventstore.py", "from sojourn.actors.state import fold\n"),
        ("broker/eventstore.py", "from sojourn.projections import x\n"),
        ("broker/x.py", "def f():\n    from sojourn.actors import state\n"),
        ("projections/x.py", "from sojourn.actors.client import Client\n"),
        ("projections/x.py", "from ..actors import client\n"),
        ("projections/x.py", "if TYPE_CHECKING:\n    import sojourn.actors\n"),
        ("actors/x.py", "import schemas\n"),
        ("actors/x.py", "from broker.names import Names\n"),
        ("actors/x.py", "from actors.state import fold\n"),
        ("projections/x.py", "import actors.state as s\n"),
    ],
)
def test_layer_violations_are_caught(rel: str, source: str) -> None:
    assert layer_violations(rel, source)


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("schemas/codec.py", "from .events import RunEvent\nfrom .wire import StartTrigger\n"),
        ("schemas/__init__.py", "from .codec import encode\n"),
        ("schemas/x.py", "import msgspec\nfrom sojourn.schemas.errors import SojournError\n"),
        ("broker/x.py", "from sojourn.schemas.codec import encode\nfrom .names import Names\n"),
        ("projections/x.py", "from sojourn.broker import Broker\nfrom sojourn.schemas import x\n"),
        ("actors/x.py", "from sojourn.broker.names import Names\nfrom .state import fold\n"),
        ("actors/x.py", "import json\nimport nats\n"),
    ],
)
def test_allowed_imports_pass(rel: str, source: str) -> None:
    assert layer_violations(rel, source) == []


@pytest.mark.parametrize(
    "source",
    [
        "import msgspec\nmsgspec.json.decode(b'1')\n",
        "import msgspec\nf = msgspec.json.decode\n",
        "import msgspec.json\nmsgspec.json.decode(b'1')\n",
        "import msgspec.json as mj\nmj.decode(b'1')\n",
        "from msgspec import json\njson.decode(b'1')\n",
        "from msgspec import json as j\nj.decode(b'1')\n",
        "from msgspec.json import decode\n",
        "def f():\n    import msgspec\n    return msgspec.json.decode(b'1', type=int)\n",
    ],
)
def test_msgspec_json_decode_is_found_however_imported(source: str) -> None:
    assert msgspec_json_uses("actors/x.py", source, "decode")


@pytest.mark.parametrize(
    "source",
    [
        "import json\njson.decode = None\njson.loads('1')\n",  # the stdlib module
        "import msgspec\nmsgspec.json.encode(1)\nmsgspec.convert({}, int)\n",
        "from sojourn.schemas.codec import decode_events\ndecode_events(b'[]')\n",
        "decode = 1\nprint(decode)\n",
    ],
)
def test_other_calls_are_not_msgspec_json_decode(source: str) -> None:
    assert msgspec_json_uses("actors/x.py", source, "decode") == []
