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
            name, atoms, pairs, threads, t = line.split("\t")
            ours[(name, int(threads))] = (int(atoms), int(pairs), float(t))
    names = sorted({name for name, _ in ours}, key=lambda n: ours[(n, 1)][0])
    header = (
        f"{'system':<18} {'atoms':>7} {'pairs':>9} {'ddmlip 1t':>10} {'ddmlip 2t':>10} "
        f"{'vesin 1t':>9} {'vesin 2t':>9} {'v1t/d1t':>8} {'v2t/d2t':>8}"
    )
    print(f"vesin {vesin.__version__}, cutoff {CUTOFF} A, full list, times in ms (median of {runs})")
    print(header)
    for name in names:
        atoms = ase.io.read(os.path.join(out_dir, name + ".xyz"))
        v_pairs1, v1 = time_vesin(atoms, 1, runs)
        v_pairs2, v2 = time_vesin(atoms, 2, runs)
        n, pairs, d1 = ours[(name, 1)]
        d2 = ours[(name, 2)][2]
        assert n == len(atoms), name
        if v_pairs1 != pairs or v_pairs2 != pairs:
            print(f"WARNING {name}: vesin found {v_pairs1}/{v_pairs2} pairs, ddmlip {pairs}")
        print(
            f"{name:<18} {n:>7} {pairs:>9} {d1*1e3:>10.1f} {d2*1e3:>10.1f} "
            f"{v1*1e3:>9.1f} {v2*1e3:>9.1f} {v1/d1:>8.2f} {v2/d2:>8.2f}"
        )


if __name__ == "__main__":
    main()
