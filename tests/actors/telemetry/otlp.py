"""An OTLP/HTTP trace receiver of the tests' own: a small asyncio HTTP/1.1 server that takes
what the real OpenTelemetry exporter POSTs on ``/v1/traces`` (protobuf, gzip or not) and
decodes it with ``opentelemetry-proto``, keeping every span it received, in order."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

BODY_MAX = 64 << 20


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it (ids in hex, times in nanoseconds)."""

    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    start: int
    end: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    status: int
    """0 unset, 1 ok, 2 error."""


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    _server: asyncio.Server | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> OtlpReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, _, v = line.partition(":")
                        headers[k.strip().lower()] = v.strip()
                size = int(headers.get("content-length", "0"))
                assert size <= BODY_MAX
                body = await reader.readexactly(size)
                if headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if method == "POST" and path == "/v1/traces":
                    self._take(body)
                    answer = ExportTraceServiceResponse().SerializeToString()
                    status = "200 OK"
                else:
                    answer, status = b"", "404 Not Found"
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\n"
                    f"Content-Length: {len(answer)}\r\n\r\n".encode()
                    + answer
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.requests += 1
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = str(resource.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        ReceivedSpan(
                            service=service,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            name=s.name,
                            kind=s.kind,
                            start=s.start_time_unix_nano,
                            end=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in s.links),
                            status=s.status.code,
                        )
                    )

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]
