"""Writes the example inputs the README uses (needs ASE: `pip install ase`).

    python3 examples/make_examples.py [OUT_DIR]    # default: the examples folder

The files are committed next to this script; running it again reproduces
them bit for bit (fixed seeds).
"""
import json
import os
import sys

import ase.io
from ase import Atoms
from ase.build import bulk
from ase.cluster import Icosahedron

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
os.makedirs(out, exist_ok=True)


def write(name, atoms):
    ase.io.write(os.path.join(out, name), atoms, format="extxyz")


# NaCl rock salt, conventional cubic a = 5.64 Å repeated 6×5×4 (960 atoms,
# 33.84 × 28.2 × 22.56 Å), rattled: the geometry of the `nacl_rocksalt_960`
# SevenNet-0 reference fixture.
nacl = bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat((6, 5, 4))
nacl.rattle(stdev=0.05, seed=20240718)
write("nacl960.xyz", nacl)

# FCC copper a = 3.615 Å, 6×6×6 conventional cells (864 atoms, 21.69 Å box), rattled.
cu = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((6, 6, 6))
cu.rattle(stdev=0.05, seed=1)
write("cu864.xyz", cu)

# A 561-atom Cu icosahedron off-centre in a 40 Å periodic box.
cluster = Icosahedron("Cu", noshells=6)
cluster.cell = [40.0, 40.0, 40.0]
cluster.pbc = True
cluster.center()
cluster.translate([-5.0, -5.0, -5.0])
write("cu_cluster.xyz", cluster)

# Two argon atoms 2.5 Å apart, no cell.
write("pair.xyz", Atoms("Ar2", positions=[[0.0, 0.0, 0.0], [2.5, 0.0, 0.0]]))

# A wrong spec for rebuild-demo (it builds its own neighbour list, so its
# scatters must stay local): `validate` fixes it, `eval --spec` warns.
prior = {
    "version": 1,
    "policy": {"kind": "halo", "scatter": "halo_correction", "gather": "halo_read"},
    "system_reductions": True,
    "output_kinds": {"energy": "per_system", "forces": "per_atom"},
    "all_reduce_outputs": ["stress"],
}
with open(os.path.join(out, "prior.json"), "w") as f:
    json.dump(prior, f, indent=2)
    f.write("\n")
