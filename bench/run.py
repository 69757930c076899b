"""Run every benchmark, each in its own interpreter (so a peak-RSS figure is that benchmark's
own), then print every figure that has a target once more, together; exit non-zero if any is
over its target. The machine is shared: docs/performance.md gives the ranges over runs.

Run: make bench (or .venv/bin/python bench/run.py [name ...], e.g. run.py latency throughput)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    "codec",
    "recorder",
    "client_context",
    "latency",
    "replay",
    "failing_path",
    "instructions",
    "throughput",
    "memory",
    "summary",
    "gym_run",  # real NeMo Gym 0.7.0 (tools/real-gym.sh's venv); needs root, else exits 2
]


def run(name: str) -> tuple[int, list[str]]:
    print(f"== {name} ==", flush=True)
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, str(HERE / f"{name}.py")], stdout=subprocess.PIPE, text=True, bufsize=1)
    figures = []
    assert process.stdout is not None
    for line in process.stdout:
        print(line, end="", flush=True)
        if "target" in line:
            figures.append(f"{name}: {line.strip()}")
    code = process.wait()
    print(f"== {name}: {time.monotonic() - started:.0f} s ==", flush=True)
    return code, figures


if __name__ == "__main__":
    chosen = sys.argv[1:] or BENCHMARKS
    results = [run(name) for name in chosen]
    print("\n== every figure with its target ==")
    for _, figures in results:
        for figure in figures:
            print(figure)
    failed = [name for name, (code, _) in zip(chosen, results, strict=True) if code]
    if failed:
        print(f"over target or failed: {', '.join(failed)}")
    sys.exit(1 if failed else 0)
