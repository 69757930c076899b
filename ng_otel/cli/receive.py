"""``ng-otel receive``: a local OTLP receiver that prints each failure chain as it arrives.

Point a server's exporters at it (``OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317``, gRPC,
the SDK's default protocol; or 4318 with ``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf``) and its
failures show up as trees, with nothing else installed. With ``--out``
every request is also written as an OTLP JSON line, which ``ng-otel show`` reads. Ctrl-C or
SIGTERM stops it once the requests in flight are answered; a second signal stops it at once.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import threading
from collections import OrderedDict
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

from rich.console import Console
from rich.markup import escape

from ng_otel.cli._text import clean
from ng_otel.cli.receiver import OtlpReceiver, otlp_json
from ng_otel.cli.show import SHORT_ID, render
from ng_otel.runs.chains import FailureGroup, groups_from_otlp

MAX_REMEMBERED_EVENTS: Final = 10_000  # recent events kept to name the causes of later ones
# Failure events waiting to be printed: a terminal slower than the exports drops the rest (and
# says how many) rather than holding them, or an export, for it.
MAX_UNPRINTED_EVENTS: Final = 10_000
STOP_GRACE_SECONDS: Final = 30.0  # the requests in flight at the first signal; each is bounded anyway
_LOCK_WAIT: Final = 5.0  # stop at once: how long to wait for a request that is writing its line


class RecentEvents:
    """The last ``capacity`` failure events printed, by id, and the causes named by printed
    events that had not arrived yet: an event whose cause (or effect) was printed earlier is
    printed once, with a one-line reference to it, never with the earlier chain again."""

    def __init__(self, capacity: int = MAX_REMEMBERED_EVENTS) -> None:
        self.capacity = capacity
        self._events: OrderedDict[str, tuple[dict[str, Any], str | None]] = OrderedDict()
        self._awaited: OrderedDict[str, str] = OrderedDict()  # cause id -> the printed effect's id

    def add(self, record: dict[str, Any], service: str | None) -> None:
        self._events[record["event_id"]] = (record, service)
        self._events.move_to_end(record["event_id"])
        while len(self._events) > self.capacity:
            self._events.popitem(last=False)
        cause_id = record.get("cause_id")
        if isinstance(cause_id, str) and cause_id not in self._events:
            self._awaited[cause_id] = record["event_id"]
            while len(self._awaited) > self.capacity:
                self._awaited.popitem(last=False)

    def get(self, event_id: str) -> tuple[dict[str, Any], str | None] | None:
        return self._events.get(event_id)

    def references(self, group: FailureGroup) -> list[str]:
        """One line for each event of ``group`` whose cause, or whose effect, was printed
        earlier (within the remembered events)."""
        lines = []
        for event_id, record in group.events.items():
            cause_id = record.get("cause_id")
            if isinstance(cause_id, str) and cause_id not in group.events:
                known = self.get(cause_id)
                if known is not None:
                    lines.append(f"↻ {_named(record)} was caused by {_named(known[0])}, shown earlier")
            effect_id = self._awaited.get(event_id)
            if effect_id is not None and effect_id not in group.events:
                effect = self.get(effect_id)
                if effect is not None:
                    lines.append(f"↻ {_named(record)} caused {_named(effect[0])}, shown earlier")
        return lines


def _named(record: dict[str, Any]) -> str:
    return f"{clean(str(record['failure_kind']), 80)} {clean(str(record['event_id'])[:SHORT_ID], SHORT_ID)}"


class ReceiveSink:
    """Takes each request from the receiver's threads: writes its OTLP JSON line (under
    ``lock``, which is all an export waits on) and hands the failure chains it carries to a
    printer thread, which draws each event once."""

    def __init__(self, console: Console, out: IO[str] | None) -> None:
        self.console = console
        self.out = out
        self.lock = threading.Lock()
        self.recent = RecentEvents()
        self.requests = {"traces": 0, "metrics": 0, "logs": 0}
        self.failures = 0
        self.lines = 0
        self.unprinted = 0  # events dropped because the terminal fell behind
        self._queue: queue.SimpleQueue[list[FailureGroup] | None] = queue.SimpleQueue()
        self._queued = 0  # events waiting in _queue
        self._queued_lock = threading.Lock()
        self._printer = threading.Thread(target=self._print_forever, name="ng-otel-receive-print", daemon=True)
        self._printer.start()

    def __call__(self, signal_name: str, request: Any) -> None:
        data = otlp_json(request)
        if not data:
            return  # an empty export request: nothing to keep
        line = json.dumps(data, separators=(",", ":")) + "\n"
        groups = [g for g in groups_from_otlp([(0, data, True)]) if isinstance(g, FailureGroup)]
        del data
        events = sum(len(group.events) for group in groups)
        with self.lock:
            self.requests[signal_name] += 1
            if self.out is not None:
                self.out.write(line)
                self.out.flush()  # a line at a time: `ng-otel show` reads the file while it grows
                self.lines += 1
            self.failures += events
        if groups:
            self._hand_to_printer(groups, events)

    def _hand_to_printer(self, groups: list[FailureGroup], events: int) -> None:
        with self._queued_lock:
            if self._queued + events > MAX_UNPRINTED_EVENTS:
                self.unprinted += events
                return
            self._queued += events
        self._queue.put(groups)

    def _print_forever(self) -> None:
        while (groups := self._queue.get()) is not None:
            for group in groups:
                self._print(group)
                with self._queued_lock:
                    self._queued -= len(group.events)

    def _print(self, group: FailureGroup) -> None:
        tree = render(group)
        for reference in self.recent.references(group):
            tree.append("\n")
            tree.append(reference, "dim")
        try:
            self.console.print(tree)
        except Exception:  # a terminal that went away costs the trees, never the exports
            pass
        for record in group.events.values():
            self.recent.add(record, group.services.get(record["event_id"]))

    def close(self, wait: float | None = None) -> bool:
        """Print what is waiting, flush and close the file; with ``wait``, give up on either
        when it takes longer."""
        self._queue.put(None)
        self._printer.join(wait)
        if not self.lock.acquire(timeout=-1 if wait is None else wait):
            return False
        try:
            if self.out is not None and not self.out.closed:
                self.out.close()
        finally:
            self.lock.release()
        return True


class _StopNow(Exception):
    """The second signal: stop without waiting."""


def run_receive(host: str, grpc_port: int, http_port: int, out: Path | None, console: Console) -> int:
    # The handler only writes to a pipe the main thread waits on: a handler that took a lock
    # (Event.set) could wait forever on one the interrupted main thread holds.
    wake_read, wake_write = os.pipe()
    signals = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)
        if len(signals) == 1:
            os.write(wake_write, b"x")
            return
        # A third signal takes the default way out, whatever the process is doing.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise _StopNow

    previous = {number: signal.signal(number, on_signal) for number in (signal.SIGINT, signal.SIGTERM)}
    stream = out.open("a", encoding="utf-8") if out is not None else None
    sink = ReceiveSink(console, stream)
    receiver = OtlpReceiver(keep=False, on_request=sink)
    try:
        try:
            receiver.start(grpc_port, http_port, host=host)
        except OSError as error:
            console.print(f"[red]ng-otel receive: {escape(str(error))}[/red]")
            console.print(
                "[dim]is a collector already listening there? --grpc-port 0 --http-port 0 pick free ports[/dim]"
            )
            sink.close()
            return 2
        _say_where(console, receiver, host, out)
        select.select([wake_read], [], [])
        console.print("stopping: answering the requests in flight (a second Ctrl-C stops at once) ...")
        finished = receiver.stop(grace=STOP_GRACE_SECONDS)
        sink.close()
        console.print(_closing(sink, out) + ("" if finished else " (some requests in flight were cut)"))
        return 0
    except _StopNow:
        closed = sink.close(wait=_LOCK_WAIT)
        console.print(_closing(sink, out) + (" (stopped at once)" if closed else " (stopped at once; file not closed)"))
        console.file.flush()
        # Threads may still be inside a request; the process does not wait for them.
        os._exit(1)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        os.close(wake_read)
        os.close(wake_write)


def _say_where(console: Console, receiver: OtlpReceiver, host: str, out: Path | None) -> None:
    console.print(  # one line however narrow the terminal: scripts read the ports from it
        f"ng-otel receive: OTLP gRPC on {escape(receiver.grpc_endpoint)}, HTTP on {escape(receiver.http_endpoint)}",
        soft_wrap=True,
    )
    if host not in ("127.0.0.1", "::1", "localhost"):
        console.print(f"[yellow]listening on {escape(host)}: anyone who can reach it can send here[/yellow]")
    console.print(  # gRPC first: what the SDK's exporters speak when nothing says otherwise
        f"point your servers at it: OTEL_EXPORTER_OTLP_ENDPOINT={escape(receiver.grpc_endpoint)} "
        f"(or OTEL_EXPORTER_OTLP_ENDPOINT={escape(receiver.http_endpoint)} OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)",
        soft_wrap=True,
    )
    where = f"writing OTLP JSON lines to {escape(str(out))}" if out else "not saving (--out FILE keeps every request)"
    console.print(f"{where}; Ctrl-C stops")


def _closing(sink: ReceiveSink, out: Path | None) -> str:
    counts = ", ".join(f"{count} {name}" for name, count in sink.requests.items())
    saved = f"; {sink.lines} lines in {escape(str(out))} (ng-otel show {escape(str(out))})" if out else ""
    unprinted = f" ({sink.unprinted} not printed: the terminal fell behind)" if sink.unprinted else ""
    return (
        f"received {sum(sink.requests.values())} requests ({counts}), {sink.failures} failure events{unprinted}{saved}"
    )


def receive_command(args: Any, console: Console) -> int:
    return run_receive(args.host, args.grpc_port, args.http_port, args.out, console)
