"""The fastest variant of `kernel_ab.py` runs worth serving: prints its patches joined by + (nothing where no
variant wins), ready for `kernel_sources.py` to write over the tree.

A variant wins when its kernel alone is at least `--min-gain` percent under the shipped kernel's median in the
same run, its one-row frame step is faster too, and its outputs pass: the talker's worst relative difference at
most `--max-diff`; the predictor's codes identical in at least half of the random states and, where identical,
its embedding sum within `--max-diff`. Given several runs (the talker's and the predictor's), one winner a run,
chained in the order given.

    python tools/kernel_lab/ab_winner.py /tmp/kv/ab-talker-safe.json /tmp/kv/ab-talker-handoff.json \\
        /tmp/kv/ab-predictor-safe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

VARIANTS = Path(__file__).resolve().parent / "variants"


def winner(run: dict, min_gain: float, max_diff: float) -> tuple[str, float] | None:
    """(build name, gain in percent) of the run's fastest passing variant, or None."""
    builds = {n: b for n, b in run["builds"].items() if b.get("alone_us")}
    if "shipped" not in builds:
        return None
    base_us = statistics.median(builds["shipped"]["alone_us"])
    base_ms = statistics.median(builds["shipped"]["step_ms"])
    best = None
    for name, b in builds.items():
        if name == "shipped" or b["worst_rel_diff"] > max_diff or 2 * b["identical_codes"] < b["states"]:
            continue
        gain = 100 * (base_us - statistics.median(b["alone_us"])) / base_us
        if gain >= min_gain and statistics.median(b["step_ms"]) < base_ms and (best is None or gain > best[1]):
            best = (name, gain)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="kernel_ab.py JSON files (missing ones are skipped)")
    ap.add_argument("--min-gain", type=float, default=1.0, help="percent of the shipped kernel's time")
    ap.add_argument("--max-diff", type=float, default=0.02)
    args = ap.parse_args()
    best: dict[str, tuple[str, float]] = {}  # kernel -> its fastest winner over the runs
    for path in args.runs:
        if not Path(path).exists():
            print(f"# {path}: missing", file=sys.stderr)
            continue
        run = json.loads(Path(path).read_text())
        found = winner(run, args.min_gain, args.max_diff)
        print(f"# {path}: {found[0]} {found[1]:+.1f}%" if found else f"# {path}: no winner", file=sys.stderr)
        if found and (run["kernel"] not in best or found[1] > best[run["kernel"]][1]):
            best[run["kernel"]] = found
    print("+".join(str(VARIANTS / f"{stem}.patch") for name, _ in best.values() for stem in name.split("+")))


if __name__ == "__main__":
    main()
