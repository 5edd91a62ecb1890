"""Package layering, read from the source with ``ast`` (nothing is imported).

schemas <- broker <- actors, and projections beside actors: ``schemas`` imports nothing of ours,
``broker`` only ``schemas``, ``projections`` never ``actors``. Folders are import names only
through the ``sojourn.`` prefix, and wire data is decoded in one module (``schemas/codec.py``).

The broker is an opaque façade: nats-py is imported under ``broker/`` only, and no broker module
re-exports a nats-py name (a direct get's answer is a ``StoredMessage``, not nats' ``Msg``). The
pure modules (every module of ``schemas``, the fold, the journal, the replay machine, retry
policies and the projections' judgements) do no I/O: they import neither ``asyncio`` nor
``sojourn.broker`` nor ``nats``, so they can be tested, and reasoned about, without a server or
an event loop. Every module under ``actors/core/`` is pure. The client side (``actors/client/``)
imports nothing from the worker (``actors/worker/``). The name rules are ``schemas/names.py``:
the CLI, the gateway and the core take them from there, never from the broker.
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
    "actors/agents/agent.py",
}

# Folders whose code may not import nats-py (only broker/ may).
NATS_FREE = ("actors", "projections", "schemas", "examples", "bench")

# Files outside broker/ that import nats, each with its reason; the test fails on any new one
# and on an entry that no longer applies.
NATS_ALLOWED = {
    "bench/util.py": "reports the nats-py version the raw-JetStream floor was measured with",
    "bench/readside.py": "the read side's raw floors: an ordered consumer's read of the events "
    "stream and plain core subscribers, which the broker façade does not offer",
    "bench/pull.py": "nats-py's own fetch, the raw floor and what sojourn used before "
    "broker/pull.py, measured beside the façade's",
    "bench/worker_path.py": "hooks nats-py's transport writes and message dispatch, the only "
    "places that see an append leave and a message arrive, to time a worker's path",
}

# Folders whose every module does no I/O (checked on its own imports): schemas/ and the actors'
# pure core (the fold, the journal, the replay machine, retry policies, membership, schedule
# fire times).
PURE_FOLDERS = ("schemas", "actors/core")

# Modules outside the pure folders that do no I/O. A listed module that does not exist fails
# the test: a rename must update the list.
PURE_MODULES = (
    "projections/summary.py",
    "projections/views.py",
    "projections/anomaly.py",
    "projections/liveness.py",
    "projections/retention.py",
    "projections/tables.py",
    "projections/queries.py",
)
IMPURE = ("asyncio", "nats", "sojourn.broker")

# Known impure imports of pure modules, (file, imported name) -> reason; the test fails on any
# new one and on an entry that no longer applies.
IMPURE_ALLOWED: dict[tuple[str, str], str] = {}

# The name rules (token patterns, validators, reserved run ids) live in schemas/names.py: these
# folders validate names without importing the broker for a regex (``Names``, the subjects and
# streams of a deployment, stays in broker/names.py).
NAME_RULES = "schemas/names.py"
NAME_RULE_USERS = ("actors/cli", "actors/gateway", "actors/core")

# The client side never imports the host: a program that only starts and watches runs loads
# no worker code.
CLIENT_FOLDER = "actors/client"
WORKER_PACKAGE = "sojourn.actors.worker"


@dataclass(frozen=True)
class Imported:
    file: str  # relative to the project root, e.g. "actors/core/state.py"
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


def nats_violations(rel: str, source: str) -> list[str]:
    """Imports of nats-py in ``rel``, however written; none count under ``broker/``."""
    if rel.split("/")[0] == "broker":
        return []
    return [
        f"{imp.file}:{imp.line} imports {imp.target}"
        for imp in imports_in(rel, source)
        if imp.level == 0 and within(imp.target, "nats")
    ]


def nats_exports(rel: str, source: str) -> list[str]:
    """Names in ``rel``'s ``__all__`` that it imported from nats-py (a nats type re-exported)."""
    tree = ast.parse(source, filename=rel)
    from_nats = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and not node.level
        if within(node.module or "", "nats")
        for a in node.names
    }
    exported = [
        elt.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        and isinstance(node.value, ast.List | ast.Tuple)
        for elt in node.value.elts
        if isinstance(elt, ast.Constant) and isinstance(elt.value, str)
    ]
    return [f"{rel} exports {name}, a nats-py name" for name in exported if name in from_nats]


def impure_imports(rel: str, source: str) -> list[Imported]:
    """What ``rel`` imports that does I/O: ``asyncio``, ``nats`` or ``sojourn.broker``."""
    return [imp for imp in imports_in(rel, source) if any(within(imp.target, p) for p in IMPURE)]


def files_in(folders: tuple[str, ...]) -> dict[str, str]:
    found = {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for folder in folders
        for path in sorted((ROOT / folder).rglob("*.py"))
    }
    for folder in folders:  # a moved tree would otherwise pass vacuously
        assert f"{folder}/__init__.py" in found, f"no package at {ROOT / folder}"
    return found


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


def test_only_the_broker_imports_nats() -> None:
    found = {rel: v for rel, src in files_in(NATS_FREE).items() if (v := nats_violations(rel, src))}
    new = {rel: v for rel, v in found.items() if rel not in NATS_ALLOWED}
    assert new == {}, "go through sojourn.broker (Delivery, PublishAck, BROKER_ERRORS, ...)"
    assert set(NATS_ALLOWED) - set(found) == set(), "stale allow-list entry: remove it"


def test_the_broker_reexports_no_nats_name() -> None:
    bad = [v for rel, src in files_in(("broker",)).items() for v in nats_exports(rel, src)]
    assert bad == [], "wrap it (Delivery, StoredMessage, PublishAck, ...): none leaves the broker"


def _pure_sources() -> list[str]:
    for folder in PURE_FOLDERS:  # a moved folder would otherwise pass vacuously
        assert (ROOT / folder / "__init__.py").exists(), f"no package at {ROOT / folder}"
    return [
        *(
            p.relative_to(ROOT).as_posix()
            for folder in PURE_FOLDERS
            for p in sorted((ROOT / folder).rglob("*.py"))
        ),
        *PURE_MODULES,
    ]


@pytest.mark.parametrize("rel", _pure_sources())
def test_pure_modules_do_no_io(rel: str) -> None:
    path = ROOT / rel
    if not path.exists():
        assert rel in PURE_MODULES
        pytest.fail(f"{rel} is listed as pure but does not exist: update PURE_MODULES")
    found = {imp.target: imp for imp in impure_imports(rel, path.read_text(encoding="utf-8"))}
    allowed = {target for (file, target) in IMPURE_ALLOWED if file == rel}
    new = [f"{imp.file}:{imp.line} imports {t}" for t, imp in found.items() if t not in allowed]
    assert new == [], "a pure module imports neither asyncio nor sojourn.broker nor nats"
    assert allowed - set(found) == set(), "stale allow-list entry: remove it"


def test_the_impure_allow_list_names_pure_modules() -> None:
    pure = set(_pure_sources())
    assert {file for (file, _) in IMPURE_ALLOWED} - pure == set()


def worker_imports(rel: str, source: str) -> list[str]:
    """What ``rel`` imports from the worker package (``sojourn.actors.worker``)."""
    return [
        f"{imp.file}:{imp.line} imports {imp.target}"
        for imp in imports_in(rel, source)
        if within(imp.target, WORKER_PACKAGE)
    ]


def name_rules() -> frozenset[str]:
    """The names ``schemas/names.py`` exports (its ``__all__``, read with ``ast``)."""
    tree = ast.parse((ROOT / NAME_RULES).read_text(), filename=NAME_RULES)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return frozenset(ast.literal_eval(node.value))
    raise AssertionError(f"{NAME_RULES} has no __all__")


def broker_name_rule_imports(rel: str, source: str, rules: frozenset[str]) -> list[str]:
    """What ``rel`` imports of the name rules from the broker (``sojourn.broker.names.<rule>``,
    ``sojourn.broker.<rule>``, or the ``sojourn.broker.names`` module to reach one through)."""
    bad = []
    for imp in imports_in(rel, source):
        head, _, name = imp.target.rpartition(".")
        if (head in ("sojourn.broker.names", "sojourn.broker") and name in rules) or (
            imp.target == "sojourn.broker.names"
        ):
            bad.append(f"{imp.file}:{imp.line} imports {imp.target}")
    return bad


def test_name_rules_come_from_schemas() -> None:
    rules = name_rules()
    assert {"validate_token", "TOKEN_PATTERN", "reserved_run_id", "SCHEDULED_RUN_ID"} <= rules
    users = files_in(NAME_RULE_USERS)
    bad = [v for rel, src in users.items() for v in broker_name_rule_imports(rel, src, rules)]
    assert bad == [], "import the name rules from sojourn.schemas.names, not from the broker"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from sojourn.broker.names import validate_token\n", True),
        ("from sojourn.broker.names import Names, TOKEN_PATTERN\n", True),
        ("from sojourn.broker import validate_token\n", True),
        ("from sojourn.broker import names\n", True),
        ("import sojourn.broker.names\n", True),
        ("def f():\n    from ...broker.names import reserved_run_id\n", True),
        ("from sojourn.broker.names import Names\n", False),
        ("from sojourn.schemas.names import validate_token, SCHEDULED_RUN_ID\n", False),
        ("from sojourn.broker import Broker\n", False),
    ],
)
def test_broker_name_rule_imports_are_caught(source: str, found: bool) -> None:
    found_here = broker_name_rule_imports("actors/cli/x.py", source, name_rules())
    assert bool(found_here) is found


def test_the_client_imports_nothing_of_the_worker() -> None:
    client = files_in((CLIENT_FOLDER,))
    bad = [v for rel, src in client.items() for v in worker_imports(rel, src)]
    assert bad == [], "the client side loads no worker code: move what it needs out of worker/"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from ..worker.intake import Intake\n", True),
        ("from ..worker import activation\n", True),
        ("from .. import worker\n", True),
        ("if TYPE_CHECKING:\n    from sojourn.actors.worker.worker import Worker\n", True),
        ("from ..history.pending import PendingRun\n", False),
        ("from sojourn.actors.core.state import RunState\n", False),
    ],
)
def test_worker_imports_are_caught(source: str, found: bool) -> None:
    assert bool(worker_imports("actors/client/x.py", source)) is found


# --- the checker itself can fail --------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("schemas/events.py", "from sojourn.broker import names\n"),
        ("schemas/events.py", "import sojourn.actors.core.state\n"),
        ("schemas/sub/x.py", "from ...actors import state\n"),  # relative, escaping schemas
        ("schemas/x.py", "from .. import actors\n"),
        ("broker/eventstore.py", "from sojourn.actors.core.state import fold\n"),
        ("broker/eventstore.py", "from sojourn.projections import x\n"),
        ("broker/x.py", "def f():\n    from sojourn.actors import state\n"),
        ("projections/x.py", "from sojourn.actors.client.client import Client\n"),
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
    ("rel", "source"),
    [
        ("actors/x.py", "import nats\n"),
        ("actors/x.py", "import nats.errors\n"),
        ("actors/x.py", "from nats.errors import TimeoutError as NatsTimeoutError\n"),
        ("projections/x.py", "def f():\n    import nats.aio.client\n"),
        ("schemas/x.py", "if TYPE_CHECKING:\n    from nats.aio.msg import Msg\n"),
        ("examples/x.py", "from nats import connect\n"),
        ("bench/x.py", "import nats as n\n"),
    ],
)
def test_nats_imports_are_caught(rel: str, source: str) -> None:
    assert nats_violations(rel, source)


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("broker/x.py", "import nats\nfrom nats.aio.msg import Msg\n"),
        ("actors/x.py", "from sojourn.broker import BROKER_ERRORS, Delivery\n"),
        ("actors/x.py", "import natsort\nfrom sojourn.broker.names import Names\n"),
    ],
)
def test_other_imports_are_not_nats(rel: str, source: str) -> None:
    assert nats_violations(rel, source) == []


@pytest.mark.parametrize(
    ("source", "leaks"),
    [
        ('from nats.aio.msg import Msg\n__all__ = ["Broker", "Msg"]\n', True),
        ('from nats.aio.msg import Msg as M\n__all__ = ("M",)\n', True),
        ('from nats.aio.msg import Msg\n__all__ = ["Delivery"]\n', False),
        ('from .delivery import StoredMessage\n__all__ = ["StoredMessage"]\n', False),
    ],
)
def test_nats_reexports_are_caught(source: str, leaks: bool) -> None:
    assert bool(nats_exports("broker/x.py", source)) is leaks


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("actors/core/state.py", "import asyncio\n"),
        ("actors/core/machine.py", "from asyncio import sleep\n"),
        ("schemas/x.py", "import asyncio.subprocess\n"),
        ("actors/core/journal.py", "from sojourn.broker.names import Names\n"),
        ("actors/core/replay.py", "if TYPE_CHECKING:\n    from sojourn.broker import Broker\n"),
        ("projections/summary.py", "from ..broker import leases\n"),
        ("projections/liveness.py", "from sojourn import broker\n"),
        ("actors/core/retry.py", "def f():\n    import nats\n"),
    ],
)
def test_impure_imports_are_caught(rel: str, source: str) -> None:
    assert impure_imports(rel, source)


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("actors/core/state.py", "import msgspec\nfrom sojourn.schemas.events import RunEvent\n"),
        ("projections/liveness.py", "from sojourn.schemas.wire import LeaseHolder\n"),
        ("actors/core/retry.py", "import random\nfrom collections.abc import Awaitable\n"),
        ("actors/core/journal.py", "from .state import OpRecord\nimport asyncio_extras\n"),
    ],
)
def test_pure_imports_pass(rel: str, source: str) -> None:
    assert impure_imports(rel, source) == []


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
