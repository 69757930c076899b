"""The coverage account's cost: bytes kept per rollout, and its time against the orjson floor.

Memory: the peak of Python allocations while accounting for a generated run of N rollouts and
of 4N, rows generated one at a time (so the rows themselves are not held): the difference over
3N is what each rollout costs, the one entry per rollout the account needs. Time: the account
of the run's three files against a plain loop that parses every line of them with orjson.
Prints the figures; no target (the account runs inside summary, whose bench/summary.py has one).
Run: .venv/bin/python bench/coverage.py [rollouts, default 50000]
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from ng_otel.runs.coverage import RunFiles, read_run_coverage, run_coverage

REPEATS = 4  # rollouts per task
AGENTS = ("simpleqa_simple_agent", "math_agent")
SCALE = 4  # the larger run is this many times the smaller
ROUNDS = 5
SEED = 25
MASKED, SCORED, FAILED = 0.08, 0.8, 0.9  # the run's shares, cumulative: the rest is missing


def generated(rollouts: int) -> tuple[Iterator[dict], Iterator[dict], Iterator[dict]]:
    """(main rows, sidecar rows, inputs) of a run of ``rollouts``: 80% scored (a tenth of them
    masked), 10% failed, 10% missing; each stream generated as it is read."""

    def fates() -> Iterator[tuple[int, int, str, float]]:
        chance = random.Random(SEED)
        for task in range(rollouts // REPEATS):
            for rollout in range(REPEATS):
                yield task, rollout, AGENTS[task % len(AGENTS)], chance.random()

    def row(task: int, rollout: int, agent: str) -> dict:
        return {"_ng_task_index": task, "_ng_rollout_index": rollout, "agent_ref": {"name": agent}}

    main = ({**row(t, r, a), "reward": 1.0, "mask_sample": d < MASKED} for t, r, a, d in fates() if d < SCORED)
    failure = {"_ng_failure_class": "agent_run_error"}
    failed = ({**row(t, r, a), **failure} for t, r, a, d in fates() if SCORED <= d < FAILED)
    inputs = (row(t, r, a) for t, r, a, _ in fates())
    return main, failed, inputs


def peak_bytes(call: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def write(path: Path, rows: Iterator[dict]) -> Path:
    with path.open("wb") as stream:
        for item in rows:
            stream.write(orjson.dumps(item) + b"\n")
    return path


def floor(files: RunFiles) -> None:
    for path in files:
        assert path is not None
        with path.open("rb") as stream:
            for line in stream:
                orjson.loads(line)


def median_seconds(call: Callable[[], object]) -> float:
    samples = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main(rollouts: int) -> None:
    small = peak_bytes(lambda: run_coverage(*generated(rollouts)))
    large = peak_bytes(lambda: run_coverage(*generated(SCALE * rollouts)))
    per_rollout = (large - small) / ((SCALE - 1) * rollouts)
    print(
        f"coverage peak Python allocations: {small / 2**20:.1f} MiB over {rollouts:,} rollouts, "
        f"{large / 2**20:.1f} MiB over {SCALE * rollouts:,}: {per_rollout:.0f} bytes per rollout"
    )
    with tempfile.TemporaryDirectory() as tmp:
        main_rows, failures, inputs = generated(rollouts)
        files = RunFiles(
            write(Path(tmp) / "rollouts.jsonl", main_rows),
            write(Path(tmp) / "rollouts_failures.jsonl", failures),
            write(Path(tmp) / "rollouts_materialized_inputs.jsonl", inputs),
        )
        floor_seconds = median_seconds(lambda: floor(files))
        ours = median_seconds(lambda: read_run_coverage(files))
    print(
        f"coverage of {rollouts:,} rollouts' three files: {ours:.3f} s vs orjson floor {floor_seconds:.3f} s "
        f"-> ratio {ours / floor_seconds:.2f}x"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000)
