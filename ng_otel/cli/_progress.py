"""A progress bar for a long read, on a terminal only."""

from __future__ import annotations

import time
from typing import IO, Final

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from ng_otel.cli._text import MAX_SHOWN_PATH, clean
from ng_otel.runs.inputs import Wrap, WrappedStream

PROGRESS_AFTER: Final = 1.0  # seconds: a read shorter than this shows no progress bar


def progress_bar(console: Console | None, description: str, name: str) -> Wrap | None:
    """What reads a file with a transient progress bar on ``console``, once the read has
    taken a second; ``None`` (read it plainly) when ``console`` is no terminal. ``show``
    passes none: it prints trees as it reads, and a live bar would redraw itself at each."""
    if console is None or not console.is_terminal:
        return None

    def wrap(stream: IO[bytes], size: int) -> WrappedStream:
        return _LazyProgress(console, f"{description} {clean(name, MAX_SHOWN_PATH)}", size or None, stream)

    return wrap


class _LazyProgress:
    """A transient progress bar that appears only on a terminal and only after a second: a
    binary stream whose every read moves it."""

    def __init__(self, console: Console | None, description: str, total: int | None, stream: IO[bytes]) -> None:
        self._console = console if console is not None and console.is_terminal else None
        self._description, self._total = description, total
        self._stream = stream
        self._show_at = time.monotonic() + PROGRESS_AFTER
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(size)
        self._tick()
        return chunk

    def _tick(self) -> None:
        if self._console is None:
            return
        if self._progress is None:
            if time.monotonic() < self._show_at:
                return
            self._progress = Progress(
                TextColumn("{task.description}", markup=False),  # it holds a file's name
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                console=self._console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self._description, total=self._total)
        try:
            position = self._stream.tell()
        except OSError:  # a pipe
            return
        assert self._task is not None
        self._progress.update(self._task, completed=position)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
