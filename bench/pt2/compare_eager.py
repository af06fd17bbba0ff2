#!/usr/bin/env python3
"""Imported `.pt2` models in ddmlip against the same models in eager PyTorch:
speed and peak memory on the same CPU cores, same structure, in one run.

    python3 bench/pt2/compare_eager.py --models nequip,allegro [--atoms 2000] [--rounds 3] [--threads 1] [--dtype f64]
    python3 bench/pt2/compare_eager.py --models mace ...        (in an environment with mace-torch)

The models are the random-weight NequIP, Allegro and MACE of
scripts/fixtures/make_pt2_mlip_fixtures.py (built again here from the same
seeds; ddmlip reads their committed archives, crates/pt2/tests/data/<name>.pt2).
The structure is the fixtures' periodic 32-atom H/C/O cell repeated to about
--atoms atoms. Both sides compute energy, forces and stress in --dtype
(float64 by default; with f32, MACE only, the eager model is cast to float32
and ddmlip runs the float64 archive with `--dtype f32`, and the script also reports
each side's largest force and per-atom energy deviation from eager float64):
eager PyTorch as the fixture script's reference does (forward, then autograd
through positions and a strain), ddmlip with `ddmlip bench model` (neighbour
list included; eager's list is built once, outside the timing).

Each round runs eager PyTorch and ddmlip once each, alternately, every run in
a process of its own (so its peak resident memory is its own); the numbers
are medians over rounds. Needs `ddmlip` built in release mode
(target/release/ddmlip, or --ddmlip PATH).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, 'scripts', 'fixtures'))


def crystal(n_atoms):
    """The fixtures' 32-atom periodic cell repeated k×k×k (k³·32 ≈ n_atoms)."""
    import numpy as np
    from make_pt2_mlip_fixtures import SPECIES
    from make_pt2_fixtures import structures
    _, pos, species, cell, _ = structures()[0]
    species = species % len(SPECIES)
    k = max(1, round((n_atoms / len(pos)) ** (1 / 3)))
    shifts = np.array([(a, b, c) for a in range(k) for b in range(k) for c in range(k)], dtype=float) @ cell
    positions = (pos[None, :, :] + shifts[:, None, :]).reshape(-1, 3)
    return positions, np.tile(species, len(shifts)), cell * k


def write_xyz(path, positions, species, cell):
    from make_pt2_mlip_fixtures import SPECIES
    symbols = {1: 'H', 6: 'C', 8: 'O'}
    with open(path, 'w') as fh:
        fh.write(f'{len(positions)}\n')
        lattice = ' '.join(repr(float(x)) for x in cell.reshape(-1))
        fh.write(f'Lattice="{lattice}" Properties=species:S:1:pos:R:3 pbc="T T T"\n')
        for s, p in zip(species, positions):
            fh.write(f'{symbols[SPECIES[s]]} {float(p[0])!r} {float(p[1])!r} {float(p[2])!r}\n')


def eager_worker(args):
    """One eager run: warm-up, then --repeats timed evaluations; prints JSON."""
    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    from ase.neighborlist import neighbor_list
    from ase import Atoms
    import make_pt2_mlip_fixtures as fx
    positions, species, cell = crystal(args.atoms)
    dtype = {'f64': torch.float64, 'f32': torch.float32}[args.dtype]
    model = fx.MAKERS[args.name]().eval().to(dtype)
    atoms = Atoms(positions=positions, cell=cell, pbc=True)
    i, j, S = neighbor_list('ijS', atoms, fx.CUTOFF)
    edge_index = torch.tensor(np.stack([i, j]), dtype=torch.int64)
    shifts = torch.tensor(S, dtype=dtype)
    sp = torch.tensor(species, dtype=torch.int64)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def evaluate():
        p = torch.tensor(positions, dtype=dtype, requires_grad=True)
        eps = torch.zeros(3, 3, dtype=dtype, requires_grad=True)
        strain = torch.eye(3, dtype=dtype) + 0.5 * (eps + eps.T)
        c = torch.tensor(cell, dtype=dtype) @ strain
        e, ae = model(p @ strain, sp, edge_index, shifts @ c, c)
        gp, ge = torch.autograd.grad(e, [p, eps])
        return float(e), (-gp).double().numpy(), ae.detach().double().numpy()

    energy, forces, energies = evaluate()
    if args.accuracy:
        print(json.dumps(dict(forces=forces.tolist(), energies=energies.tolist())))
        return
    times, cpu = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        evaluate()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(json.dumps(dict(seconds=statistics.median(times), cpu_seconds=statistics.median(cpu), energy=energy,
                          edges=len(i), rss_before_kib=rss_before)))


def run_measured(cmd):
    """Runs cmd; returns (stdout, peak resident KiB of that process)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f'{cmd[0]} failed ({proc.returncode}):\n{err[-3000:]}')
    return out, proc.peak_kib


class Popen(subprocess.Popen):
    """A Popen that records the child's own peak RSS (wait4's rusage)."""

    def _try_wait(self, wait_flags):
        pid, sts, ru = os.wait4(self.pid, wait_flags)
        if pid == self.pid:
            self.peak_kib = ru.ru_maxrss
        return pid, sts


subprocess.Popen = Popen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--models', default='nequip,allegro')
    ap.add_argument('--atoms', type=int, default=2000)
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--dtype', choices=['f64', 'f32'], default='f64')
    ap.add_argument('--ddmlip', default=os.path.join(ROOT, 'target', 'release', 'ddmlip'))
    ap.add_argument('--eager-worker', dest='name', help=argparse.SUPPRESS)
    ap.add_argument('--accuracy', action='store_true', help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.name:
        return eager_worker(args)
    if args.dtype == 'f32' and set(args.models.split(',')) - {'mace'}:
        ap.error('--dtype f32 compares MACE only: the NequIP and Allegro builders fix model_dtype float64, '
                 'which their eager modules cast to')
    positions, species, cell = crystal(args.atoms)
    tmp = tempfile.mkdtemp()
    xyz = os.path.join(tmp, 'crystal.xyz')
    write_xyz(xyz, positions, species, cell)
    print(f'{len(positions)} atoms, {args.threads} thread(s), {args.dtype}, {args.rounds} rounds '
          f'(eager and ddmlip alternating), {args.repeats} timed evaluations per run')
    for name in args.models.split(','):
        archive = os.path.join(ROOT, 'crates', 'pt2', 'tests', 'data', name + '.pt2')
        eager, ours = [], []
        for _ in range(args.rounds):
            out, kib = run_measured([sys.executable, os.path.abspath(__file__), '--eager-worker', name,
                                     '--atoms', str(args.atoms), '--repeats', str(args.repeats),
                                     '--threads', str(args.threads), '--dtype', args.dtype])
            eager.append((json.loads(out.strip().splitlines()[-1]), kib))
            env_threads = str(args.threads)
            out, kib = run_measured([args.ddmlip, 'bench', 'model', '--model', archive, '--structure', xyz,
                                     '--dtype', args.dtype, '--threads', env_threads, '--repeats', str(args.repeats),
                                     '--json'])
            ours.append((json.loads(out)['records'][0], kib))
        te = statistics.median(r['seconds'] for r, _ in eager)
        to = statistics.median(ddmlip_seconds(r) for r, _ in ours)
        # CPU time of the process per evaluation: on a machine shared with
        # other work, wall time also counts waiting for a core.
        ce = statistics.median(r['cpu_seconds'] for r, _ in eager)
        co = statistics.median(r['median_cpu_s'] for r, _ in ours)
        me = statistics.median(k for _, k in eager)
        mb = statistics.median(r['rss_before_kib'] for r, _ in eager)
        # `bench model` times in a worker process of its own: its record has the peak.
        mo = statistics.median(r['peak_rss_bytes'] / 1024 for r, _ in ours)
        mob = statistics.median(r['rss_before_bytes'] / 1024 for r, _ in ours)
        n = len(positions)
        print(f'{name:8s} eager {te * 1e3:9.1f} ms  ddmlip {to * 1e3:9.1f} ms  eager/ddmlip {te / to:5.2f}x  | '
              f'peak RSS eager {me / 1024:7.1f} MiB (before the first evaluation {mb / 1024:.1f}), '
              f'ddmlip {mo / 1024:7.1f} MiB (before {mob / 1024:.1f}); evaluation memory per atom '
              f'eager {(me - mb) / n:.1f} KiB, ddmlip {(mo - mob) / n:.1f} KiB', flush=True)
        print(f'         runs: eager {[round(r["seconds"], 4) for r, _ in eager]}, '
              f'ddmlip {[round(ddmlip_seconds(r), 4) for r, _ in ours]}', flush=True)
        print(f'         CPU time: eager {ce * 1e3:.1f} ms  ddmlip {co * 1e3:.1f} ms  eager/ddmlip {ce / co:5.2f}x',
              flush=True)
        if args.dtype == 'f32':
            accuracy(args, name, archive, xyz)


def accuracy(args, name, archive, xyz):
    """Largest force and per-atom energy deviations of eager float32 and
    ddmlip --dtype f32 from eager float64 on the timed structure."""
    import numpy as np

    def eager(dtype):
        out, _ = run_measured([sys.executable, os.path.abspath(__file__), '--eager-worker', name, '--accuracy',
                               '--atoms', str(args.atoms), '--threads', str(args.threads), '--dtype', dtype])
        r = json.loads(out.strip().splitlines()[-1])
        return np.array(r['forces']), np.array(r['energies'])

    (f64, e64), (f32, e32) = eager('f64'), eager('f32')
    out, _ = run_measured([args.ddmlip, 'eval', '--model', archive, '--structure', xyz, '--dtype', 'f32',
                           '--json'])
    r = json.loads(out)
    fd, ed = np.array(r['forces']).reshape(-1, 3), np.array(r['atomic_energies']).reshape(-1)
    print(f'         f32 against eager float64: max |ΔF| eager {np.abs(f32 - f64).max():.2e} eV/Å, '
          f'ddmlip {np.abs(fd - f64).max():.2e} eV/Å; max |ΔE_i| eager {np.abs(e32 - e64).max():.2e} eV, '
          f'ddmlip {np.abs(ed - e64).max():.2e} eV', flush=True)


def ddmlip_seconds(record):
    """The median seconds per evaluation of a `ddmlip bench model --json` record."""
    return record['median_s']


if __name__ == '__main__':
    main()
