"""A small OTLP receiver: gRPC and HTTP/protobuf, on 127.0.0.1 unless told otherwise.

``ng-otel receive`` is this receiver in front of a terminal; ``ng-otel demo`` uses it when no
collector is configured, writing what arrives as OTLP JSON lines (the format of the
Collector's ``otlpjsonfile`` receiver); the test suite uses it as the real OTLP server the
real exporters send to. It can refuse (UNAVAILABLE / 503) to play a collector in trouble.

Whatever reaches it is outside input, so every request is bounded (``Limits``): body size,
decompressed size, time to read it, connections at once, gRPC message size and calls at once,
body bytes held at once; and what a request holds is counted before it is parsed (spans,
events, links, attributes, values: ``ItemLimits``), because an empty span is 2 bytes on the
wire and hundreds once decoded. At most ``MAX_DECODING_AT_ONCE`` requests are decoded at once,
so the receiver's memory has a bound whatever clients send. Input it cannot read is answered
400 (gRPC: INVALID_ARGUMENT), a request over a bound 413 (gRPC: RESOURCE_EXHAUSTED), never
with a traceback. OTLP/HTTP is served by aiohttp (``_receiver_http``), gRPC by grpcio.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ng_otel.cli._receiver_http import Answer, HttpServer
from ng_otel.cli._receiver_items import (
    MAX_ATTRIBUTES_PER_REQUEST,
    MAX_EVENTS_PER_REQUEST,
    MAX_LINKS_PER_REQUEST,
    MAX_SPANS_PER_REQUEST,
    MAX_VALUES_PER_REQUEST,
    ItemLimits,
    NotProtobuf,
    TooManyItems,
    count_items,
)
from ng_otel.otel import names

_log = logging.getLogger("ng_otel.receiver")

# The OpenTelemetry Collector's defaults: confighttp's max_request_body_size (20 MiB, which
# also bounds the decompressed body) and configgrpc's max_recv_msg_size_mib (4 MiB, gRPC's own).
MAX_BODY_BYTES = 20 * 1024 * 1024
MAX_DECOMPRESSED_BYTES = 20 * 1024 * 1024
MAX_GRPC_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_CONNECTION_SECONDS = 30.0  # from accept to the whole request read: a slow client holds no connection longer
MAX_HTTP_CONNECTIONS = 64  # HTTP connections served at once; more are answered 503
MAX_FIELD_BYTES = 8190  # a header's value (aiohttp's max_field_size, its default): one past is answered 400
# Request bodies read and not yet answered, all HTTP connections together: three whole bodies
# at the limit. One that would pass it is answered 503, which exporters retry.
MAX_BUFFERED_BODY_BYTES = 3 * MAX_BODY_BYTES
MAX_GRPC_CALLS_AT_ONCE = 8  # gRPC calls held at once (each up to 4 MiB); more are answered RESOURCE_EXHAUSTED
# Requests decoded at once (inflated, counted, parsed, made OTLP JSON, handed on), HTTP and
# gRPC together. The work is Python under one GIL, so a second at once buys no speed, and it
# would double the worst case: a request at every bound costs ~250 MiB while it is decoded
# (a 20 MiB body, 500,000 values parsed and made a dict and a JSON line).
MAX_DECODING_AT_ONCE = 1

Signal = str  # "traces", "metrics" or "logs"
OnRequest = Callable[[Signal, Any], None]


@dataclass(frozen=True)
class Limits:
    """What one request may cost the receiver; the defaults are the module's constants."""

    body_bytes: int = MAX_BODY_BYTES
    decompressed_bytes: int = MAX_DECOMPRESSED_BYTES
    grpc_message_bytes: int = MAX_GRPC_MESSAGE_BYTES
    connection_seconds: float = MAX_CONNECTION_SECONDS
    http_connections: int = MAX_HTTP_CONNECTIONS
    field_bytes: int = MAX_FIELD_BYTES
    buffered_body_bytes: int = MAX_BUFFERED_BODY_BYTES
    grpc_calls: int = MAX_GRPC_CALLS_AT_ONCE
    decoding_at_once: int = MAX_DECODING_AT_ONCE
    items: ItemLimits = field(default_factory=ItemLimits)


_LAYOUT = {
    "traces": ("resource_spans", "scope_spans", "spans"),
    "metrics": ("resource_metrics", "scope_metrics", "metrics"),
    "logs": ("resource_logs", "scope_logs", "log_records"),
}
_SERVICES: dict[Signal, tuple[str, Any, Any]] = {
    "traces": (
        "opentelemetry.proto.collector.trace.v1.TraceService",
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
    ),
    "metrics": (
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
    "logs": (
        "opentelemetry.proto.collector.logs.v1.LogsService",
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
    ),
}
_HTTP_PATHS = {f"/v1/{signal}": signal for signal in _SERVICES}
_HEX_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def otlp_json(message: Any) -> Any:
    """The OTLP/JSON form of a request: protobuf JSON, except that trace and span ids are hex
    strings (the OTLP JSON encoding), not base64."""
    data = MessageToDict(message)
    _hex_ids(data)
    return data


def _hex_ids(root: Any) -> None:
    """Rewrite the ids in place: a copy of the whole tree would double what a request costs."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _HEX_ID_KEYS and isinstance(value, str):
                    node[key] = base64.b64decode(value).hex()
                elif isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(item for item in node if isinstance(item, (dict, list)))


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(any_value(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return {item.key: any_value(item.value) for item in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def attributes(items: Any) -> dict[str, Any]:
    return {item.key: any_value(item.value) for item in items}


class Rejected(Answer):
    """A request the receiver answers with ``status`` instead of reading it."""


def decompress(data: bytes, wbits: int, limit: int) -> bytes:
    """Inflate ``data`` as a stream, a step at a time, holding at most ``limit`` bytes of output
    and one step: a gzip bomb costs the limit, never its expanded size."""
    inflater = zlib.decompressobj(wbits)
    parts: list[bytes] = []
    size = 0
    pending = data
    try:
        while pending or not inflater.eof:
            part = inflater.decompress(pending, min(_INFLATE_STEP, limit + 1 - size))
            size += len(part)
            if size > limit:
                raise Rejected(413, f"decompressed body over {limit} bytes")
            if not part and not inflater.unconsumed_tail:
                break  # all input read: the end, or a truncated stream (below)
            parts.append(part)
            pending = inflater.unconsumed_tail
    except zlib.error as error:
        raise Rejected(400, f"cannot decompress the body: {error}") from None
    if not inflater.eof or inflater.unused_data:
        raise Rejected(400, "the compressed body is truncated or has trailing data")
    return b"".join(parts)


_INFLATE_STEP = 1 << 20


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": 32 + zlib.MAX_WBITS}  # deflate: zlib or gzip framing


class OtlpReceiver:
    """Collects every OTLP export request it receives (``keep=False``: hands each to
    ``on_request`` only, so memory stays flat however long it runs)."""

    def __init__(
        self,
        *,
        keep: bool = True,
        on_request: OnRequest | None = None,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self.keep = keep
        self.on_request = on_request
        self.limits = limits or Limits()
        self.clock = clock
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.refuse = False
        self.delay = 0.0  # seconds each export waits before it is answered: a slow collector
        self.export_calls = 0
        self.host = "127.0.0.1"
        self._grpc: grpc.Server | None = None
        self._http: HttpServer | None = None
        self._decoder: futures.ThreadPoolExecutor | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, grpc_port: int = 0, http_port: int = 0, host: str = "127.0.0.1") -> OtlpReceiver:
        """Listen on ``host`` (port 0: any free port; a restarted collector passes the old
        ports). Raises ``OSError`` when a port is taken."""
        self.host = host
        # The decoding runs on these threads only, whoever received the request: the memory a
        # decode frees is reused by the next (a thread's own malloc arena), not kept aside;
        # decoding on the receiving threads measured 700 MiB where this measures 330.
        self._decoder = futures.ThreadPoolExecutor(self.limits.decoding_at_once, thread_name_prefix="otlp-decode")
        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.limits.grpc_calls, thread_name_prefix="otlp-grpc"),
            handlers=[self._grpc_service(signal) for signal in _SERVICES],
            options=[
                ("grpc.max_receive_message_length", self.limits.grpc_message_bytes),
                ("grpc.so_reuseport", 0),  # a port another server holds is an error, not shared
            ],
            maximum_concurrent_rpcs=self.limits.grpc_calls,
        )
        try:
            self.grpc_port = self._grpc.add_insecure_port(f"{_bracketed(host)}:{grpc_port}")
        except RuntimeError as error:  # grpc's word for "cannot bind"
            raise OSError(f"cannot listen for OTLP/gRPC on {_bracketed(host)}:{grpc_port}: {error}") from None
        try:
            self._http = HttpServer(host, http_port, self.limits, self.clock, _HTTP_PATHS, self._export_http)
        except OSError as error:
            self._grpc.stop(grace=None)
            raise OSError(f"cannot listen for OTLP/HTTP on {_bracketed(host)}:{http_port}: {error}") from None
        self._grpc.start()
        self._http.start()
        self.http_port = self._http.port
        return self

    def _grpc_service(self, signal: Signal) -> grpc.GenericRpcHandler:
        service, _, response_type = _SERVICES[signal]
        codes = {400: grpc.StatusCode.INVALID_ARGUMENT, 413: grpc.StatusCode.RESOURCE_EXHAUSTED}

        def export(body: bytes, context: grpc.ServicerContext) -> Any:
            try:
                self.export(signal, [body], "identity")  # grpcio inflated it, to its message limit
            except Rejected as rejected:
                context.abort(codes.get(rejected.status, grpc.StatusCode.UNAVAILABLE), str(rejected))
            return response_type()

        # Raw bytes in: a body that does not parse is ours to answer, not a logged traceback.
        method = grpc.unary_unary_rpc_method_handler(
            export, request_deserializer=None, response_serializer=lambda message: message.SerializeToString()
        )
        return grpc.method_handlers_generic_handler(service, {"Export": method})

    def _export_http(self, signal: Signal, parts: list[bytes], encoding: str) -> bytes:
        self.export(signal, parts, encoding)
        return bytes(_SERVICES[signal][2]().SerializeToString())

    def export(self, signal: Signal, parts: list[bytes], encoding: str) -> None:
        """Decode one export request's body (its ``parts``, as ``encoding`` says) and store it.
        Raises ``Rejected``: 400 for what is not an OTLP request, 413 for one over a bound, 503
        when refusing or not stored. Empties ``parts``: the body is held once."""
        if self.delay:
            self._stopping.wait(self.delay)
        assert self._decoder is not None, "start() first"
        refused = self._decoder.submit(self._decode, signal, parts, encoding).result()
        if refused is not None:
            raise Rejected(503, refused)

    def _decode(self, signal: Signal, parts: list[bytes], encoding: str) -> str | None:
        body = b"".join(parts)
        parts.clear()
        if encoding not in ("", "identity"):
            body = decompress(body, _WBITS[encoding], self.limits.decompressed_bytes)
        request_type = _SERVICES[signal][1]
        try:
            count_items(body, request_type.DESCRIPTOR, self.limits.items)
        except TooManyItems as error:
            raise Rejected(413, str(error)) from None
        except NotProtobuf as error:
            raise Rejected(400, f"not an OTLP {signal} request: {error}") from None
        request = request_type()
        try:
            request.ParseFromString(body)
        except (DecodeError, RecursionError, ValueError) as error:
            raise Rejected(400, f"not an OTLP {signal} request: {error}") from None
        del body
        return self.accept(signal, request)

    def accept(self, signal: Signal, request: Any) -> str | None:
        """Store one export request; returns why it is refused, or ``None``."""
        with self._lock:
            self.export_calls += 1
            if self.refuse:
                return "refusing for the test"
            if self.keep:
                getattr(self, signal).append(request)
            self._arrived.notify_all()
        if self.on_request is not None:
            try:
                self.on_request(signal, request)
            except Exception as error:  # the export failed here: the exporter must hear it
                _log.debug("OTLP request not handled", exc_info=True)
                return f"not stored: {type(error).__name__}"
        return None

    def stop(self, grace: float | None = None) -> bool:
        """Stop listening. With ``grace``, requests in flight get that long to finish; returns
        whether they all did."""
        self._stopping.set()
        done = True
        if self._grpc is not None:
            done = self._grpc.stop(grace=grace).wait(grace)
        if self._http is not None:
            done = self._http.stop(grace) and done
        if self._decoder is not None:
            self._decoder.shutdown(wait=False)
        return done

    @property
    def grpc_endpoint(self) -> str:
        return f"http://{_bracketed(self.host)}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://{_bracketed(self.host)}:{self.http_port}"

    def wait_http_connections(self, count: int, timeout: float) -> bool:
        """Wait until exactly ``count`` HTTP connections are being served."""
        return self._http is not None and self._http.wait_connections(count, timeout)

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
        """Wait until ``predicate`` (over what arrived) holds, checking it at each arrival."""
        with self._arrived:
            return self._arrived.wait_for(predicate, timeout)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


__all__ = [
    "MAX_ATTRIBUTES_PER_REQUEST",
    "MAX_BODY_BYTES",
    "MAX_BUFFERED_BODY_BYTES",
    "MAX_FIELD_BYTES",
    "MAX_CONNECTION_SECONDS",
    "MAX_DECODING_AT_ONCE",
    "MAX_DECOMPRESSED_BYTES",
    "MAX_EVENTS_PER_REQUEST",
    "MAX_GRPC_CALLS_AT_ONCE",
    "MAX_GRPC_MESSAGE_BYTES",
    "MAX_HTTP_CONNECTIONS",
    "MAX_LINKS_PER_REQUEST",
    "MAX_SPANS_PER_REQUEST",
    "MAX_VALUES_PER_REQUEST",
    "ItemLimits",
    "Limits",
    "OtlpReceiver",
    "Rejected",
    "any_value",
    "attributes",
    "decompress",
    "otlp_json",
]
