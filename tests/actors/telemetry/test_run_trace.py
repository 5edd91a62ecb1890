"""The proof of issue 29: one run, one trace, across processes, a killed worker and replay.

A run is started over HTTP through a real ``sojourn gateway`` with a caller's
``traceparent``; it runs two steps, a model request (``ScriptedModel``), a child run and a
wait for a signal, on real ``sojourn worker`` processes that export over OTLP/HTTP to the
test's own receiver (``otlp.py``: the protobuf the real exporter sends, decoded). Its worker
is SIGKILLed in the middle of the second step, and the run resumes on another worker.

What can be known of the killed worker: it dies with its batch of unexported spans and its
activation span open, so neither is ever exported (the test does not wait for them). The
attempt it was running is not lost to the trace: the worker that runs the step again emits
it, from its recorded start, marked ``lost``, under the id every worker derives for it, and
the retry is marked ``retry_of=lost``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import httpx
import pytest

from sojourn.actors import Client
from sojourn.actors.agents.callbacks import generate_key_file_text
from sojourn.broker import EmbeddedServer
from sojourn.schemas.config import Settings
from tests.actors.gateway.conftest import CLIENT_TOKEN, Files, start_gateway
from tests.conftest import PYTHON, ROOT, subprocess_env, wait_for

from .otlp import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.usefixtures("processes")

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
SENDER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN = "00f067aa0ba902b7"


class CliWorker:
    """``sojourn worker --app tests.apps.traced`` in its own process, its output in a file."""

    def __init__(self, nats: str, prefix: str, worker_id: str, log: Path, **env: str) -> None:
        self.log = log
        self.out = log.open("wb")
        self.proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "sojourn.actors.cli",
                "worker",
                "--app",
                "tests.apps.traced",
                "--nats",
                nats,
                "--prefix",
                prefix,
                "--worker-id",
                worker_id,
                "--log-format",
                "json",
            ],
            cwd=ROOT,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            env=subprocess_env(**env),
        )

    async def ready(self) -> CliWorker:
        async def said_ready() -> bool:
            assert self.proc.poll() is None, self.log.read_text()
            return b"ready" in self.log.read_bytes()

        await wait_for(said_ready, timeout=60, what="the worker to be ready")
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.out.close()

    def stop(self) -> None:
        """SIGTERM: the worker stops, and its SDK exports what it holds as the process ends."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.out.close()


def one(spans: list[ReceivedSpan]) -> ReceivedSpan:
    assert len(spans) == 1, spans
    return spans[0]


@pytest.mark.timeout(300)
async def test_a_run_is_one_trace_across_a_killed_worker(
    nats_server: EmbeddedServer, settings: Settings, client: Client, tmp_path: Path
) -> None:
    receiver = await OtlpReceiver().start()
    hold = tmp_path / "hold"
    hold.mkdir()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "SOJOURN_TEST_HOLD_DIR": str(hold),
    }
    for gone in ("OTEL_SERVICE_NAME", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"):
        os.environ.pop(gone, None)  # (the test's own environment must not steer the SDK)
    (tmp_path / "tokens").write_text(f"{CLIENT_TOKEN} client ada\n")
    (tmp_path / "keys").write_text(generate_key_file_text("k1"))
    files = Files(tmp_path / "tokens", tmp_path / "keys")
    gateway = await start_gateway(nats_server, settings, files, **env)
    url = nats_server.url
    first = await CliWorker(url, settings.prefix, "wa", tmp_path / "wa.log", **env).ready()
    second: CliWorker | None = None
    run_id = "traced-1"
    try:
        async with httpx.AsyncClient(
            base_url=gateway.url, headers={"Authorization": f"Bearer {CLIENT_TOKEN}"}, timeout=30
        ) as http:
            started = await http.post(
                "/v1/agents/traced/runs",
                json=3,
                headers={
                    "Idempotency-Key": run_id,
                    "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
                    "tracestate": "vendor=opaque",
                },
            )
            assert started.status_code in (201, 202), started.text

            async def held_once() -> bool:
                return (hold / "started-1").exists()

            await wait_for(held_once, timeout=90, what="the second step to start")

            async def exported_so_far() -> bool:
                names = {s.name for s in receiver.spans}
                return {"chat scripted-mini", "run traced_child", "first"} <= names

            # What the first worker did before the held step is exported before it dies.
            await wait_for(exported_so_far, timeout=60, what="the first spans exported")
            second = await CliWorker(url, settings.prefix, "wb", tmp_path / "wb.log", **env).ready()
            first.kill()

            async def held_again() -> bool:
                return (hold / "started-2").exists()

            await wait_for(held_again, timeout=120, what="the step to run again elsewhere")
            (hold / "release").write_text("")
            sent = await http.post(
                f"/v1/runs/{run_id}/signals/go",
                json=1,
                headers={"traceparent": f"00-{SENDER_TRACE}-{SENDER_SPAN}-01"},
            )
            assert sent.status_code == 202, sent.text
        result = await client.result(run_id, timeout=120)
    finally:
        first.kill()
        if second is not None:
            second.stop()
        gateway.stop()

    async def whole() -> bool:
        return bool(receiver.named("run traced")) and bool(receiver.named("POST signal"))

    await wait_for(whole, timeout=60, what="the run's span exported")
    await receiver.stop()
    spans = receiver.spans

    # One trace: the caller's. (The signal's request is in its sender's trace.)
    gateway_start = one([s for s in receiver.named("POST start")])
    assert gateway_start.trace_id == CALLER_TRACE and gateway_start.parent_id == CALLER_SPAN
    assert gateway_start.service == "sojourn-gateway"
    assert gateway_start.attributes["http.response.status_code"] in (201, 202)
    in_run = [s for s in spans if s.name != "POST signal"]
    assert {s.trace_id for s in in_run} == {CALLER_TRACE}
    by_id = {s.span_id: s for s in spans}
    # No span twice: neither replay nor the take-over duplicated one.
    assert [k for k, n in Counter(s.span_id for s in spans).items() if n > 1] == []

    # The run's span: once, the child of the request that started it.
    run = one(receiver.named("run traced"))
    assert run.parent_id == gateway_start.span_id
    assert run.attributes["sojourn.run.status"] == "completed"
    assert run.service == "sojourn-worker"

    # Activations are children of the run span; the killed worker's last one is never
    # exported (it died with it), the others are.
    activations = receiver.named("activation traced")
    assert all(a.parent_id == run.span_id for a in activations)
    workers = {str(a.attributes["sojourn.worker"]).split(".")[0] for a in activations}
    assert workers == {"wa", "wb"}

    # Every step attempt once, each under an activation of its run.
    attempts = [s for s in spans if "sojourn.step.position" in s.attributes]
    parent_runs = {s.span_id: s.attributes.get("sojourn.run.id") for s in spans}
    keys = Counter(
        (
            s.attributes["sojourn.run.id"],
            s.attributes["sojourn.step.position"],
            s.attributes["sojourn.step.attempt"],
        )
        for s in attempts
    )
    assert all(n == 1 for n in keys.values()), keys
    for s in attempts:
        assert by_id[s.parent_id].name.startswith("activation ")
        assert parent_runs[s.parent_id] == s.attributes["sojourn.run.id"]
    step_one = one(receiver.named("first"))
    assert step_one.attributes["sojourn.step.outcome"] == "completed"
    assert step_one.attributes["sojourn.step.idempotency_key"] == f"{run_id}/0"
    # The step code ran with its attempt's span as the current OpenTelemetry context.
    assert result["first"][1] == f"{CALLER_TRACE}/{step_one.span_id}"

    # The killed attempt and its retry, both, marked.
    held = sorted(receiver.named("held"), key=lambda s: s.attributes["sojourn.step.attempt"])
    assert [s.attributes["sojourn.step.attempt"] for s in held] == [1, 2]
    lost, retry = held
    assert lost.attributes["sojourn.step.outcome"] == "lost" and lost.status == 2
    assert lost.service == "sojourn-worker"
    assert by_id[lost.parent_id].attributes["sojourn.worker"].startswith("wb")
    assert retry.attributes["sojourn.step.outcome"] == "completed"
    assert retry.attributes["sojourn.step.retry_of"] == "lost"
    assert result["held"][1] == f"{CALLER_TRACE}/{retry.span_id}"
    assert lost.start < retry.start

    # The model request, with the GenAI conventions' attributes and its token counts.
    chat = one(receiver.named("chat scripted-mini"))
    assert chat.attributes["gen_ai.request.model"] == "scripted-mini"
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 2  # "summarize 4"
    assert chat.attributes["gen_ai.usage.output_tokens"] == 8  # the answer's words
    assert chat.attributes["sojourn.usage.usd"] > 0

    # The child run: its spans in the same trace, its run span under its parent's child span.
    child_start = one(receiver.named("child traced_child"))
    assert by_id[child_start.parent_id].name == "activation traced"
    child_run = one(receiver.named("run traced_child"))
    assert child_run.parent_id == child_start.span_id
    assert child_run.attributes["sojourn.run.parent_id"] == run_id
    assert one(receiver.named("double")).attributes["sojourn.run.id"] == f"{run_id}-c2"

    # The signal's delivery, linked to its sender's span, under the wait that took it.
    delivery = one(receiver.named("signal go"))
    gateway_signal = one(receiver.named("POST signal"))
    assert gateway_signal.trace_id == SENDER_TRACE and gateway_signal.parent_id == SENDER_SPAN
    assert delivery.links == ((SENDER_TRACE, gateway_signal.span_id),)
    assert delivery.attributes["sojourn.signal.sender"] == "ada"
    assert by_id[delivery.parent_id].name == "wait signal:go"
    assert by_id[delivery.parent_id].parent_id == run.span_id
    assert result["go"] == 1
