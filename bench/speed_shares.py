#!/usr/bin/env python3
"""Would shares proportional to each rank's measured speed have helped?

For every recorded split run (`rank_work_s`: per step, each rank's own work
in s), replays the steps: each rank's speed is estimated from its earlier
steps (exponential average with weight ALPHA on the newest), its share of
the atoms is set proportional to that speed, and the step takes the longest
rank's work scaled by its share. Prints, per ALPHA, how many runs would
have been slower than with equal shares, and the ratio of step times.

Usage: python3 bench/speed_shares.py bench/results/*_host16_run*_lj.jsonl
"""
import json
import statistics as st
import sys

ALPHAS = (1.0, 0.5, 0.3)


def replay(work, alpha):
    """Mean step time (equal shares, speed-proportional shares)."""
    n = len(work[0])
    estimate = None
    equal, shared = [], []
    for row in work:
        equal.append(max(row))
        if estimate is None:
            shared.append(max(row))
            estimate = list(row)
            continue
        speed = [1.0 / e for e in estimate]
        share = [s / sum(speed) * n for s in speed]
        shared.append(max(row[r] * share[r] for r in range(n)))
        estimate = [alpha * row[r] + (1 - alpha) * estimate[r] for r in range(n)]
    return st.mean(equal[1:]), st.mean(shared[1:])


def main(paths):
    ratios = {a: [] for a in ALPHAS}
    for path in paths:
        for line in open(path):
            record = json.loads(line)
            work = record.get("rank_work_s")
            if not work or len(work) < 3 or len(work[0]) < 2 or record.get("balance") == "measured":
                continue
            for a in ALPHAS:
                equal, shared = replay(work, a)
                ratios[a].append(shared / equal)
    for a, r in ratios.items():
        if not r:
            print("no split runs with per-rank work in the given files")
            return
        slower = sum(x > 1 for x in r)
        print(
            f"alpha {a}: {slower} of {len(r)} runs slower with speed shares; "
            f"step ratio min {min(r):.3f} median {st.median(r):.3f} max {max(r):.3f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
