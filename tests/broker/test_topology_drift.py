"""Stream and consumer drift: sojourn creates what is missing, never rewrites what exists,
logs a difference in a tunable key, refuses to start on one in a key it relies on, and
``sojourn topology`` reports both while ``--apply`` fixes them."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker.drift import (
    compare_consumer,
    compare_stream,
    consumer_finding,
    reconciled,
    stream_finding,
)
from sojourn.broker.registry import AgentRecord, AgentRegistry
from sojourn.broker.topology import (
    TopologyMismatch,
    agent_wake_consumer_config,
    consumer_configs,
    ensure_topology,
    fire_consumer_config,
    inspect_topology,
    optional_keys,
    stream_configs,
)
from sojourn.schemas.config import Settings
from sojourn.schemas.priority import PRIORITIES
from tests.actors.cli.test_cli import sojourn

_NS = 1_000_000_000
NAMES = Names("drift")
SETTINGS = Settings(prefix="drift")
STREAMS = stream_configs(NAMES, SETTINGS)
CONSUMERS = consumer_configs(NAMES, SETTINGS)


# --- the pure comparison -------------------------------------------------------------------------


@given(st.sampled_from(STREAMS))
def test_a_stream_as_configured_has_no_diffs(cfg: dict[str, Any]) -> None:
    assert compare_stream(cfg, dict(cfg)) == ()
    assert stream_finding(cfg, dict(cfg)).state == "ok"
    assert stream_finding(cfg, None).state == "missing"
    reordered = {**cfg, "subjects": list(reversed(cfg["subjects"]))}
    assert compare_stream(cfg, reordered) == ()  # subjects are a set


RELIED = ["retention", "storage", "deny_delete", "deny_purge", "allow_direct", "subjects"]


@given(st.sampled_from(STREAMS), st.sampled_from(RELIED))
def test_a_key_sojourn_relies_on_makes_it_incompatible(cfg: dict[str, Any], key: str) -> None:
    other: dict[str, Any] = {
        "retention": "interest",
        "storage": "memory",
        "deny_delete": not cfg.get("deny_delete", False),
        "deny_purge": not cfg.get("deny_purge", False),
        "allow_direct": False,
        "subjects": [*cfg["subjects"], "elsewhere.>"],
    }
    live = {**cfg, key: other[key]}
    f = stream_finding(cfg, live)
    if key not in cfg:  # a key sojourn does not set is not compared
        assert f.state == "ok"
        return
    relied = not (key.startswith("deny_") and cfg[key] is False)  # a protection added: fine
    assert f.state == ("incompatible" if relied else "drift")
    assert [(d.key, d.ours, d.theirs, d.relied) for d in f.diffs] == [
        (key, cfg[key], other[key], relied)
    ]
    fixed = reconciled(cfg, live, f.diffs)
    assert stream_finding(cfg, fixed).state == ("ok" if relied else "drift")


@given(st.sampled_from(STREAMS), st.integers(2, 5), st.booleans())
def test_tunable_keys_are_drift_and_kept_by_reconcile(
    cfg: dict[str, Any], replicas: int, compress: bool
) -> None:
    live = {**cfg, "num_replicas": replicas}
    ours = {**cfg, "compression": "none"} if compress else cfg
    if compress:
        live["compression"] = "s2"
    f = stream_finding(ours, live)
    assert f.state == "drift" and all(not d.relied for d in f.diffs)
    assert reconciled(ours, live, f.diffs) == live  # an operator's tuning stays


@given(st.sampled_from(STREAMS), st.sampled_from([False, None]))
def test_atomic_publish_is_optional_on_the_events_stream_only_and_apply_turns_it_on(
    cfg: dict[str, Any], theirs: bool | None
) -> None:
    if not cfg.get("allow_atomic"):
        return
    live = {k: v for k, v in cfg.items() if k != "allow_atomic"}
    if theirs is not None:
        live["allow_atomic"] = theirs
    optional = optional_keys(NAMES, cfg["name"])
    f = stream_finding(cfg, live, optional)
    # The events stream works without it (appends one by one): drift, a worker starts. The
    # projector's streams rely on it.
    events = cfg["name"] == NAMES.events_stream
    assert f.state == ("drift" if events else "incompatible")
    assert [d.key for d in f.diffs] == ["allow_atomic"]
    assert reconciled(cfg, live, f.diffs)["allow_atomic"] is True  # --apply turns it on


@hsettings(max_examples=50)
@given(st.integers(1, 10**6), st.integers(1, 10**6))
def test_the_dedup_window_is_a_floor(ours: int, theirs: int) -> None:
    cfg = {**STREAMS[0], "duplicate_window": ours * _NS}
    diffs = compare_stream(cfg, {**cfg, "duplicate_window": theirs * _NS})
    if ours == theirs:
        assert diffs == ()
    else:
        assert [d.relied for d in diffs] == [theirs < ours]


@given(st.integers(1, 10**6))
def test_limits_sojourn_leaves_unlimited_are_relied_on_finite_ones_tunable(hours: int) -> None:
    events = next(c for c in STREAMS if c["name"] == NAMES.events_stream)
    dlq = next(c for c in STREAMS if c["name"] == NAMES.dlq_stream)
    age = hours * 3600 * _NS
    assert [d.relied for d in compare_stream(events, {**events, "max_age": age})] == [True]
    assert [d.relied for d in compare_stream(events, {**events, "max_bytes": age})] == [True]
    assert [d.relied for d in compare_stream(dlq, {**dlq, "max_age": age})] in ([], [False])


@given(st.sampled_from(CONSUMERS), st.integers(1, 10**6), st.integers(1, 100))
def test_consumer_keys(pair: tuple[str, dict[str, Any]], pending: int, deliver: int) -> None:
    stream, cfg = pair
    assert consumer_finding(stream, cfg, dict(cfg)).state == "ok"
    tuned = {**cfg, "max_ack_pending": pending, "ack_wait": cfg["ack_wait"] + _NS}
    assert consumer_finding(stream, cfg, tuned).state == "drift"
    capped = {**cfg, "max_deliver": deliver}  # wakes would stop being redelivered
    assert consumer_finding(stream, cfg, capped).state == "incompatible"
    assert consumer_finding(stream, cfg, {**cfg, "ack_policy": "none"}).state == "incompatible"
    assert [d.key for d in compare_consumer(cfg, {**cfg, "ack_policy": "all"})] == ["ack_policy"]


# --- against a server ----------------------------------------------------------------------------


@pytest.fixture
async def broker(nats_server: EmbeddedServer) -> Any:
    b = await Broker.connect(nats_server.url)
    try:
        yield b
    finally:
        await b.close()


async def _config(b: Broker, stream: str) -> dict[str, Any]:
    cfg = await b.stream_config(stream)
    assert cfg is not None
    return cfg


async def test_created_then_left_alone(broker: Broker, settings: Settings) -> None:
    names = Names(settings.prefix)
    first = await ensure_topology(broker, names, settings)
    assert {f.state for f in first} == {"created"}
    assert len(first) == len(stream_configs(names, settings)) + len(
        consumer_configs(names, settings)
    )
    again = await ensure_topology(broker, names, settings)
    assert {f.state for f in again} == {"ok"}, [f for f in again if f.state != "ok"]
    assert {f.state for f in await inspect_topology(broker, names, settings)} == {"ok"}


async def _operator_tunes(b: Broker, names: Names) -> None:
    """A tunable change (the DLQ kept 3 days), one sojourn relies on (no direct gets on the
    inbox), and a consumer capped at 5 deliveries."""
    dlq = await _config(b, names.dlq_stream)
    await b.api(f"$JS.API.STREAM.UPDATE.{names.dlq_stream}", {**dlq, "max_age": 3 * 86400 * _NS})
    inbox = await _config(b, names.inbox_stream)
    await b.api(f"$JS.API.STREAM.UPDATE.{names.inbox_stream}", {**inbox, "allow_direct": False})
    consumer = await b.consumer_config(names.inbox_stream, names.intake_consumer)
    assert consumer is not None
    await b.api(
        f"$JS.API.CONSUMER.CREATE.{names.inbox_stream}.{names.intake_consumer}",
        {
            "stream_name": names.inbox_stream,
            "config": {**consumer, "max_deliver": 5, "max_ack_pending": 77},
            "action": "update",
        },
    )


async def test_drift_is_logged_incompatibility_refuses_to_start_and_apply_fixes(
    broker: Broker, nats_server: EmbeddedServer, settings: Settings, caplog: Any
) -> None:
    names = Names(settings.prefix)
    await ensure_topology(broker, names, settings)
    dlq = await _config(broker, names.dlq_stream)
    await broker.api(
        f"$JS.API.STREAM.UPDATE.{names.dlq_stream}", {**dlq, "max_age": 3 * 86400 * _NS}
    )
    with caplog.at_level(logging.INFO, logger="sojourn.broker"):
        found = await ensure_topology(broker, names, settings)  # a worker start
        await ensure_topology(broker, names, settings)  # and another: logged once
    drifted = [f for f in found if f.state == "drift"]
    assert [f.stream for f in drifted] == [names.dlq_stream]
    assert (await _config(broker, names.dlq_stream))["max_age"] == 3 * 86400 * _NS  # left
    logged = [r.getMessage() for r in caplog.records if names.dlq_stream in r.getMessage()]
    assert len(logged) == 1 and "max_age" in logged[0] and "tunable" in logged[0]

    await _operator_tunes(broker, names)
    with pytest.raises(TopologyMismatch) as caught:
        await ensure_topology(broker, names, settings)
    msg = caught.value.message
    assert names.inbox_stream in msg and "allow_direct" in msg
    assert "sojourn's True, the server's False" in msg
    assert f"consumer {names.inbox_stream}/{names.intake_consumer}" in msg
    assert "max_deliver" in msg and "max_ack_pending" not in msg
    assert f"sojourn topology --apply --prefix {settings.prefix}" in msg
    assert not (await _config(broker, names.inbox_stream))["allow_direct"]  # untouched

    base = ["topology", "--nats", nats_server.url, "--prefix", settings.prefix]
    res = await sojourn(*base)
    assert res.rc == 1, res
    assert f"incompatible  stream {names.inbox_stream}" in res.out
    assert f"drift         stream {names.dlq_stream}" in res.out
    assert "allow_direct: sojourn true, server false (relied on)" in res.out
    assert "max_ack_pending: sojourn 10000, server 77 (tunable)" in res.out
    assert "fix with: sojourn topology --apply" in res.out
    res = await sojourn(*base, "--json")
    assert res.rc == 1
    report = json.loads(res.out)
    states = {(f["stream"], f["consumer"]): f["state"] for f in report["findings"]}
    assert report["ok"] is False
    assert states[(names.inbox_stream, None)] == "incompatible"
    assert states[(names.inbox_stream, names.intake_consumer)] == "incompatible"
    assert states[(names.dlq_stream, None)] == "drift"

    res = await sojourn(*base, "--apply")
    assert res.rc == 0, res
    assert (await _config(broker, names.inbox_stream))["allow_direct"] is True
    assert (await _config(broker, names.dlq_stream))["max_age"] == 3 * 86400 * _NS  # kept
    consumer = await broker.consumer_config(names.inbox_stream, names.intake_consumer)
    assert consumer is not None
    assert consumer["max_deliver"] == -1 and consumer["max_ack_pending"] == 77
    found = await ensure_topology(broker, names, settings)  # starts again
    assert {f.state for f in found} <= {"ok", "drift"}
    res = await sojourn(*base)
    assert res.rc == 0, res


async def test_missing_is_reported_and_applied(
    broker: Broker, nats_server: EmbeddedServer, settings: Settings
) -> None:
    base = ["topology", "--nats", nats_server.url, "--prefix", settings.prefix]
    res = await sojourn(*base)
    assert res.rc == 1 and "missing" in res.out, res
    res = await sojourn(*base, "--apply", "--json")
    assert res.rc == 0, res
    assert json.loads(res.out)["ok"] is True


async def test_a_worker_with_another_dedup_window(broker: Broker, settings: Settings) -> None:
    """A longer window than a worker's is fine (drift); a shorter one breaks idempotency."""
    names = Names(settings.prefix)
    await ensure_topology(broker, names, settings)
    shorter = Settings(prefix=settings.prefix, lease_ttl=2.0, dedup_window=60.0)
    found = await ensure_topology(broker, names, shorter)
    assert {f.stream for f in found if f.state == "drift"} >= {names.events_stream}
    longer = Settings(prefix=settings.prefix, lease_ttl=2.0, dedup_window=600.0)
    with pytest.raises(TopologyMismatch, match="duplicate_window"):
        await ensure_topology(broker, names, longer)


async def test_a_worker_refuses_to_start_on_an_incompatible_stream(
    broker: Broker, nats_server: EmbeddedServer, settings: Settings
) -> None:
    names = Names(settings.prefix)
    await ensure_topology(broker, names, settings)
    wake = await _config(broker, names.wake_stream)
    await broker.api(
        f"$JS.API.STREAM.UPDATE.{names.wake_stream}", {**wake, "max_msgs_per_subject": 5}
    )
    res = await sojourn(
        "worker", "--app", "tests.apps.cli_agents", "--nats", nats_server.url,
        "--prefix", settings.prefix,
    )  # fmt: skip
    assert res.rc == 1, res
    err = res.err.strip().splitlines()[-1]
    assert err.startswith("error: refusing to start: stream"), err
    assert names.wake_stream in err and "max_msgs_per_subject: sojourn's 1, the server's 5" in err
    assert f"sojourn topology --apply --prefix {settings.prefix}" in err
    assert (await _config(broker, names.wake_stream))["max_msgs_per_subject"] == 5


async def test_the_report_covers_every_registered_agents_wake_consumer(
    broker: Broker, nats_server: EmbeddedServer, settings: Settings
) -> None:
    names = Names(settings.prefix)
    await ensure_topology(broker, names, settings)
    for agent in ("alpha", "beta"):
        await AgentRegistry(broker, names).register(AgentRecord(name=agent))
    for p in PRIORITIES:  # a lane each; beta's worker never started
        alpha = agent_wake_consumer_config(names, settings, "alpha", p)
        await broker.ensure_consumer(names.wake_stream, alpha)
    await broker.ensure_consumer(
        names.schedules_stream, fire_consumer_config(names, settings, "alpha")
    )
    base = ["topology", "--nats", nats_server.url, "--prefix", settings.prefix, "--json"]
    res = await sojourn(*base)
    report = json.loads(res.out)
    states = {f["consumer"]: f["state"] for f in report["findings"] if f["consumer"]}
    # (drift: the test's settings have another lease_ttl, so another ack_wait, than the CLI's)
    assert states["wake-alpha"] in ("ok", "drift") and states["wake-beta"] == "missing", states
    assert states["wakep1-alpha"] in ("ok", "drift") and states["wakep5-beta"] == "missing"
    assert states["fire-alpha"] in ("ok", "drift") and states["fire-beta"] == "missing", states
    assert res.rc == 1
    res = await sojourn(*base, "--agent", "alpha")  # only the named ones
    states = {f["consumer"]: f["state"] for f in json.loads(res.out)["findings"] if f["consumer"]}
    assert "wake-beta" not in states and "fire-beta" not in states and res.rc == 0, res
