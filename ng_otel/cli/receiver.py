"""A small OTLP receiver: gRPC and HTTP/protobuf on 127.0.0.1.

``ng-otel demo`` uses it when no collector is configured, writing what arrives as OTLP JSON
lines (the format of the Collector's ``otlpjsonfile`` receiver); the test suite uses it as
the real OTLP server the real exporters send to. It can refuse (UNAVAILABLE / 503) to play a
collector in trouble.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ng_otel.otel import names

_LAYOUT = {
    "traces": ("resource_spans", "scope_spans", "spans"),
    "metrics": ("resource_metrics", "scope_metrics", "metrics"),
    "logs": ("resource_logs", "scope_logs", "log_records"),
}
_HEX_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def otlp_json(message: Any) -> Any:
    """The OTLP/JSON form of a request: protobuf JSON, except that trace and span ids are hex
    strings (the OTLP JSON encoding), not base64."""
    return _hex_ids(MessageToDict(message))


def _hex_ids(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: base64.b64decode(value).hex() if key in _HEX_ID_KEYS and isinstance(value, str) else _hex_ids(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids(item) for item in node]
    return node


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(any_value(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return {item.key: any_value(item.value) for item in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def attributes(items: Any) -> dict[str, Any]:
    return {item.key: any_value(item.value) for item in items}


class OtlpReceiver:
    """Collects every OTLP export request it receives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.refuse = False
        self.delay = 0.0  # seconds each export waits before it is answered: a slow collector
        self.export_calls = 0
        self._grpc: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, grpc_port: int = 0, http_port: int = 0) -> OtlpReceiver:
        """Listen on 127.0.0.1 (port 0: any free port); a restarted collector passes the old ports."""
        receiver = self

        def store(kind: str, request: Any, context: Any, response: Any) -> Any:
            if receiver.delay:
                time.sleep(receiver.delay)
            with receiver._lock:
                receiver.export_calls += 1
                if receiver.refuse:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "refusing for the test")
                getattr(receiver, kind).append(request)
            return response

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                return store("traces", request, context, trace_service_pb2.ExportTraceServiceResponse())

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                return store("metrics", request, context, metrics_service_pb2.ExportMetricsServiceResponse())

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                return store("logs", request, context, logs_service_pb2.ExportLogsServiceResponse())

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._grpc)  # type: ignore[no-untyped-call]
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._grpc)  # type: ignore[no-untyped-call]
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), self._grpc)  # type: ignore[no-untyped-call]
        self.grpc_port = self._grpc.add_insecure_port(f"127.0.0.1:{grpc_port}")
        self._grpc.start()

        paths: dict[str, tuple[str, Any, Any]] = {
            "/v1/traces": (
                "traces",
                trace_service_pb2.ExportTraceServiceRequest,
                trace_service_pb2.ExportTraceServiceResponse,
            ),
            "/v1/metrics": (
                "metrics",
                metrics_service_pb2.ExportMetricsServiceRequest,
                metrics_service_pb2.ExportMetricsServiceResponse,
            ),
            "/v1/logs": ("logs", logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                route = paths.get(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if receiver.delay:
                    time.sleep(receiver.delay)
                with receiver._lock:
                    receiver.export_calls += 1
                    refuse = receiver.refuse
                if route is None or refuse:
                    self.send_response(404 if route is None else 503)
                    self.end_headers()
                    return
                kind, request_type, response_type = route
                request = request_type()
                request.ParseFromString(body)
                with receiver._lock:
                    getattr(receiver, kind).append(request)
                payload = response_type().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._http = ThreadingHTTPServer(("127.0.0.1", http_port), Handler)
        self.http_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=None)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def clear(self) -> None:
        with self._lock:
            self.traces.clear()
            self.metrics.clear()
            self.logs.clear()

    # -- what arrived ------------------------------------------------------------------

    def _items(self, signal: str) -> Iterator[tuple[Any, Any]]:
        """(service name, item) for every span, metric or log record of ``signal`` received."""
        with self._lock:
            requests = list(getattr(self, signal))
        resource_key, scope_key, item_key = _LAYOUT[signal]
        for request in requests:
            for resource in getattr(request, resource_key):
                service = attributes(resource.resource.attributes).get("service.name")
                for scope in getattr(resource, scope_key):
                    for item in getattr(scope, item_key):
                        yield service, item

    def spans(self) -> list[dict[str, Any]]:
        return [
            {
                "service": service,
                "name": span.name,
                "trace_id": span.trace_id.hex(),
                "span_id": span.span_id.hex(),
                "parent_span_id": span.parent_span_id.hex() or None,
                "status": span.status.code,
                "attributes": attributes(span.attributes),
                "events": [{"name": e.name, "attributes": attributes(e.attributes)} for e in span.events],
                "links": [
                    {
                        "trace_id": link.trace_id.hex(),
                        "span_id": link.span_id.hex(),
                        "attributes": attributes(link.attributes),
                    }
                    for link in span.links
                ],
            }
            for service, span in self._items("traces")
        ]

    def failure_events(self, event_name: str = names.EVENT) -> list[dict[str, Any]]:
        """Each failure event with the span it arrived on."""
        return [
            {**event["attributes"], "_span": span}
            for span in self.spans()
            for event in span["events"]
            if event["name"] == event_name
        ]

    def metric_points(self, name: str) -> list[dict[str, Any]]:
        """The latest cumulative value of each (service, attributes) series of ``name``."""
        latest: dict[tuple[Any, ...], dict[str, Any]] = {}
        for service, metric in self._items("metrics"):
            if metric.name != name:
                continue
            for point in metric.sum.data_points:
                labels = attributes(point.attributes)
                key = (service, tuple(sorted((k, str(v)) for k, v in labels.items())))
                value = point.as_int if point.HasField("as_int") else point.as_double
                latest[key] = {
                    "service": service,
                    "attributes": labels,
                    "value": value,
                    "exemplars": len(point.exemplars),
                }
        return list(latest.values())

    def log_records(self) -> list[dict[str, Any]]:
        return [
            {
                "event_name": record.event_name,
                "attributes": attributes(record.attributes),
                "trace_id": record.trace_id.hex(),
                "span_id": record.span_id.hex(),
            }
            for _, record in self._items("logs")
        ]

    def write_jsonl(self, path: Any) -> int:
        """Every request received so far as OTLP JSON, one per line; returns the line count."""
        with self._lock:
            requests = [*self.traces, *self.metrics, *self.logs]
        with open(path, "w", encoding="utf-8") as out:
            for request in requests:
                out.write(json.dumps(otlp_json(request), separators=(",", ":")) + "\n")
        return len(requests)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return predicate()
