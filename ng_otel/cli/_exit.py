"""The command line's exit statuses, and the one line a usage error prints."""

from __future__ import annotations

import sys
from typing import Final

from ng_otel.cli._text import clean

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


def usage_error(message: str) -> int:
    """``message`` as one line on stderr, control characters replaced; the usage exit status."""
    sys.stderr.write(f"ng-otel: {clean(message, 1000)}\n")
    sys.stderr.flush()
    return EXIT_USAGE
