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


def time_vesin(atoms, n_threads, runs):
    nl = vesin.NeighborList(cutoff=CUTOFF, full_list=True, n_threads=n_threads)
    points = np.ascontiguousarray(atoms.positions)
    box = np.ascontiguousarray(atoms.cell.array)
    periodic = [bool(p) for p in atoms.pbc]
    times = []
    pairs = 0
    for _ in range(runs + 1):
        start = time.perf_counter()
        # Same quantities ddmlip returns: i, j, S, vectors, distances.
        i, j, S, D, d = nl.compute(points, box, periodic, quantities="ijSDd", copy=False)
        times.append(time.perf_counter() - start)
        pairs = len(i)
        del i, j, S, D, d
    return pairs, statistics.median(times[1:])


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "bench_out"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    ours = {}
    with open(os.path.join(out_dir, "ddmlip_times.tsv")) as f:
        next(f)
        for line in f:
            name, atoms, pairs, mode, threads, t = line.split("\t")
            ours[(name, mode, int(threads))] = (int(atoms), int(pairs), float(t))
    names = sorted({key[0] for key in ours}, key=lambda n: ours[(n, "fresh", 1)][0])
    print(f"vesin {vesin.__version__}, cutoff {CUTOFF} A, full list, times in ms (median of {runs})")
    print("ddmlip fresh: new list per call; reuse: neighbor_list_into with a kept list")
    print("ratio = vesin time / ddmlip reuse time (> 1: ddmlip faster)")
    print(
        f"{'system':<18} {'atoms':>7} {'pairs':>9} {'fresh 1t':>9} {'fresh 2t':>9} {'reuse 1t':>9} "
        f"{'reuse 2t':>9} {'vesin 1t':>9} {'vesin 2t':>9} {'ratio 1t':>9} {'ratio 2t':>9}"
    )
    for name in names:
        atoms = ase.io.read(os.path.join(out_dir, name + ".xyz"))
        v_pairs1, v1 = time_vesin(atoms, 1, runs)
        v_pairs2, v2 = time_vesin(atoms, 2, runs)
        n, pairs, f1 = ours[(name, "fresh", 1)]
        f2 = ours[(name, "fresh", 2)][2]
        r1 = ours[(name, "reuse", 1)][2]
        r2 = ours[(name, "reuse", 2)][2]
        assert n == len(atoms), name
        if v_pairs1 != pairs or v_pairs2 != pairs:
            print(f"WARNING {name}: vesin found {v_pairs1}/{v_pairs2} pairs, ddmlip {pairs}")
        print(
            f"{name:<18} {n:>7} {pairs:>9} {f1*1e3:>9.1f} {f2*1e3:>9.1f} {r1*1e3:>9.1f} {r2*1e3:>9.1f} "
            f"{v1*1e3:>9.1f} {v2*1e3:>9.1f} {v1/r1:>9.2f} {v2/r2:>9.2f}"
        )


if __name__ == "__main__":
    main()
