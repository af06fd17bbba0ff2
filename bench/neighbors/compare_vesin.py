"""Time vesin on the inputs written by the `nl_bench` example and print a
comparison table with the ddmlip timings it recorded.

Usage: python3 bench/neighbors/compare_vesin.py OUT_DIR [RUNS]
"""

import os
import statistics
import sys
import time

import ase.io
import numpy as np
import vesin

CUTOFF = 5.0


def time_vesin(atoms, full, n_threads, runs):
    """Median wall and process-CPU seconds of `runs` calls after one warm-up."""
    nl = vesin.NeighborList(cutoff=CUTOFF, full_list=full, n_threads=n_threads)
    points = np.ascontiguousarray(atoms.positions)
    box = np.ascontiguousarray(atoms.cell.array)
    periodic = [bool(p) for p in atoms.pbc]
    times = []
    cpu_times = []
    pairs = 0
    for _ in range(runs + 1):
        start = time.perf_counter()
        cpu_start = time.process_time()
        # Same quantities ddmlip returns: i, j, S, vectors, distances.
        i, j, S, D, d = nl.compute(points, box, periodic, quantities="ijSDd", copy=False)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        pairs = len(i)
        del i, j, S, D, d
    return pairs, statistics.median(times[1:]), statistics.median(cpu_times[1:])


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "bench_out"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    ours = {}
    with open(os.path.join(out_dir, "ddmlip_times.tsv")) as f:
        next(f)
        for line in f:
            name, atoms, pairs, kind, mode, threads, t, cpu = line.split("\t")
            ours[(name, kind, mode, int(threads))] = (int(atoms), int(pairs), float(t), float(cpu))
    names = sorted({key[0] for key in ours}, key=lambda n: ours[(n, "full", "fresh", 1)][0])
    print(f"vesin {vesin.__version__}, cutoff {CUTOFF} A, times in ms (median of {runs})")
    print("ddmlip fresh: new list per call; reuse: neighbor_list_into with a kept list")
    print("ratio = vesin time / ddmlip reuse time (> 1: ddmlip faster); wall clock and process CPU time")
    print(
        f"{'system':<18} {'kind':>4} {'atoms':>7} {'pairs':>9} {'fresh 1t':>9} {'fresh 2t':>9} "
        f"{'reuse 1t':>9} {'reuse 2t':>9} {'vesin 1t':>9} {'vesin 2t':>9} {'ratio 1t':>9} "
        f"{'ratio 2t':>9} {'cpu r 1t':>9} {'cpu r 2t':>9}"
    )
    for name in names:
        atoms = ase.io.read(os.path.join(out_dir, name + ".xyz"))
        for kind in ("full", "half"):
            v_pairs1, v1, c1 = time_vesin(atoms, kind == "full", 1, runs)
            v_pairs2, v2, c2 = time_vesin(atoms, kind == "full", 2, runs)
            n, pairs, f1, _ = ours[(name, kind, "fresh", 1)]
            f2 = ours[(name, kind, "fresh", 2)][2]
            _, _, r1, rc1 = ours[(name, kind, "reuse", 1)]
            _, _, r2, rc2 = ours[(name, kind, "reuse", 2)]
            assert n == len(atoms), name
            if v_pairs1 != pairs or v_pairs2 != pairs:
                print(f"WARNING {name} {kind}: vesin found {v_pairs1}/{v_pairs2} pairs, ddmlip {pairs}")
            print(
                f"{name:<18} {kind:>4} {n:>7} {pairs:>9} {f1*1e3:>9.1f} {f2*1e3:>9.1f} "
                f"{r1*1e3:>9.1f} {r2*1e3:>9.1f} {v1*1e3:>9.1f} {v2*1e3:>9.1f} {v1/r1:>9.2f} "
                f"{v2/r2:>9.2f} {c1/rc1:>9.2f} {c2/rc2:>9.2f}"
            )


if __name__ == "__main__":
    main()
