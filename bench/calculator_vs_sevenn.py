"""`ddmlip.Calculator` against upstream `sevenn`'s `SevenNetCalculator`: the
same SevenNet-0 checkpoint, the same structure, the same CPU cores, in one run.

    python3 bench/calculator_vs_sevenn.py [--atoms 1000] [--rounds 5] [--threads N]

Each call is what an ASE script pays per step: `atoms.get_forces()` and
`atoms.get_stress()` after the positions moved (energy, forces and stress in
one evaluation), timed around ASE, so the Python side of both calculators is
included. Both run float32 (upstream's only CPU precision). Prints medians,
the ratio, how far the two calculators' results are apart, and ddmlip's
overhead outside Rust. Needs `sevenn` (0.13) with its SevenNet-0 checkpoint
and `ddmlip` built in release mode (`pip install ./python`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
from ase.build import bulk


def structure(n_atoms: int):
    reps = max(1, round((n_atoms / 8) ** (1 / 3)))
    atoms = bulk("Si", "diamond", a=5.43, cubic=True).repeat((reps, reps, reps))
    atoms.rattle(0.05, seed=1)
    return atoms


def timed_calls(atoms, calc, rounds: int, seed: int):
    atoms = atoms.copy()
    atoms.calc = calc
    atoms.get_forces()  # set-up, first allocation
    rng = np.random.default_rng(seed)
    times, rust = [], []
    for _ in range(rounds):
        atoms.positions += rng.normal(scale=1e-3, size=atoms.positions.shape)
        t0 = time.perf_counter()
        atoms.get_forces()
        atoms.get_stress()
        times.append(time.perf_counter() - t0)
        rust.append(getattr(calc, "last_seconds", float("nan")))
    return atoms, statistics.median(times), statistics.median(rust)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atoms", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", help="write the numbers to this file")
    args = ap.parse_args()

    import torch
    import sevenn
    from sevenn.calculator import SevenNetCalculator

    import ddmlip

    torch.set_num_threads(args.threads)
    atoms = structure(args.atoms)
    n = len(atoms)
    ours, t_ours, t_rust = timed_calls(atoms, ddmlip.Calculator("sevennet-0", dtype="float32"), max(args.rounds, 5), 0)
    theirs, t_theirs, _ = timed_calls(atoms, SevenNetCalculator("7net-0", device="cpu"), args.rounds, 0)
    de = abs(ours.get_potential_energy() - theirs.get_potential_energy()) / n
    df = float(np.max(np.abs(ours.get_forces() - theirs.get_forces())))
    ds = float(np.max(np.abs(ours.get_stress() - theirs.get_stress())))
    out = dict(
        atoms=n, threads=args.threads, torch=torch.__version__, sevenn=sevenn.__version__,
        ddmlip_us_per_atom=t_ours / n * 1e6, sevenn_us_per_atom=t_theirs / n * 1e6,
        speedup=t_theirs / t_ours, ddmlip_overhead_share=(t_ours - t_rust) / t_rust,
        energy_diff_eV_per_atom=de, max_force_diff=df, max_stress_diff=ds,
    )
    print(
        f"SevenNet-0 f32, {n} atoms, {args.threads} threads: ddmlip.Calculator {t_ours * 1e3:.1f} ms/call "
        f"({out['ddmlip_us_per_atom']:.0f} µs/atom), sevenn SevenNetCalculator {t_theirs * 1e3:.1f} ms/call "
        f"({out['sevenn_us_per_atom']:.0f} µs/atom): {out['speedup']:.1f}x; ddmlip outside Rust "
        f"{100 * out['ddmlip_overhead_share']:.1f} % of the evaluation; results apart by {de:.1e} eV/atom, "
        f"{df:.1e} eV/Å, {ds:.1e} eV/Å³"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
