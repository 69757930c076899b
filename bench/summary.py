"""`ng-otel summary` and `ng-otel show` on a collection run's saved rows vs the floor: a plain loop
that reads the same file and parses each line with orjson.

Targets: summary at most 4x the floor, with the run's coverage (a materialized inputs file
beside the rows, every rollout of the rows and 1 % that never finished; the floor reads it
too); show (every tree, written to a file as a pipe gets it)
at most 15x the floor (the show before this took ~30 s here, ~200x the floor: 15x is 13x faster). The variants
run alternately in one process, so machine noise hits all of them. Also prints the peak of
Python allocations while summarising one copy of the file and four (flat: rows stream).
Run: .venv/bin/python bench/summary.py [rows, default 50000]
"""

from __future__ import annotations

import io
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from _mixed_rows import write_mixed_rows
from rich.console import Console

from ng_otel.cli.show import show_paths
from ng_otel.runs.summary import summarise

ROUNDS = 5


def floor(*paths: Path) -> None:
    for path in paths:
        with path.open("rb") as stream:
            for line in stream:
                try:
                    orjson.loads(line)
                except orjson.JSONDecodeError:
                    pass


def write_inputs(rows: Path) -> tuple[Path, int]:
    """Gym's materialized inputs beside ``rows``: each rollout the rows name, and 1 % more that
    no row names (rollouts that never finished); returns the file and how many those are."""
    keys = []
    with rows.open("rb") as stream:
        for line in stream:
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if "_ng_task_index" in row:
                keys.append((row["_ng_task_index"], row["_ng_rollout_index"]))
    missing = [(f"never-{index}", 0) for index in range(max(1, len(keys) // 100))]
    inputs = rows.with_name(rows.stem + "_materialized_inputs.jsonl")
    with inputs.open("wb") as out:
        for task, rollout in [*keys, *missing]:
            out.write(orjson.dumps({"_ng_task_index": task, "_ng_rollout_index": rollout, "prompt": "p"}) + b"\n")
    return inputs, len(missing)


def show_to_file(path: Path) -> None:
    show_paths([path], Console(file=io.StringIO(), width=200, highlight=False))


def timed(variants: dict[str, Callable[[], object]]) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, call in variants.items():
            start = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def verdict(title: str, ours: float, floor_seconds: float, target: float) -> bool:
    ratio = ours / floor_seconds
    print(
        f"{title}: {ours:.2f} s vs {floor_seconds:.2f} s -> ratio {ratio:.2f}x (target <= {target:.0f}x) "
        + ("ok" if ratio <= target else "OVER TARGET")
    )
    return ratio <= target


def peak_mib(call: Callable[[], object]) -> float:
    tracemalloc.start()
    call()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def main(count: int = 50_000) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        expected = write_mixed_rows(path, count)
        inputs, never_finished = write_inputs(path)
        got = summarise([path]).to_json()
        assert {key: got[key] for key in expected} == expected, "summary disagrees with the generator"
        assert got["coverage"]["unknown"] == never_finished, "the coverage misses the rollouts that never finished"
        seconds = timed(
            {
                "floor": lambda: floor(path, inputs),
                "summary": lambda: summarise([path]),
                "show": lambda: show_to_file(path),
            }
        )
        size = path.stat().st_size / 2**20
        one, four = peak_mib(lambda: summarise([path])), peak_mib(lambda: summarise([path] * 4))
    print(
        f"{count:,} rows ({size:.0f} MiB, {expected['events']:,} events): floor {seconds['floor']:.2f} s, "
        f"summary {seconds['summary']:.2f} s, show {seconds['show']:.2f} s"
    )
    print(f"summary peak Python allocations: {one:.1f} MiB over {count:,} rows, {four:.1f} MiB over {4 * count:,}")
    ok = verdict(f"summary of {count:,} rows vs orjson floor", seconds["summary"], seconds["floor"], 4.0)
    ok &= verdict(f"show of {count:,} rows vs orjson floor", seconds["show"], seconds["floor"], 15.0)
    return ok and four < 2 * one + 1


if __name__ == "__main__":
    sys.exit(0 if main(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000) else 1)
