"""deploy/systemd and deploy/kubernetes: every ``sojourn ...`` command line in them parses with
the real argument parser, the probes point at paths the code serves on the port the command
sets, and the units and manifests hold what their READMEs promise (stop timeouts longer than a
worker's stop, hardening, a volume for the projector's SQLite file)."""

from __future__ import annotations

import argparse
import configparser
import inspect
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

from sojourn.actors import Worker
from sojourn.actors._health import Health, ProbeApp
from sojourn.actors.cli._parser import build_parser
from tests.conftest import ROOT

SYSTEMD = ROOT / "deploy" / "systemd"
KUBERNETES = ROOT / "deploy" / "kubernetes"
UNITS = {
    "sojourn-worker@.service": "worker",
    "sojourn-watchdog.service": "watchdog",
    "sojourn-projector.service": "projector",
}

_grace = inspect.signature(Worker.stop).parameters["grace"].default
WORKER_STOP_MAX = 3 * _grace + 2
"""The longest a worker's stop takes: its loops get ``grace`` to end, running activations
``grace`` to finish and the cancelled ones ``grace`` more, then about a second each for its
last heartbeat and closing the connection."""


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


def unit(name: str) -> configparser.ConfigParser:
    ini = configparser.ConfigParser(interpolation=None, strict=True, empty_lines_in_values=False)
    ini.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    ini.read_string((SYSTEMD / name).read_text(), source=name)
    return ini


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
    line = unit(name)["Service"]["ExecStart"]
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
        state = unit(name)["Service"]["StateDirectory"]
        assert Path(args.sqlite).parent == Path("/var/lib") / state


@pytest.mark.parametrize("name", UNITS)
def test_a_unit_restarts_stops_and_is_hardened_as_documented(name: str) -> None:
    ini = unit(name)
    assert set(ini.sections()) == {"Unit", "Service", "Install"}
    svc = ini["Service"]
    assert svc["EnvironmentFile"] == "/etc/sojourn/sojourn.env"
    assert svc["Restart"] == "on-failure"
    assert svc["KillSignal"] == "SIGTERM"
    assert float(svc["TimeoutStopSec"]) > WORKER_STOP_MAX
    assert svc["NoNewPrivileges"] == "yes"
    assert svc["ProtectSystem"] == "strict"
    assert svc.get("DynamicUser") == "yes" or svc.get("User") == "sojourn"
    assert svc["CapabilityBoundingSet"] == ""
    creds = svc["LoadCredential"].split(":", 1)
    assert svc["Environment"] == f"SOJOURN_NATS_CREDS=%d/{creds[0]}"
    role = "watchdog" if "watchdog" in name else "worker"
    assert creds[1] == f"/etc/sojourn/{role}.creds"
    assert "StartLimitBurst" in ini["Unit"] and "network-online.target" in ini["Unit"]["After"]
    assert ini["Install"]["WantedBy"] == "multi-user.target"


def test_every_unit_has_its_own_metrics_port_and_the_env_file_sets_only_used_keys() -> None:
    ports = [parse(exec_start(name)[1:]).metrics_port for name in UNITS]
    assert len(set(ports)) == len(ports)
    used = "".join((SYSTEMD / name).read_text() for name in UNITS)
    for key in env_file():
        # Read by the commands from the environment, or expanded in a unit.
        assert key.startswith("SOJOURN_NATS_") or f"${{{key}}}" in used, key


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_units(tmp_path: Path) -> None:
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


def test_the_manifests_are_the_documented_objects_in_one_namespace() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for _, d in manifests())
    assert kinds == [
        ("ConfigMap", "sojourn-settings"),
        ("Deployment", "sojourn-watchdog"),
        ("Deployment", "sojourn-worker"),
        ("Namespace", "sojourn"),
        ("Secret", "sojourn-nats"),
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
    assert ports == {"metrics": args.metrics_port}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and served(path)
        assert ports.get(get["port"], get["port"]) == args.metrics_port
    assert pod["terminationGracePeriodSeconds"] > WORKER_STOP_MAX
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {"requests", "limits"} <= container["resources"].keys()

    # The credentials file it is told to use is mounted from a key of the Secret.
    creds = Path(container_env(container)["SOJOURN_NATS_CREDS"])
    mounts = {m["name"]: Path(m["mountPath"]) for m in container["volumeMounts"]}
    volume = next(v for v in pod["volumes"] if mounts.get(v["name"]) == creds.parent)
    assert volume["secret"]["secretName"] == "sojourn-nats"
    keys = {i["path"]: i["key"] for i in volume["secret"]["items"]}
    assert keys[creds.name] in by_kind("Secret")["sojourn-nats"]["stringData"]
    role = "watchdog" if command == "watchdog" else "worker"
    assert creds.name == f"{role}.creds"

    if command == "projector":
        assert obj["spec"]["replicas"] >= 2  # several are safe: they elect one writer
        (claim,) = obj["spec"]["volumeClaimTemplates"]
        data = mounts[claim["metadata"]["name"]]
        assert Path(args.sqlite).parent == data
        assert obj["spec"]["serviceName"] in by_kind("Service")
    elif command == "worker":
        assert obj["spec"]["replicas"] == 2
        assert obj["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


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
    ]
    notes = service["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert int(notes["prometheus.io/port"]) == port
    assert notes["prometheus.io/path"] == "/metrics" and served("/metrics")
    (sport,) = service["spec"]["ports"]
    assert sport["port"] == port and sport["targetPort"] == "metrics"
    assert service["spec"]["clusterIP"] == "None"
