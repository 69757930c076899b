"""Run every benchmark; exit non-zero if any ratio is over its target."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["codec.py", "recorder.py", "latency.py", "replay.py"]

if __name__ == "__main__":
    failed = []
    for name in BENCHMARKS:
        try:
            runpy.run_path(str(HERE / name), run_name="__main__")
        except SystemExit as done:
            if done.code:
                failed.append(name)
    sys.exit(1 if failed else 0)
