"""deploy/systemd and deploy/kubernetes: every ``sojourn ...`` command line in them parses with
the real argument parser, the probes point at paths the code serves on the port the command
sets, and the units and manifests hold what their READMEs promise (stop timeouts longer than a
process's stop, hardening, each process given its role's credentials and the key files it
reads and nothing more, a volume for the projector's SQLite file, the gateway's HTTP Service)."""

from __future__ import annotations

import argparse
import inspect
import ipaddress
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sojourn.actors import CallbackKeys, Worker
from sojourn.actors.agents.callbacks import CALLBACK_KEYS_ENV
from sojourn.actors.cli._gateway import TOKENS_ENV
from sojourn.actors.cli._parser import build_parser
from sojourn.actors.gateway import BearerTokens
from sojourn.actors.gateway._server import GRACE
from sojourn.actors.ops.health import Health, ProbeApp
from tests.conftest import ROOT

SYSTEMD = ROOT / "deploy" / "systemd"
KUBERNETES = ROOT / "deploy" / "kubernetes"
UNITS = {
    "sojourn-worker@.service": "worker",
    "sojourn-watchdog.service": "watchdog",
    "sojourn-projector.service": "projector",
    "sojourn-gateway.service": "gateway",
}
ROLES = {"worker": "worker", "projector": "worker", "watchdog": "watchdog", "gateway": "client"}
"""The NATS role each command connects as (docs/operations.md, Roles)."""
KEY_FILES = {
    "worker": {CALLBACK_KEYS_ENV: "callback-keys"},
    "gateway": {TOKENS_ENV: "gateway-tokens", CALLBACK_KEYS_ENV: "callback-keys"},
}
"""The files besides its NATS credentials each command reads, by the variable that names them:
one name for each file, the systemd credential and the Secret's key alike."""

_grace = inspect.signature(Worker.stop).parameters["grace"].default
WORKER_STOP_MAX = 3 * _grace + 2
"""The longest a worker's stop takes: its loops get ``grace`` to end, running activations
``grace`` to finish and the cancelled ones ``grace`` more, then about a second each for its
last heartbeat and closing the connection."""
GATEWAY_STOP_MAX = GRACE + 4
"""The longest a gateway's stop takes: open requests get ``GRACE``, then closing its NATS
connection takes up to about 3 s (measured: 7.2 s in all, 8.4 s with the server frozen)."""


def stop_max(command: str) -> float:
    """How long a supervisor must wait for ``command`` to stop (the watchdog and projector stop
    faster than a worker; the worker's bound is kept for them as the files promise it)."""
    return GATEWAY_STOP_MAX if command == "gateway" else WORKER_STOP_MAX


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` (without the program name) parsed by sojourn's own parser; a failure here is a
    flag the file uses that the command does not have."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"sojourn {shlex.join(argv)} does not parse (exit {e.code})") from e


def served(path: str) -> bool:
    """Whether the metrics port answers ``GET path`` with something other than 404."""
    got: list[str] = []
    app = ProbeApp(lambda _env, start: start("200 OK", []) or [b""], Health())
    list(app({"REQUEST_METHOD": "GET", "PATH_INFO": path}, lambda s, h: got.append(s)))
    return not got[0].startswith("404")


# --- systemd -------------------------------------------------------------------------------


def env_file() -> dict[str, str]:
    values: dict[str, str] = {}
    for n, line in enumerate((SYSTEMD / "sojourn.env").read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"(SOJOURN_[A-Z_]+)=(\S+)", line)
        assert m, f"sojourn.env:{n}: not KEY=value: {line!r}"
        values[m[1]] = m[2]
    return values


Unit = dict[str, dict[str, list[str]]]


def unit(name: str) -> Unit:
    """The unit's sections and their settings as systemd reads them: a setting given more than
    once (``LoadCredential=``, ``Environment=``) keeps every value, in order."""
    sections: Unit = {}
    section: dict[str, list[str]] | None = None
    for n, line in enumerate((SYSTEMD / name).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"{name}:{n}: no continuation lines here"
        if m := re.fullmatch(r"\[([A-Za-z]+)\]", line):
            assert m[1] not in sections, f"{name}:{n}: [{m[1]}] twice"
            section = sections[m[1]] = {}
            continue
        m = re.fullmatch(r"([A-Za-z]+)=(.*)", line)
        assert m and section is not None, f"{name}:{n}: not KEY=value in a section: {line!r}"
        section.setdefault(m[1], []).append(m[2])
    return sections


def one(section: dict[str, list[str]], key: str) -> str:
    """A setting that must be given exactly once."""
    (value,) = section[key]
    return value


SPECIFIERS = {"%i": "9301", "%H": "host1", "%d": "/run/credentials/x", "%S": "/var/lib"}


def expand(text: str, env: dict[str, str]) -> str:
    """``${VAR}`` from the environment file and the specifiers the units use, as systemd
    expands them; an unknown one fails."""

    def var(m: re.Match[str]) -> str:
        assert m[1] in env, f"${{{m[1]}}} is not set in sojourn.env"
        return env[m[1]]

    text = re.sub(r"\$\{([A-Za-z_]+)\}", var, text)
    for spec, value in SPECIFIERS.items():
        text = text.replace(spec, value)
    assert "%" not in text and "$" not in text, f"unexpanded in {text!r}"
    return text


def exec_start(name: str) -> list[str]:
    line = one(unit(name)["Service"], "ExecStart")
    return shlex.split(expand(line, env_file()))


@pytest.mark.parametrize(("name", "command"), UNITS.items())
def test_a_units_command_line_parses_with_the_real_parser(name: str, command: str) -> None:
    argv = exec_start(name)
    assert Path(argv[0]).name == "sojourn" and Path(argv[0]).is_absolute()
    args = parse(argv[1:])
    assert args.command == command
    assert args.metrics_port is not None and args.metrics_host == "127.0.0.1"
    if name.startswith("sojourn-worker@"):
        assert args.metrics_port == int(SPECIFIERS["%i"])  # the instance is the port
        assert args.app == env_file()["SOJOURN_APP"]
        assert args.worker_id == "host1-9301"
    if command == "projector":
        state = one(unit(name)["Service"], "StateDirectory")
        assert Path(args.sqlite).parent == Path("/var/lib") / state
    if command == "gateway":
        env = env_file()
        assert args.port == int(env["SOJOURN_GATEWAY_PORT"])
        assert args.host == env["SOJOURN_GATEWAY_HOST"]
        # Plain HTTP: the shipped example listens for a TLS proxy on the same host only.
        assert ipaddress.ip_address(args.host).is_loopback
        # The files come from the variables the unit points at its credentials; a flag would
        # override them.
        assert args.tokens is None and args.callback_keys is None
        # A socket per open request: the soft limit must not refuse connections before
        # --max-streams does.
        assert int(one(unit(name)["Service"], "LimitNOFILE")) > args.max_streams


@pytest.mark.parametrize("name", UNITS)
def test_a_unit_restarts_stops_and_is_hardened_as_documented(name: str) -> None:
    ini = unit(name)
    assert set(ini) == {"Unit", "Service", "Install"}
    svc = ini["Service"]
    assert one(svc, "EnvironmentFile") == "/etc/sojourn/sojourn.env"
    assert one(svc, "Restart") == "on-failure"
    assert one(svc, "KillSignal") == "SIGTERM"
    assert float(one(svc, "TimeoutStopSec")) > stop_max(UNITS[name])
    assert one(svc, "NoNewPrivileges") == "yes"
    assert one(svc, "ProtectSystem") == "strict"
    assert svc.get("DynamicUser") == ["yes"] or svc.get("User") == ["sojourn"]
    assert one(svc, "CapabilityBoundingSet") == ""
    assert "StartLimitBurst" in ini["Unit"] and "network-online.target" in one(ini["Unit"], "After")
    assert one(ini["Install"], "WantedBy") == "multi-user.target"


@pytest.mark.parametrize("name", UNITS)
def test_a_unit_hands_over_its_roles_credentials_and_its_key_files_and_nothing_else(
    name: str,
) -> None:
    command = UNITS[name]
    svc = unit(name)["Service"]
    loaded = [c.split(":", 1) for c in svc["LoadCredential"]]
    assert len({c[0] for c in loaded}) == len(loaded), "a credential id twice"
    files = KEY_FILES.get(command, {})
    assert dict(loaded) == {"nats.creds": f"/etc/sojourn/{ROLES[command]}.creds"} | {
        file: f"/etc/sojourn/{file}" for file in files.values()
    }
    # One assignment per line, each pointing at a credential the unit loads.
    env = [e.split("=", 1) for e in svc["Environment"]]
    assert len({e[0] for e in env}) == len(env), "a variable twice"
    assert dict(env) == {"SOJOURN_NATS_CREDS": "%d/nats.creds"} | {
        var: f"%d/{file}" for var, file in files.items()
    }
    # EnvironmentFile= overrides Environment=: sojourn.env must not set them too.
    assert not dict(env).keys() & env_file().keys()


def test_every_unit_has_its_own_ports_and_the_env_file_sets_only_used_keys() -> None:
    ports = [parse(exec_start(name)[1:]).metrics_port for name in UNITS]
    ports += [parse(exec_start(n)[1:]).port for n, c in UNITS.items() if c == "gateway"]
    assert len(set(ports)) == len(ports)
    used = "".join((SYSTEMD / name).read_text() for name in UNITS)
    for key in env_file():
        # Read by the commands from the environment, or expanded in a unit.
        assert key.startswith("SOJOURN_NATS_") or f"${{{key}}}" in used, key


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_units(processes: None, tmp_path: Path) -> None:
    """``systemd-analyze verify`` on the units, their ``sojourn`` being this environment's
    (the units name /opt/sojourn/venv/bin/sojourn, which it would otherwise miss)."""
    sojourn = Path(sys.executable).parent / "sojourn"
    assert sojourn.exists()
    for name in UNITS:
        text = (SYSTEMD / name).read_text().replace("/opt/sojourn/venv/bin/sojourn", str(sojourn))
        (tmp_path / name).write_text(text)
    targets = [str(tmp_path / n.replace("@.", "@9301.")) for n in UNITS]
    out = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *targets],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # Only complaints about these units count (the host's own units may have some).
    ours = [line for line in out.stderr.splitlines() if "sojourn-" in line]
    assert not ours, out.stderr


# --- Kubernetes ----------------------------------------------------------------------------


def manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path.name, doc


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == kind}


WORKLOADS = {
    "sojourn-worker": ("Deployment", "worker"),
    "sojourn-watchdog": ("Deployment", "watchdog"),
    "sojourn-projector": ("StatefulSet", "projector"),
    "sojourn-gateway": ("Deployment", "gateway"),
}


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """What a container sees: the ConfigMaps it loads, then its own ``env`` (field refs as a
    placeholder)."""
    env: dict[str, str] = {}
    maps = by_kind("ConfigMap")
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]]["data"])
    for var in container.get("env", []):
        env[var["name"]] = var.get("value", f"<{var['name']}>")
    return env


def k8s_argv(container: dict[str, Any]) -> list[str]:
    """The container's command with ``$(VAR)`` expanded, as the kubelet does."""
    env = container_env(container)

    def var(m: re.Match[str]) -> str:
        assert m[1] in env, f"$({m[1]}) is not defined for {container['name']}"
        return env[m[1]]

    return [re.sub(r"\$\(([A-Za-z_]+)\)", var, str(a)) for a in container["command"]]


def secret_volumes(pod: dict[str, Any], container: dict[str, Any]) -> dict[Path, dict[str, Any]]:
    """The Secret volumes the container mounts, by mount path (a claim template's volume is
    not among the pod's ``volumes``)."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {
        Path(m["mountPath"]): volumes[m["name"]]["secret"]
        for m in container["volumeMounts"]
        if "secret" in volumes.get(m["name"], {})
    }


def secret_key(pod: dict[str, Any], container: dict[str, Any], path: Path) -> str:
    """The key of the Secret ``sojourn-nats`` that the container sees as the file ``path``;
    fails unless the file is one."""
    secret = secret_volumes(pod, container)[path.parent]
    assert secret["secretName"] == "sojourn-nats"
    (key,) = [i["key"] for i in secret["items"] if i["path"] == path.name]
    return str(key)


def mounted_secret_keys(pod: dict[str, Any], container: dict[str, Any]) -> set[str]:
    """Every key of a Secret the container can read (a volume without ``items`` would mount
    them all: fails)."""
    keys: set[str] = set()
    for secret in secret_volumes(pod, container).values():
        assert "items" in secret, "a Secret mounted whole"
        keys.update(i["key"] for i in secret["items"])
    return keys


def test_the_manifests_are_the_documented_objects_in_one_namespace() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for _, d in manifests())
    assert kinds == [
        ("ConfigMap", "sojourn-settings"),
        ("Deployment", "sojourn-gateway"),
        ("Deployment", "sojourn-watchdog"),
        ("Deployment", "sojourn-worker"),
        ("Namespace", "sojourn"),
        ("Secret", "sojourn-nats"),
        ("Service", "sojourn-gateway"),
        ("Service", "sojourn-gateway-metrics"),
        ("Service", "sojourn-projector-metrics"),
        ("Service", "sojourn-watchdog-metrics"),
        ("Service", "sojourn-worker-metrics"),
        ("StatefulSet", "sojourn-projector"),
    ]
    for file, d in manifests():
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "sojourn", file
    listed = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(
        p.name for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml"
    )


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_workloads_command_probes_and_security_match_the_code(name: str) -> None:
    kind, command = WORKLOADS[name]
    obj = by_kind(kind)[name]
    pod = obj["spec"]["template"]["spec"]
    assert obj["spec"]["selector"]["matchLabels"].items() <= (
        obj["spec"]["template"]["metadata"]["labels"].items()
    )
    (container,) = pod["containers"]
    argv = k8s_argv(container)
    assert argv[0] == "sojourn"
    args = parse(argv[1:])
    assert args.command == command
    assert args.metrics_host == "0.0.0.0"  # the kubelet probes the pod's IP
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    http = {"http": args.port} if command == "gateway" else {}
    assert ports == {"metrics": args.metrics_port} | http
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and served(path)
        assert ports.get(get["port"], get["port"]) == args.metrics_port
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
    assert pod["terminationGracePeriodSeconds"] > pre_stop.get("seconds", 0) + stop_max(command)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {"requests", "limits"} <= container["resources"].keys()

    # The credentials file and key files it is told to use are mounted from the Secret's keys
    # of the same names, and no other key of the Secret is mounted into it.
    env = container_env(container)
    files = {"SOJOURN_NATS_CREDS": f"{ROLES[command]}.creds"} | KEY_FILES.get(command, {})
    secret = by_kind("Secret")["sojourn-nats"]["stringData"]
    assert {var: secret_key(pod, container, Path(env[var])) for var in files} == files
    assert set(files.values()) <= secret.keys()
    assert mounted_secret_keys(pod, container) == set(files.values())
    mounts = {m["name"]: Path(m["mountPath"]) for m in container["volumeMounts"]}

    if command == "projector":
        assert obj["spec"]["replicas"] >= 2  # several are safe: they elect one writer
        (claim,) = obj["spec"]["volumeClaimTemplates"]
        data = mounts[claim["metadata"]["name"]]
        assert Path(args.sqlite).parent == data
        assert obj["spec"]["serviceName"] in by_kind("Service")
    elif command in ("worker", "gateway"):
        assert obj["spec"]["replicas"] == 2
        assert obj["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    if command == "gateway":
        assert args.host == "0.0.0.0"  # its Service sends to the pod's IP
        assert pre_stop["seconds"] > 0  # endpoints are dropped while it stops accepting
        assert args.tokens is None and args.callback_keys is None  # the variables above


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_metrics_service_selects_its_pods_and_says_where_to_scrape(name: str) -> None:
    kind, _ = WORKLOADS[name]
    obj = by_kind(kind)[name]
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    port = parse(k8s_argv(container)[1:]).metrics_port
    (service,) = [
        s
        for s in by_kind("Service").values()
        if s["spec"]["selector"].items() <= obj["spec"]["template"]["metadata"]["labels"].items()
        and any(p["targetPort"] == "metrics" for p in s["spec"]["ports"])
    ]
    notes = service["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert int(notes["prometheus.io/port"]) == port
    assert notes["prometheus.io/path"] == "/metrics" and served("/metrics")
    (sport,) = service["spec"]["ports"]
    assert sport["port"] == port and sport["targetPort"] == "metrics"
    assert service["spec"]["clusterIP"] == "None"


def test_the_gateways_http_service_sends_port_80_to_its_listening_port() -> None:
    obj = by_kind("Deployment")["sojourn-gateway"]
    labels = obj["spec"]["template"]["metadata"]["labels"]
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    args = parse(k8s_argv(container)[1:])
    service = by_kind("Service")["sojourn-gateway"]
    assert service["spec"]["selector"].items() <= labels.items()
    # A virtual IP for an Ingress or load balancer in front (TLS ends there), not headless,
    # not exposed by itself, and not scraped: its metrics are the metrics Service's.
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert service["spec"].get("clusterIP") != "None"
    assert not any(
        k.startswith("prometheus.io/") for k in service["metadata"].get("annotations", {})
    )
    (port,) = service["spec"]["ports"]
    assert port["port"] == 80 and port["targetPort"] == "http"
    (target,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    assert target["containerPort"] == args.port == 8080


def test_the_secrets_placeholder_tokens_and_keys_are_refused_not_used() -> None:
    """Applying secret.yaml as it is must not give a gateway a bearer token, or a worker a
    signing key, that anyone can read in this repository."""
    data = by_kind("Secret")["sojourn-nats"]["stringData"]
    with pytest.raises(ValueError, match="16 to 512 characters"):
        BearerTokens.parse(data["gateway-tokens"])
    with pytest.raises(ValueError, match="at least 32 characters"):
        CallbackKeys.parse(data["callback-keys"])
