"""The OTLP receiver behind `ng-otel receive`, the demo and this suite: its bounds, and the
command itself run as a user runs it."""

import functools
import gzip
import http.server
import io
import json
import queue
import signal
import socket
import subprocess
import threading
import time
import tracemalloc
import zlib
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from rich.console import Console

from ng_otel.cli.receive import MAX_REMEMBERED_EVENTS, MAX_UNPRINTED_EVENTS, ReceiveSink, RecentEvents
from ng_otel.cli.receiver import (
    MAX_ATTRIBUTES_PER_REQUEST,
    MAX_BODY_BYTES,
    MAX_BUFFERED_BODY_BYTES,
    MAX_CONNECTION_SECONDS,
    MAX_DECODING_AT_ONCE,
    MAX_DECOMPRESSED_BYTES,
    MAX_EVENTS_PER_REQUEST,
    MAX_FIELD_BYTES,
    MAX_GRPC_CALLS_AT_ONCE,
    MAX_GRPC_MESSAGE_BYTES,
    MAX_HTTP_CONNECTIONS,
    MAX_LINKS_PER_REQUEST,
    MAX_SPANS_PER_REQUEST,
    MAX_VALUES_PER_REQUEST,
    Limits,
    OtlpReceiver,
)
from ng_otel.contract import NgFailureEvent, failure_report_for
from ng_otel.gym.collection import report_row
from ng_otel.otel import names
from ng_otel.runs.chains import FailureGroup
from tests.conftest import NG_OTEL_COMMAND, user_environment

TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
MiB = 1024 * 1024


def request_of_size(size: int) -> bytes:
    """A valid trace export request of exactly ``size`` bytes."""
    request = ExportTraceServiceRequest()
    attribute = request.resource_spans.add().resource.attributes.add()
    attribute.key = "pad"
    pad = size
    while True:
        attribute.value.string_value = "x" * pad
        body = request.SerializeToString()
        if len(body) == size:
            return body
        pad -= len(body) - size
        assert pad >= 0, f"no request is {size} bytes"


def post(port: int, head: bytes, body: bytes = b"", timeout: float = 30) -> tuple[int, bytes]:
    """Send raw request bytes; (status, body) of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as client:
        try:
            client.sendall(head + body)
            client.shutdown(socket.SHUT_WR)  # all sent: a receiver that reads on meets the end
        except OSError:  # answered and closed before reading it all
            pass
        answer = b""
        try:
            while chunk := client.recv(65536):
                answer += chunk
        except ConnectionResetError:  # closed with some of the request unread: the answer came first
            pass
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def head(length: int | None = None, **headers: str) -> bytes:
    headers = {"Content_Type": "application/x-protobuf", **headers}
    lines = ["POST /v1/traces HTTP/1.1", "Host: 127.0.0.1"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def grpc_export(port: int, body: bytes, timeout: float = 30, **options):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return channel.unary_unary(TRACES)(body, timeout=timeout, **options)


def gzip_bomb(expanded_mib: int) -> bytes:
    """``expanded_mib`` MiB of zeros, gzipped (about 1,000 to 1), made a MiB at a time."""
    squeezer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MiB)
    return b"".join(squeezer.compress(zeros) for _ in range(expanded_mib)) + squeezer.flush()


# -- bounds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "status"), [(MAX_BODY_BYTES, 200), (MAX_BODY_BYTES + 1, 413)])
def test_a_body_at_the_bound_is_read_and_one_byte_past_is_refused_before_reading(otlp, size, status):
    if status == 200:
        assert post(otlp.http_port, head(size), request_of_size(size))[0] == 200
        assert len(otlp.traces) == 1
    else:  # refused on its Content-Length alone: the body is never sent
        assert post(otlp.http_port, head(size)) == (413, f"body over {MAX_BODY_BYTES} bytes".encode())
        assert otlp.traces == []


@pytest.mark.parametrize(("extra", "status"), [(0, 200), (1, 413)])
def test_a_chunked_body_is_bounded_while_it_is_read(otlp, extra, status):
    body = request_of_size(MAX_BODY_BYTES)
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n"
    if extra:  # one byte more: refused when it arrives, the rest never kept
        chunked += b"1\r\nx\r\n0\r\n\r\n"
    else:
        chunked += b"0\r\n\r\n"
    assert post(otlp.http_port, head(Transfer_Encoding="chunked"), chunked)[0] == status
    assert len(otlp.traces) == (status == 200)


@pytest.mark.parametrize(("extra", "status"), [(0, 200), (1, 400)])
def test_a_header_at_the_bound_is_read_and_one_byte_past_is_refused(otlp, extra, status):
    body = request_of_size(100)
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    padded = head(Transfer_Encoding="chunked", X_Pad="x" * (MAX_FIELD_BYTES + extra))
    assert post(otlp.http_port, padded, chunked)[0] == status


@pytest.mark.parametrize(("size", "status"), [(MAX_DECOMPRESSED_BYTES, 200), (MAX_DECOMPRESSED_BYTES + 1, 413)])
def test_a_gzip_body_decompressing_to_the_bound_is_read_and_one_byte_past_is_refused(otlp, size, status):
    body = gzip.compress(request_of_size(size), compresslevel=1)
    assert post(otlp.http_port, head(len(body), Content_Encoding="gzip"), body)[0] == status
    assert len(otlp.traces) == (status == 200)


def test_a_gzip_bomb_costs_at_most_the_decompressed_limit(otlp):
    bomb = gzip_bomb(300)
    assert len(bomb) < 300 * 1024  # 298 KiB
    tracemalloc.start()
    try:
        status, message = post(otlp.http_port, head(len(bomb), Content_Encoding="gzip"), bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (status, message) == (413, f"decompressed body over {MAX_DECOMPRESSED_BYTES} bytes".encode())
    # The limit, one inflate step (1 MiB) and the compressed body itself; never 300 MiB.
    assert peak < MAX_DECOMPRESSED_BYTES + 2 * MiB, peak


class ScriptedClock:
    """The time a connection's deadline sees: its start, then ``after`` seconds later."""

    def __init__(self, after: float) -> None:
        self.after = after
        self.started = False

    def __call__(self) -> float:
        if not self.started:
            self.started = True
            return 1000.0
        return 1000.0 + self.after


@pytest.mark.parametrize(("elapsed", "status"), [(MAX_CONNECTION_SECONDS, 200), (MAX_CONNECTION_SECONDS + 0.001, 408)])
def test_a_connection_is_served_up_to_its_time_limit_and_answered_408_past_it(elapsed, status):
    receiver = OtlpReceiver(clock=ScriptedClock(elapsed)).start()
    try:
        body = request_of_size(100)
        assert post(receiver.http_port, head(len(body)), body)[0] == status
        assert len(receiver.traces) == (status == 200)
    finally:
        receiver.stop()


def test_a_silent_client_holds_no_thread_past_the_time_limit():
    # The same rule as above on the real clock, with a short limit so the suite does not wait.
    receiver = OtlpReceiver(limits=Limits(connection_seconds=0.5)).start()
    try:
        with socket.create_connection(("127.0.0.1", receiver.http_port), timeout=30) as client:
            client.sendall(head(100) + b"only part of it")
            answer = b""
            while chunk := client.recv(1024):  # ends when the receiver closes the connection
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408")
        assert receiver.wait_http_connections(0, timeout=30)
    finally:
        receiver.stop()


def test_connections_at_the_bound_are_served_and_one_past_is_answered_503(otlp):
    held = [socket.create_connection(("127.0.0.1", otlp.http_port), timeout=30) for _ in range(MAX_HTTP_CONNECTIONS)]
    try:
        assert otlp.wait_http_connections(MAX_HTTP_CONNECTIONS, timeout=30)
        assert post(otlp.http_port, head(0))[0] == 503  # one past the bound
        body = request_of_size(100)
        held[-1].sendall(head(len(body)) + body)  # the last one within the bound
        assert held[-1].recv(1024).startswith(b"HTTP/1.1 200")
    finally:
        for client in held:
            client.close()
    assert otlp.wait_http_connections(0, timeout=30)
    assert post(otlp.http_port, head(0))[0] == 200  # the slots come back


@pytest.mark.parametrize(("size", "code"), [(MAX_GRPC_MESSAGE_BYTES, None), (MAX_GRPC_MESSAGE_BYTES + 1, "limit")])
def test_a_grpc_message_at_the_bound_is_read_and_one_byte_past_is_refused(otlp, size, code):
    body = request_of_size(size)
    if code is None:
        assert grpc_export(otlp.grpc_port, body) == b""
        assert len(otlp.traces) == 1
        return
    with pytest.raises(grpc.RpcError) as refused:
        grpc_export(otlp.grpc_port, body)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_grpc_gzip_bomb_is_refused_by_its_decompressed_size(otlp):
    with pytest.raises(grpc.RpcError) as refused:
        grpc_export(otlp.grpc_port, bytes(MAX_GRPC_MESSAGE_BYTES + 1), compression=grpc.Compression.Gzip)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    size, varint = len(payload), b""
    while True:
        byte, size = size & 0x7F, size >> 7
        varint += bytes([byte | (0x80 if size else 0)])
        if not size:
            return bytes([number << 3 | 2]) + varint + payload


def deeply_nested_request(depth: int = 200) -> bytes:
    """An attribute value nested ``depth`` kvlists deep: past protobuf's recursion limit (100)."""
    value = field(1, b"x")  # AnyValue.string_value
    for _ in range(depth):  # AnyValue.kvlist_value.values[0] = KeyValue(key "k", value)
        value = field(6, field(1, field(1, b"k") + field(2, value)))
    key_value = field(1, b"k") + field(2, value)
    return field(1, field(1, field(1, key_value)))  # request.resource_spans[0].resource.attributes[0]


MALFORMED = {
    "not protobuf": (head(4), b"\xff\xff\xff\xff", 400),
    "not gzip": (head(8, Content_Encoding="gzip"), b"notgzip!", 400),
    "truncated gzip": (head(12, Content_Encoding="gzip"), gzip.compress(b"abcdefgh")[:12], 400),
    "gzip with trailing data": (
        head(len(gzip.compress(b"")) + 3, Content_Encoding="gzip"),
        gzip.compress(b"") + b"abc",
        400,
    ),
    "Content-Length not a number": (head(None, Content_Length="ten"), b"", 400),
    "negative Content-Length": (head(None, Content_Length="-1"), b"", 400),
    "body shorter than Content-Length": (head(100), b"short", 400),
    "chunk size not hexadecimal": (head(Transfer_Encoding="chunked"), b"zz\r\nab\r\n0\r\n\r\n", 400),
    "chunked body cut short": (head(Transfer_Encoding="chunked"), b"10\r\nab", 400),
    "no length at all": (head(), b"", 411),
    "unknown encoding": (head(3, Content_Encoding="br"), b"abc", 415),
    "JSON body": (head(2, Content_Type="application/json"), b"{}", 415),
    "unknown transfer encoding": (head(Transfer_Encoding="gzip"), b"", 501),
    "request line of garbage": (b"POST /v1/traces NOT-HTTP\r\n\r\n", b"", 400),
    "nested past protobuf's recursion limit": (head(len(deeply_nested_request())), deeply_nested_request(), 400),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_http_input_is_answered_with_a_4xx_never_a_traceback(otlp, capfd, case):
    request, body, status = MALFORMED[case]
    assert post(otlp.http_port, request, body)[0] == status
    assert otlp.traces == []
    assert "Traceback" not in capfd.readouterr().err


def test_malformed_grpc_input_is_invalid_argument_never_a_traceback(otlp, capfd):
    with pytest.raises(grpc.RpcError) as refused:
        grpc_export(otlp.grpc_port, b"\xff\xff\xff\xff")
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "Traceback" not in capfd.readouterr().err


def test_the_receiver_patches_no_standard_library_class():
    receiver = OtlpReceiver().start()
    receiver.stop()
    assert "allow_reuse_address" not in vars(http.server.ThreadingHTTPServer)  # HTTPServer's stays in force


@pytest.mark.parametrize("past", [False, True])
def test_a_cause_printed_earlier_is_named_by_its_effect_within_the_remembered_events(past):
    recent = RecentEvents()
    recent.add({"event_id": "cause", "boundary": "model", "failure_kind": "transport_timeout"}, "model")
    for number in range(MAX_REMEMBERED_EVENTS - 1 + past):
        recent.add({"event_id": f"other {number}", "boundary": "agent", "failure_kind": "x"}, "agent")
    effect = {"event_id": "effect", "boundary": "agent", "failure_kind": "agent_run_error", "cause_id": "cause"}
    group = FailureGroup(title="trace t", events={"effect": effect})
    expected = [] if past else ["↻ agent_run_error effect was caused by transport_timeout cause, shown earlier"]
    assert recent.references(group) == expected
    assert list(group.events) == ["effect"]  # the earlier chain is never drawn again


# -- items, not only bytes -------------------------------------------------------------------

# Empty messages: 2 bytes each on the wire, the most items a body can hold.
EMPTY_SPAN, EMPTY_EVENT, EMPTY_LINK, EMPTY_KEY_VALUE = b"\x12\x00", b"\x5a\x00", b"\x6a\x00", b"\x0a\x00"
EMPTY_RESOURCE_SPANS = b"\x0a\x00"


def request_holding(kind: str, count: int) -> bytes:
    """A trace export request of ``count`` empty ``kind`` (spans, events, links, attributes,
    values: empty resource spans, one value each)."""
    if kind == "spans":  # request.resource_spans[0].scope_spans[0].spans
        return field(1, field(2, EMPTY_SPAN * count))
    if kind in ("events", "links"):  # ... .spans[0].events or .links
        return field(1, field(2, field(2, (EMPTY_EVENT if kind == "events" else EMPTY_LINK) * count)))
    if kind == "attributes":  # request.resource_spans[0].resource.attributes
        return field(1, field(1, EMPTY_KEY_VALUE * count))
    return EMPTY_RESOURCE_SPANS * count


ITEM_BOUNDS = {
    "spans": MAX_SPANS_PER_REQUEST,
    "events": MAX_EVENTS_PER_REQUEST,
    "links": MAX_LINKS_PER_REQUEST,
    "attributes": MAX_ATTRIBUTES_PER_REQUEST,
    "values": MAX_VALUES_PER_REQUEST,
}


@pytest.mark.parametrize("past", [0, 1])
@pytest.mark.parametrize("kind", sorted(ITEM_BOUNDS))
def test_a_request_at_each_item_bound_is_stored_and_one_item_past_is_refused_413_before_parsing(otlp, kind, past):
    body = request_holding(kind, ITEM_BOUNDS[kind] + past)
    assert len(body) < MAX_BODY_BYTES  # within every byte limit: only the count refuses it
    status, message = post(otlp.http_port, head(len(body)), body)
    if past:
        assert (status, message) == (413, f"request holds more than {ITEM_BOUNDS[kind]} {kind}".encode())
        assert otlp.traces == []
    else:
        assert status == 200
        assert len(otlp.traces) == 1


@pytest.mark.parametrize("past", [0, 1])
def test_a_grpc_request_one_span_past_the_bound_is_resource_exhausted(otlp, past):
    body = request_holding("spans", MAX_SPANS_PER_REQUEST + past)
    if not past:
        assert grpc_export(otlp.grpc_port, body) == b""
        return
    with pytest.raises(grpc.RpcError) as refused:
        grpc_export(otlp.grpc_port, body)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.details() == f"request holds more than {MAX_SPANS_PER_REQUEST} spans"
    assert otlp.traces == []


def test_a_gzip_body_is_counted_after_it_is_inflated(otlp):
    body = gzip.compress(request_holding("spans", MAX_SPANS_PER_REQUEST + 1))
    assert post(otlp.http_port, head(len(body), Content_Encoding="gzip"), body)[0] == 413


def test_requests_decoded_at_once_reach_the_bound_and_never_pass_it():
    inside, most, lock = [0], [0], threading.Lock()

    def slow_store(signal_name, request):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.5)
        with lock:
            inside[0] -= 1

    receiver = OtlpReceiver(keep=False, on_request=slow_store).start()
    try:
        body = request_of_size(100)
        with futures.ThreadPoolExecutor(2 * MAX_DECODING_AT_ONCE + 1) as pool:
            http = [pool.submit(post, receiver.http_port, head(len(body)), body) for _ in range(MAX_DECODING_AT_ONCE)]
            calls = [pool.submit(grpc_export, receiver.grpc_port, body) for _ in range(MAX_DECODING_AT_ONCE + 1)]
            assert [done.result(timeout=60)[0] for done in http] == [200] * MAX_DECODING_AT_ONCE
            assert [done.result(timeout=60) for done in calls] == [b""] * (MAX_DECODING_AT_ONCE + 1)
        assert most[0] == MAX_DECODING_AT_ONCE
    finally:
        receiver.stop()


def test_http_bodies_held_at_once_are_served_to_the_budget_and_one_byte_past_is_answered_503():
    release = threading.Event()
    receiver = OtlpReceiver(keep=False, on_request=lambda *_: release.wait(60)).start()
    try:
        bodies = MAX_BUFFERED_BODY_BYTES // MAX_BODY_BYTES
        assert bodies * MAX_BODY_BYTES == MAX_BUFFERED_BODY_BYTES
        body = request_of_size(MAX_BODY_BYTES)
        with futures.ThreadPoolExecutor(bodies) as pool:
            held = [pool.submit(post, receiver.http_port, head(len(body)), body) for _ in range(bodies)]
            deadline = time.monotonic() + 60
            while receiver._http._budget.held < MAX_BUFFERED_BODY_BYTES:  # all read and held: the budget, exactly
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert post(receiver.http_port, head(1), b"x") == (  # one byte past: refused before reading it
                503,
                b"the receiver holds as many bodies as it may: try again",
            )
            release.set()
            assert [done.result(timeout=60)[0] for done in held] == [200] * bodies
        assert post(receiver.http_port, head(len(body)), body)[0] == 200  # the budget comes back
    finally:
        release.set()
        receiver.stop()


def test_grpc_calls_held_at_once_are_served_to_the_bound_and_one_past_is_resource_exhausted(otlp):
    otlp.delay = 3.0
    body = request_of_size(100)
    with futures.ThreadPoolExecutor(MAX_GRPC_CALLS_AT_ONCE) as pool:
        held = [pool.submit(grpc_export, otlp.grpc_port, body) for _ in range(MAX_GRPC_CALLS_AT_ONCE)]
        time.sleep(1.0)  # all of them in the receiver's hands, waiting out the delay
        with pytest.raises(grpc.RpcError) as refused:
            grpc_export(otlp.grpc_port, body)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert [done.result(timeout=60) for done in held] == [b""] * MAX_GRPC_CALLS_AT_ONCE
    assert len(otlp.traces) == MAX_GRPC_CALLS_AT_ONCE


# -- stored means answered success -----------------------------------------------------------


def test_a_request_stored_after_the_time_limit_is_answered_200_not_408():
    # The work after the line is written (here a slow store) is not the client's time: an
    # answer of 408 would make the exporter count a loss that did not happen, and send it twice.
    receiver = OtlpReceiver(limits=Limits(connection_seconds=0.5), on_request=lambda *_: time.sleep(1.5)).start()
    try:
        body = request_of_size(100)
        assert post(receiver.http_port, head(len(body)), body)[0] == 200
        assert len(receiver.traces) == 1
    finally:
        receiver.stop()


# -- each event printed once -----------------------------------------------------------------


def failure_request(event_ids: list[str], cause_of: dict[str, str] | None = None) -> ExportTraceServiceRequest:
    """One span per event, each with one ``ng.failure`` event (``cause_of``: effect -> cause)."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    service = resource.resource.attributes.add()
    service.key, service.value.string_value = "service.name", "agent-server"
    spans = resource.scope_spans.add()
    for number, event_id in enumerate(event_ids):
        span = spans.spans.add()
        span.trace_id, span.span_id, span.name = bytes(15) + bytes([1]), number.to_bytes(8, "big"), "POST /run"
        event = span.events.add()
        event.name = names.EVENT
        pairs = {names.ID: event_id, names.KIND: "agent_run_error", names.BOUNDARY: "agent", names.REASON: "gave up"}
        if cause_of and event_id in cause_of:
            pairs[names.CAUSE_ID] = cause_of[event_id]
        for key, value in pairs.items():
            attribute = event.attributes.add()
            attribute.key, attribute.value.string_value = key, value
    return request


def test_receive_prints_each_event_once_however_long_the_chain_grows():
    # Each request carries one event, the cause of the next: before, every request drew the
    # whole remembered chain again (quadratic: 500 requests, 37 MB of output).
    requests = 300
    screen = io.StringIO()
    sink = ReceiveSink(Console(file=screen, width=200, color_system=None), None)
    for number in range(requests):
        cause = {f"event-{number}": f"event-{number - 1}"} if number else None
        sink("traces", failure_request([f"event-{number}"], cause))
    assert sink.close(wait=60)
    lines = screen.getvalue().splitlines()
    # A title, the event's two lines, one line naming the cause shown earlier: linear.
    assert len(lines) == 4 * requests - 1
    assert sum("agent_run_error  agent" in line for line in lines) == requests
    assert "↻ agent_run_error event-299 was caused by agent_run_error event-298, shown earlier" in lines


class BlockedTerminal(io.StringIO):
    """A terminal that stops taking output until ``go`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def write(self, text: str) -> int:
        self.go.wait(60)
        return super().write(text)


@pytest.mark.parametrize("past", [0, 1])
def test_exports_never_wait_for_the_terminal_and_unprinted_events_are_bounded(tmp_path, past):
    terminal = BlockedTerminal()
    out = (tmp_path / "received.jsonl").open("w", encoding="utf-8")
    sink = ReceiveSink(Console(file=terminal, width=200, color_system=None), out)
    started = time.monotonic()
    sink("traces", failure_request([f"first-{n}" for n in range(MAX_UNPRINTED_EVENTS - 1)]))
    sink("traces", failure_request(["last"] + [f"past-{n}" for n in range(past)]))
    assert time.monotonic() - started < 30  # the terminal took nothing, the exports were answered
    assert sink.lines == 2 and sink.failures == MAX_UNPRINTED_EVENTS + past
    assert sink.unprinted == (1 + past if past else 0)  # a request's events are kept or dropped together
    terminal.go.set()
    assert sink.close(wait=60)
    assert len((tmp_path / "received.jsonl").read_text().splitlines()) == 2  # the file has them all


# -- the command -----------------------------------------------------------------------------


class Running:
    """``ng-otel receive`` in a subprocess, its stdout read line by line as it comes."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for_line(self, text: str, timeout: float = 60) -> str:
        while True:
            line = self.lines.get(timeout=timeout)  # queue.Empty past the deadline
            assert line is not None, "ng-otel receive ended before printing: " + text + "\n" + "\n".join(self.seen)
            self.seen.append(line)
            if text in line:
                return line

    def rest(self) -> str:
        while (line := self.lines.get(timeout=60)) is not None:
            self.seen.append(line)
        return "\n".join(self.seen)

    def ports(self) -> tuple[int, int]:
        line = self.wait_for_line("ng-otel receive: OTLP gRPC on")
        grpc_part, http_part = line.split(", HTTP on ")
        return int(grpc_part.rsplit(":", 1)[1]), int(http_part.rsplit(":", 1)[1])


@pytest.fixture
def receive(tmp_path):
    started: list[subprocess.Popen] = []

    def start(*args: str) -> Running:
        process = subprocess.Popen(
            [*NG_OTEL_COMMAND, "receive", "--grpc-port", "0", "--http-port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=user_environment(),
            cwd=tmp_path,
        )
        started.append(process)
        return Running(process)

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)


def saved_chain() -> str:
    """A saved row whose agent failure was caused by a model timeout, and a healthy row."""
    effect = NgFailureEvent("agent_run_error", "gave up [/red]", boundary="agent")
    effect.__cause__ = NgFailureEvent("transport_timeout", "model timed out", boundary="model")
    return json.dumps(report_row(failure_report_for(effect), contexts={})) + "\n" + '{"healthy": true}\n'


@pytest.mark.e2e
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_receive_prints_each_chain_as_it_arrives_writes_what_show_reads_and_stops_cleanly(
    receive, ng_otel_process, cli, tmp_path, stop
):
    out = tmp_path / "received.jsonl"
    running = receive("--out", str(out))
    running.ports()
    # What a user does: set the variable the banner names first, and nothing else.
    suggested = running.wait_for_line("point your servers at it: ").split("OTEL_EXPORTER_OTLP_ENDPOINT=")[1]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(saved_chain())
    sent = ng_otel_process("replay", str(rows), env={"OTEL_EXPORTER_OTLP_ENDPOINT": suggested.split()[0]})
    assert sent.returncode == 0, sent.stdout + sent.stderr
    running.wait_for_line("└── agent_run_error  agent · ng-otel-replay")
    running.wait_for_line("gave up [/red]")  # hostile text printed as it is, never as markup
    running.wait_for_line("└── transport_timeout  model · ng-otel-replay")
    running.process.send_signal(stop)
    assert running.process.wait(timeout=60) == 0
    closing = running.rest()
    assert "received " in closing and "2 failure events" in closing and "Traceback" not in closing
    lines = [json.loads(line) for line in out.read_text().splitlines()]  # flushed, each line whole
    assert any("resourceSpans" in line for line in lines)
    shown = cli("show", str(out))
    assert shown.returncode == 0
    assert "agent_run_error  agent" in shown.stdout and "transport_timeout  model" in shown.stdout


@pytest.mark.e2e
def test_a_second_signal_during_the_shutdown_stops_receive_at_once(receive, tmp_path):
    out = tmp_path / "received.jsonl"
    running = receive("--out", str(out))
    _, http_port = running.ports()
    # A request in flight: the first signal waits for it (up to its time limit, 30 s).
    slow = socket.create_connection(("127.0.0.1", http_port), timeout=30)
    try:
        slow.sendall(head(100))
        body = request_of_size(100)  # answered after the slow one was accepted (first come, first accepted)
        assert post(http_port, head(len(body)), body)[0] == 200
        running.process.send_signal(signal.SIGTERM)
        running.wait_for_line("stopping:")
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=20) == 1
    finally:
        slow.close()
    assert "stopped at once" in running.rest()
    assert [json.loads(line) for line in out.read_text().splitlines()]


MAX_RSS_GROWTH = 512 * MiB  # what the receiver's peak RSS may grow by, whatever clients send within its limits


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def request_at_every_bound(size: int) -> bytes:
    """The costliest request the receiver accepts in ``size`` bytes: the most spans, the rest
    of the values as empty resource spans (~200 bytes each once decoded, 2 on the wire), and
    one attribute string filling the bytes."""
    spans = field(2, EMPTY_SPAN * MAX_SPANS_PER_REQUEST)  # resource_spans[0].scope_spans[0]
    # 7 values besides: resource spans, resource, key-value, key, value, string, scope spans.
    wrappers = EMPTY_RESOURCE_SPANS * (MAX_VALUES_PER_REQUEST - MAX_SPANS_PER_REQUEST - 7)
    pad = size - len(spans) - len(wrappers) - 32
    while True:
        pad_attribute = field(1, field(1, field(1, b"pad") + field(2, field(1, b"x" * pad))))
        body = field(1, pad_attribute + spans) + wrappers
        if len(body) == size:
            return body
        pad -= len(body) - size
        assert pad >= 0


@pytest.mark.e2e
def test_the_receivers_memory_is_bounded_whatever_clients_send_within_its_limits(receive, tmp_path):
    # Before: a 20 MiB body of empty spans alone took the receiver to 3.4 GB.
    running = receive("--out", str(tmp_path / "received.jsonl"))
    grpc_port, http_port = running.ports()
    running.wait_for_line("Ctrl-C stops")
    before = peak_rss(running.process.pid)
    largest = request_at_every_bound(MAX_BODY_BYTES)
    inflated = gzip.compress(largest, compresslevel=1)  # 90 KiB that inflate to the limit
    empty_spans = request_holding("spans", (MAX_BODY_BYTES - 10) // 2)  # 10 million: refused by count
    largest_grpc = request_at_every_bound(MAX_GRPC_MESSAGE_BYTES)

    def grpc_call(body: bytes) -> str:
        try:
            grpc_export(grpc_port, body, timeout=240)
        except grpc.RpcError as error:
            return error.code().name
        return "OK"

    squeezed = gzip.compress(empty_spans, compresslevel=1)
    # What is measured is memory: on a slow shared machine eight of the costliest bodies at once
    # took longer than the 30 s the HTTP and gRPC helpers wait (seen on one at ~2.5x the usual CPU
    # per request).
    slow_post = functools.partial(post, timeout=240)
    with futures.ThreadPoolExecutor(32) as pool:  # all at once
        stored = [pool.submit(slow_post, http_port, head(len(largest)), largest) for _ in range(4)]
        stored += [
            pool.submit(slow_post, http_port, head(len(inflated), Content_Encoding="gzip"), inflated) for _ in range(4)
        ]
        refused = [pool.submit(slow_post, http_port, head(len(empty_spans)), empty_spans) for _ in range(2)]
        refused += [
            pool.submit(slow_post, http_port, head(len(squeezed), Content_Encoding="gzip"), squeezed) for _ in range(4)
        ]
        calls = [pool.submit(grpc_call, largest_grpc) for _ in range(2 * MAX_GRPC_CALLS_AT_ONCE)]
        stored_statuses = [done.result(timeout=300)[0] for done in stored]
        refused_statuses = [done.result(timeout=300)[0] for done in refused]
        codes = [done.result(timeout=300) for done in calls]
        # Then, with the budget free again, each refused by its count alone.
        counted = [
            pool.submit(slow_post, http_port, head(len(squeezed), Content_Encoding="gzip"), squeezed) for _ in range(4)
        ]
        counted_statuses = [done.result(timeout=300)[0] for done in counted]
    grown = peak_rss(running.process.pid) - before
    print(f"receiver peak RSS {before / MiB:.0f} MiB -> {(before + grown) / MiB:.0f} MiB (+{grown / MiB:.0f} MiB)")
    # Stored (200) or too many bodies at once (503, which exporters retry): each answered.
    assert set(stored_statuses) <= {200, 503} and 200 in stored_statuses, stored_statuses
    # Over a bound: refused by their count (413), if not already for too many bodies at once.
    assert set(refused_statuses) <= {413, 503}, refused_statuses
    assert counted_statuses == [413] * 4
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"} and "OK" in codes, codes
    assert grown <= MAX_RSS_GROWTH, f"peak RSS grew {grown / MiB:.0f} MiB (from {before / MiB:.0f} MiB)"


@pytest.mark.e2e
@pytest.mark.parametrize("which", ["--grpc-port", "--http-port"])
def test_receive_says_so_when_a_port_is_taken(tmp_path, which):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        other = "--http-port" if which == "--grpc-port" else "--grpc-port"
        done = subprocess.run(
            [*NG_OTEL_COMMAND, "receive", which, str(taken.getsockname()[1]), other, "0"],
            capture_output=True,
            text=True,
            env=user_environment(),
            cwd=tmp_path,
            timeout=60,
        )
    assert done.returncode == 2
    assert "cannot listen" in done.stdout and "Traceback" not in done.stdout + done.stderr
