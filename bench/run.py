"""Run every benchmark, each in its own interpreter (so a peak-RSS figure is that benchmark's
own); exit non-zero if any ratio is over its target."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["codec.py", "recorder.py", "latency.py", "replay.py", "summary.py"]

if __name__ == "__main__":
    failed = [name for name in BENCHMARKS if subprocess.run([sys.executable, str(HERE / name)]).returncode]
    sys.exit(1 if failed else 0)
