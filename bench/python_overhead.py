"""Per-call overhead of `ddmlip.Calculator` (Python <-> Rust: array
conversion, ASE's bookkeeping) against the evaluation itself.

    python3 bench/python_overhead.py [--model lj] [--atoms 1000] [--rounds 20]

For each call: `call` is ASE's `atoms.get_forces()` after a position change
(ASE's state check and atoms copy, the arrays in and out, the evaluation);
`rust` is the time the evaluation took inside Rust (`Calculator.last_seconds`).
`conversion` is the same for a direct call of the extension (arrays in and
out only, without ASE). Prints medians and the overheads as shares of the
evaluation.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from ase.build import bulk

import ddmlip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="lj")
    ap.add_argument("--atoms", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=1)
    args = ap.parse_args()
    element, a = ("Ar", 5.26) if args.model == "lj" else ("Cu", 3.615)
    cells = max(1, int((args.atoms / 4) ** (1 / 3)))
    layers = int(np.ceil(args.atoms / (4 * cells * cells)))
    atoms = bulk(element, "fcc", a=a, cubic=True).repeat((cells, cells, layers))
    atoms.rattle(0.02, seed=1)
    atoms.calc = ddmlip.Calculator(args.model, ranks=args.ranks)
    atoms.get_forces()  # first call: model set-up and the memory the next calls reuse
    rng = np.random.default_rng(0)
    totals, rusts = [], []
    for _ in range(args.rounds):
        atoms.positions += rng.normal(scale=1e-4, size=atoms.positions.shape)
        started = time.perf_counter()
        atoms.get_forces()
        totals.append(time.perf_counter() - started)
        rusts.append(atoms.calc.last_seconds)
    engine = atoms.calc._engine
    direct = []
    for _ in range(args.rounds):
        arrays = ddmlip._system_arrays(atoms)
        started = time.perf_counter()
        engine.evaluate(*arrays)
        direct.append(time.perf_counter() - started - engine.last_seconds)
    total, rust = statistics.median(totals), statistics.median(rusts)
    overhead = statistics.median([t - r for t, r in zip(totals, rusts)])
    conversion = statistics.median(direct)
    print(
        f"{args.model}, {len(atoms)} atoms, {args.ranks} rank(s), {args.rounds} calls (medians): "
        f"call {total * 1e3:.3f} ms, evaluation in Rust {rust * 1e3:.3f} ms; "
        f"overhead {overhead * 1e6:.0f} µs = {100 * overhead / rust:.2f} % of the evaluation, "
        f"of which array conversion {conversion * 1e6:.0f} µs ({100 * conversion / rust:.3f} %)"
    )


if __name__ == "__main__":
    main()
