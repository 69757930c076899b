"""The OTLP receiver behind `ng-otel receive`, the demo and this suite: its bounds, and the
command itself run as a user runs it."""

import gzip
import http.server
import json
import queue
import signal
import socket
import subprocess
import threading
import tracemalloc
import zlib

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ng_otel.cli.receive import MAX_REMEMBERED_EVENTS, RecentEvents
from ng_otel.cli.receiver import (
    MAX_BODY_BYTES,
    MAX_CHUNK_LINE_BYTES,
    MAX_CONNECTION_SECONDS,
    MAX_DECOMPRESSED_BYTES,
    MAX_GRPC_MESSAGE_BYTES,
    MAX_HTTP_CONNECTIONS,
    Limits,
    OtlpReceiver,
)
from ng_otel.cli.show import FailureGroup
from ng_otel.contract import NgFailureEvent, failure_report_for
from ng_otel.gym.collection import report_row

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


def post(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send raw request bytes; (status, body) of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
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


def grpc_export(port: int, body: bytes, **options):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return channel.unary_unary(TRACES)(body, timeout=30, **options)


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
    if extra:  # one byte more announced: refused before that chunk is read
        chunked += b"1\r\n"
    else:
        chunked += b"0\r\n\r\n"
    assert post(otlp.http_port, head(Transfer_Encoding="chunked"), chunked)[0] == status
    assert len(otlp.traces) == (status == 200)


@pytest.mark.parametrize(("extra", "status"), [(0, 200), (1, 400)])
def test_a_chunk_size_line_at_the_bound_is_read_and_one_byte_past_is_refused(otlp, extra, status):
    body = request_of_size(100)
    size_line = f"{len(body):x};".encode()
    size_line += b"x" * (MAX_CHUNK_LINE_BYTES - len(size_line) - 2 + extra) + b"\r\n"
    chunked = size_line + body + b"\r\n0\r\n\r\n"
    assert post(otlp.http_port, head(Transfer_Encoding="chunked"), chunked)[0] == status


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
            client.sendall(b"POST /v1/traces HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly part of it")
            answer = b""
            while chunk := client.recv(1024):  # ends when the receiver closes the connection
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 408")
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
        assert held[-1].recv(1024).startswith(b"HTTP/1.0 200")
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
def test_a_cause_that_arrived_earlier_joins_its_effects_tree_within_the_remembered_events(past):
    recent = RecentEvents()
    recent.add({"event_id": "cause", "boundary": "model", "failure_kind": "transport_timeout"}, "model")
    for number in range(MAX_REMEMBERED_EVENTS - 1 + past):
        recent.add({"event_id": f"other {number}", "boundary": "agent", "failure_kind": "x"}, "agent")
    effect = {"event_id": "effect", "boundary": "agent", "failure_kind": "agent_run_error", "cause_id": "cause"}
    group = FailureGroup(title="trace t", events={"effect": effect})
    recent.complete(group)
    assert ("cause" in group.events) is not past
    assert group.services.get("cause") == (None if past else "model")


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
def receive(installed, tmp_path):
    started: list[subprocess.Popen] = []

    def start(*args: str) -> Running:
        process = subprocess.Popen(
            [installed.bin("ng-otel"), "receive", "--grpc-port", "0", "--http-port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=installed.env(),
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
    receive, ng_otel_cli, tmp_path, stop
):
    out = tmp_path / "received.jsonl"
    running = receive("--out", str(out))
    running.ports()
    # What a user does: set the variable the banner names first, and nothing else.
    suggested = running.wait_for_line("point your servers at it: ").split("OTEL_EXPORTER_OTLP_ENDPOINT=")[1]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(saved_chain())
    sent = ng_otel_cli("replay", str(rows), env={"OTEL_EXPORTER_OTLP_ENDPOINT": suggested.split()[0]})
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
    shown = ng_otel_cli("show", str(out))
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
        slow.sendall(b"POST /v1/traces HTTP/1.1\r\nContent-Length: 100\r\n\r\n")
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


@pytest.mark.e2e
@pytest.mark.parametrize("which", ["--grpc-port", "--http-port"])
def test_receive_says_so_when_a_port_is_taken(installed, tmp_path, which):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        other = "--http-port" if which == "--grpc-port" else "--grpc-port"
        done = subprocess.run(
            [installed.bin("ng-otel"), "receive", which, str(taken.getsockname()[1]), other, "0"],
            capture_output=True,
            text=True,
            env=installed.env(),
            cwd=tmp_path,
            timeout=60,
        )
    assert done.returncode == 2
    assert "cannot listen" in done.stdout and "Traceback" not in done.stdout + done.stderr
