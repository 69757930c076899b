"""The input layer after the run: files of saved rows or OTLP JSON lines, read in flat
memory, each line decoded once, every line that is not one said as a ``SkippedLine``, and the
format told by the file's first JSON object. ``show``, ``summary``, ``report``, ``replay``
and ``kinds --check`` all read through ``formatted_lines``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from io import BytesIO
from pathlib import Path
from typing import IO, Any, Final, Protocol

from orjson import JSONDecodeError, loads

from ng_otel.otel import names

MAX_ROW_BYTES: Final = 32 * 1024 * 1024
"""Longest line a bulk reader takes whole; a longer one is skipped without being held, so
memory stays flat whatever a file holds (``/dev/zero`` included)."""


class SkippedLine:
    """A line that is not a row: why, and where (1-based)."""

    __slots__ = ("line", "reason")

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason

    def __repr__(self) -> str:
        return f"SkippedLine({self.line}, {self.reason!r})"


class ByteStream(Protocol):
    """What ``read_json_lines`` reads from: a binary file, or anything with its ``read``."""

    def read(self, size: int, /) -> bytes: ...


def read_json_lines(stream: ByteStream, *, max_line_bytes: int = MAX_ROW_BYTES) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON value or ``SkippedLine``) for each non-blank line of a binary
    stream (anything with ``read``). Never raises for what the stream holds: a line past
    ``max_line_bytes``, invalid UTF-8, text that is not JSON (nesting too deep included) or a
    last line cut off mid-write each come back as a ``SkippedLine``."""
    number = 0
    parts: list[bytes] = []  # the start of a line whose end is in a later chunk, joined once at its end
    held = 0  # bytes in parts: at most max_line_bytes
    overlong = False  # the current line went past the bound: drop it up to its end
    chunk_size = max(1, min(_CHUNK_BYTES, max_line_bytes))
    while True:
        chunk = stream.read(chunk_size)
        if not chunk:
            break
        # Each line with its newline (BytesIO finds them with memchr: ~4x bytes.split's speed);
        # the last one has none unless the chunk ends a line.
        lines = BytesIO(chunk).readlines()
        tail = b"" if lines[-1].endswith(b"\n") else lines.pop()
        if lines:  # the first line ends here; it may have begun in earlier chunks
            number += 1
            first = lines[0][:-1]
            if overlong or held + len(first) > max_line_bytes:
                overlong, parts, held = False, [], 0
                yield number, SkippedLine(number, f"longer than {max_line_bytes} bytes")
            else:
                if parts:
                    first, parts, held = b"".join([*parts, first]), [], 0
                decoded = _decoded(number, first, ended=True)
                if decoded is not None:
                    yield number, decoded
        after_first = number + 1
        with_newline = max_line_bytes + 1
        for number, raw in enumerate(lines[1:], start=after_first):  # the hot loop: whole lines
            if len(raw) > with_newline:
                yield number, SkippedLine(number, f"longer than {max_line_bytes} bytes")
                continue
            try:
                value = loads(raw)
            except JSONDecodeError:
                # Read again without the newline: orjson's reason may differ with it ("control
                # character" for a string it cuts off, not "EOF").
                value = _decoded(number, raw[:-1], ended=True)
                if value is not None:
                    yield number, value
            else:
                yield number, value
        if overlong or held + len(tail) > max_line_bytes:
            overlong, parts, held = True, [], 0
        elif tail:
            parts.append(tail)
            held += len(tail)
    if overlong:
        yield number + 1, SkippedLine(number + 1, f"longer than {max_line_bytes} bytes")
    elif parts:
        decoded = _decoded(number + 1, b"".join(parts), ended=False)
        if decoded is not None:
            yield number + 1, decoded


_CHUNK_BYTES: Final = 1 << 20


def _decoded(number: int, raw: bytes, *, ended: bool) -> Any:
    try:
        return loads(raw)
    except JSONDecodeError as error:
        return _refused_by_orjson(number, raw, error, ended=ended)


def _refused_by_orjson(number: int, raw: bytes, error: JSONDecodeError, *, ended: bool) -> Any:
    """A line orjson will not read: ``None`` when blank; its value when the standard library
    reads it (a UTF-8 byte order mark, ``NaN`` or ``Infinity`` as Python's ``json`` writes
    them), so such a row is not lost; else a ``SkippedLine`` saying why."""
    if raw.startswith(_BOM):  # a mark, not text: the line is what follows it
        raw = raw[len(_BOM) :]
        try:
            return loads(raw) if raw.strip() else None
        except JSONDecodeError as without_mark:
            error = without_mark  # what is wrong with the text itself
    if not raw.strip():
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
        json.dumps(value, ensure_ascii=False).encode()  # no lone surrogate from an escape
    except (ValueError, TypeError, RecursionError):
        return SkippedLine(number, _why_not_json(raw, error, ended))
    return value


_BOM: Final = b"\xef\xbb\xbf"


def _why_not_json(raw: bytes, error: JSONDecodeError, ended: bool) -> str:
    if raw.startswith(b"\x1f\x8b"):  # gzip's magic: the file's first line
        return "gzip-compressed: decompress the file first (gunzip, zcat)"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"invalid UTF-8 at byte {bad.start + 1}"
    if not ended:
        return "truncated: the last line has no end and is not JSON"
    return f"not JSON: {error.msg} at column {error.colno}"


def open_rows(path: Path) -> IO[bytes]:
    """``path`` opened to read rows or OTLP JSON lines. A device (``/dev/zero``,
    ``/dev/urandom``) is refused with an ``OSError`` naming it: it never ends, and holds no
    line to read; a pipe or a regular file is read."""
    stream = path.open("rb")
    try:
        mode = os.fstat(stream.fileno()).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise OSError(errno.ENODEV, "a device, not a file of rows", str(path))
    except BaseException:
        stream.close()
        raise
    return stream


UNDECIDED_NOT_AN_OBJECT: Final = "not a JSON object: a row and an OTLP JSON line are objects"
"""Why a line before a file's first JSON object (which decides rows or OTLP) is skipped."""
OTLP_LINE_AMONG_ROWS: Final = "an OTLP JSON line in a file of rows (its first JSON object decides)"
ROW_AMONG_OTLP_LINES: Final = "not an OTLP JSON line in a file of OTLP JSON lines (its first JSON object decides)"


_OTLP_KEYS: Final = frozenset({"resourceSpans", "resourceMetrics", "resourceLogs"})


def is_otlp(value: Any) -> bool:
    """An OTLP JSON line: an object with ``resourceSpans``, ``resourceMetrics`` or ``resourceLogs``."""
    return isinstance(value, dict) and not _OTLP_KEYS.isdisjoint(value)


def is_record_line(value: Any) -> bool:
    """One of ng_otel's own JSON lines (``NG_OTEL_EXPORT``, OpenTelemetry off): an object with
    ``ng.record``. Read with OTLP JSON lines: the same events, one per line."""
    return isinstance(value, dict) and names.LINE_RECORD in value


_TELEMETRY_KEYS: Final = _OTLP_KEYS | {names.LINE_RECORD}
"""The keys of which any one makes an object telemetry: ``is_otlp``'s and ``is_record_line``'s."""


def _is_telemetry(value: Any) -> bool:
    return isinstance(value, dict) and not _TELEMETRY_KEYS.isdisjoint(value)


class FileFormat:
    """Rows, or OTLP JSON lines and ng_otel's own JSON lines (both telemetry: ``otlp``), as a
    file's first JSON object says; one per file read."""

    def __init__(self) -> None:
        self.otlp: bool | None = None  # undecided until the first JSON object

    def misfit(self, value: Any) -> str | None:
        """Why a decoded line is skipped for its format (before the first object: not being
        one; after it: being of the other format), or ``None`` when it belongs."""
        if self.otlp is None:
            if not isinstance(value, dict):
                return UNDECIDED_NOT_AN_OBJECT
            self.otlp = _is_telemetry(value)
        elif _is_telemetry(value) != self.otlp:
            return ROW_AMONG_OTLP_LINES if self.otlp else OTLP_LINE_AMONG_ROWS
        return None


MAX_LISTED_SKIPPED: Final = 50  # skipped lines kept to list; the rest are counted


class SkippedLines:
    """The skipped lines of a read: the first ``MAX_LISTED_SKIPPED`` with the file each is
    in, and how many there were."""

    def __init__(self) -> None:
        self.listed: list[tuple[str, SkippedLine]] = []
        self.count = 0

    def add(self, line: SkippedLine, where: str = "") -> None:
        self.count += 1
        if len(self.listed) < MAX_LISTED_SKIPPED:
            self.listed.append((where, line))

    @property
    def unlisted(self) -> int:
        return self.count - len(self.listed)

    def __iter__(self) -> Iterator[tuple[str, SkippedLine]]:
        return iter(self.listed)


class WrappedStream(ByteStream, Protocol):
    """What a ``Wrap`` gives: read instead of the file, closed once the read is over."""

    def close(self) -> None: ...


Wrap = Callable[[IO[bytes], int], WrappedStream]
"""Wraps a file opened to read, given its size (0: unknown), in what is read instead (a
progress bar that moves as chunks are read, say)."""


def file_lines(path: Path, wrap: Wrap | None = None) -> Iterator[tuple[int, Any]]:
    """``read_json_lines`` of the file at ``path`` (``open_rows`` opens it)."""
    with open_rows(path) as stream:
        if wrap is None:
            yield from read_json_lines(stream)
            return
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        wrapped = wrap(stream, size)
        try:
            yield from read_json_lines(wrapped)
        finally:
            wrapped.close()


FormattedLine = tuple[int, dict[str, Any], bool]  # line number, the JSON object, whether it is an OTLP JSON line


def formatted_lines(lines: Iterable[tuple[int, Any]]) -> Iterator[FormattedLine | SkippedLine]:
    """The one loop over a file's decoded lines: each JSON object of the file's format (its
    first object decides), and a ``SkippedLine`` for every other line."""
    file_format = FileFormat()
    misfit = file_format.misfit
    telemetry_keys = _TELEMETRY_KEYS
    for number, value in lines:
        # The usual line, a row in a file of rows, belongs without the calls misfit makes.
        if type(value) is dict and file_format.otlp is False and telemetry_keys.isdisjoint(value):
            yield number, value, False
            continue
        if isinstance(value, SkippedLine):
            yield value
            continue
        problem = misfit(value)
        if problem is not None:
            yield SkippedLine(number, problem)
        else:
            yield number, value, file_format.otlp is True
