"""`ng-otel summary` and `ng-otel show` on a collection run's saved rows vs the floor: a plain loop
that reads the same file and parses each line with orjson.

Targets: summary at most 4x the floor, with the run's coverage (a materialized inputs file
beside the rows, every rollout of the rows and 1 % that never finished; the floor reads it
too); show (every tree, written to a file as a pipe gets it)
at most 15x the floor (the show before this took ~30 s here, ~200x the floor: 15x is 13x faster). The variants
run in turn in one process, seven rounds; each ratio is a variant's best round of CPU time over
the floor's best. Also prints the peak of
Python allocations while summarising one copy of the file and four (flat: rows stream).
Run: .venv/bin/python bench/summary.py [rows, default 50000]
"""

from __future__ import annotations

import io
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

ROUNDS = 7


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


def timed(variants: dict[str, Callable[[], object]]) -> dict[str, list[float]]:
    """Each variant's CPU seconds per round, the variants run in turn in every round."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, call in variants.items():
            start = time.process_time()  # CPU seconds: steadier here than wall time, and all of it is ours
            call()
            samples[name].append(time.process_time() - start)
    return samples


def verdict(title: str, ours: list[float], floor_seconds: list[float], target: float) -> bool:
    """The best round of ``ours`` over the floor's best, as ``timeit`` takes its figure: the
    machine's noise only ever adds time (here it moves a single round by up to 40 %)."""
    ratio = min(ours) / min(floor_seconds)
    print(
        f"{title}: {min(ours):.2f} s vs {min(floor_seconds):.2f} s -> ratio {ratio:.2f}x "
        f"(target <= {target:.0f}x) " + ("ok" if ratio <= target else "OVER TARGET")
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
        f"{count:,} rows ({size:.0f} MiB, {expected['events']:,} events), CPU seconds, best of {ROUNDS}: floor "
        f"{min(seconds['floor']):.2f} s, summary {min(seconds['summary']):.2f} s, show {min(seconds['show']):.2f} s"
    )
    print(f"summary peak Python allocations: {one:.1f} MiB over {count:,} rows, {four:.1f} MiB over {4 * count:,}")
    ok = verdict(f"summary of {count:,} rows vs orjson floor", seconds["summary"], seconds["floor"], 4.0)
    ok &= verdict(f"show of {count:,} rows vs orjson floor", seconds["show"], seconds["floor"], 15.0)
    return ok and four < 2 * one + 1


if __name__ == "__main__":
    sys.exit(0 if main(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000) else 1)
