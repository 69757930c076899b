"""Side-by-side timing: variants run alternately in one process, so machine noise hits both."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def per_call_seconds(variants: dict[str, Callable[[], object]], *, number: int, rounds: int = 15) -> dict[str, float]:
    """Median seconds per call of each variant over ``rounds`` interleaved rounds."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for call in variants.values():  # warm up caches and lazy imports
        for _ in range(min(number, 100)):
            call()
    for _ in range(rounds):
        for name, call in variants.items():
            start = time.perf_counter()
            for _ in range(number):
                call()
            samples[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(values) for name, values in samples.items()}


def report(title: str, ours: float, baseline: float, target: float, unit: str = "us") -> bool:
    ratio = ours / baseline
    scale = 1e6 if unit == "us" else 1e9
    verdict = "ok" if ratio <= target else "OVER TARGET"
    print(
        f"{title}: {ours * scale:.2f} {unit} vs {baseline * scale:.2f} {unit} -> ratio {ratio:.3f}x "
        f"(target <= {target:.2f}x) {verdict}"
    )
    return ratio <= target
