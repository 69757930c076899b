"""Text from files and rows made safe to print: no control characters, bounded, markup escaped."""

from __future__ import annotations

from typing import Final

from rich.markup import escape

MAX_SHOWN_REASON: Final = 160  # a tree line is for a glance; the full reason is in the trace
MAX_SHOWN_PATH: Final = 4096  # PATH_MAX: a file's name is printed whole


def printable(text: str, limit: int = MAX_SHOWN_REASON) -> str:
    """Safe for a terminal and for rich markup: no control characters (no escape sequences),
    markup escaped."""
    return escape(clean(text, limit))


def clean(text: str, limit: int = MAX_SHOWN_REASON) -> str:
    """Safe for a terminal: no control characters, at most ``limit`` characters."""
    text = text[: limit + 1]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "\N{REPLACEMENT CHARACTER}" for c in text)
    if len(text) > limit:
        text = text[: limit - 1] + "\N{HORIZONTAL ELLIPSIS}"
    return text
