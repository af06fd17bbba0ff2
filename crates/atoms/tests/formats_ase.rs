//! POSCAR and gzip-compressed files against ASE, both ways: ASE writes
//! (`ase.io.write`, formats `vasp` Cartesian and Direct, and `.xyz.gz`),
//! ddmlip reads; ddmlip writes, ASE reads. Positions, cells and elements
//! agree to rounding of the printed digits.

use ddmlip_atoms::{read_structure, write_structure, System};
use std::path::Path;
use std::process::Command;

fn python(script: &str, dir: &Path) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(dir)
        .output()
        .expect("python3 with ASE is needed (pip install ase)");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The structure both sides use: triclinic, unsorted species, an atom
/// outside the cell.
const BUILD: &str = r#"
import sys, json, numpy as np
from ase import Atoms
d = sys.argv[1]
atoms = Atoms("NaClNaClSiO",
    positions=[[0.1, 0.2, 0.3], [2.8, 0.1, 0.2], [0.3, 2.9, 0.1], [2.7, 2.8, 0.4], [1.5, 1.4, 4.9], [6.2, -0.7, 2.2]],
    cell=[[5.6, 0.0, 0.0], [0.8, 5.4, 0.0], [-0.6, 0.9, 5.9]], pbc=True)
"#;

fn assert_close(system: &System, reference: &serde_json::Value, tol: f64) {
    let numbers: Vec<u32> = serde_json::from_value(reference["numbers"].clone()).unwrap();
    let positions: Vec<[f64; 3]> = serde_json::from_value(reference["positions"].clone()).unwrap();
    let cell: [[f64; 3]; 3] = serde_json::from_value(reference["cell"].clone()).unwrap();
    assert_eq!(system.numbers, numbers);
    assert_eq!(system.pbc, [true; 3]);
    let matrix = system.cell.unwrap().matrix;
    for k in 0..3 {
        for m in 0..3 {
            assert!(
                (matrix[k][m] - cell[k][m]).abs() < tol,
                "cell {matrix:?} vs {cell:?}"
            );
        }
    }
    assert_eq!(system.positions.len(), positions.len());
    for (a, b) in system.positions.iter().zip(&positions) {
        for k in 0..3 {
            assert!((a[k] - b[k]).abs() < tol, "{a:?} vs {b:?}");
        }
    }
}

#[test]
fn ase_written_poscars_and_gzip_files_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "{BUILD}
from ase.io import write
write(d + '/POSCAR', atoms, format='vasp')
write(d + '/CONTCAR', atoms, format='vasp', direct=True)
write(d + '/si.vasp', atoms, format='vasp', vasp5=False)
write(d + '/frames.xyz.gz', [atoms, atoms])
print(json.dumps(dict(numbers=atoms.numbers.tolist(), positions=atoms.positions.tolist(), cell=atoms.cell.tolist())))
"
    );
    let reference: serde_json::Value = serde_json::from_str(&python(&script, dir.path())).unwrap();
    for name in ["POSCAR", "CONTCAR", "si.vasp"] {
        let frames = read_structure(dir.path().join(name)).unwrap();
        assert_eq!(frames.len(), 1, "{name}");
        assert_close(&frames[0], &reference, 1e-7);
    }
    let frames = read_structure(dir.path().join("frames.xyz.gz")).unwrap();
    assert_eq!(frames.len(), 2);
    for f in &frames {
        assert_close(f, &reference, 1e-12);
    }
}

#[test]
fn ddmlip_written_poscars_and_gzip_files_are_read_by_ase() {
    let dir = tempfile::tempdir().unwrap();
    // Build the structure from ASE's numbers, write it with ddmlip.
    let script = format!(
        "{BUILD}
print(json.dumps(dict(numbers=atoms.numbers.tolist(), positions=atoms.positions.tolist(), cell=atoms.cell.tolist())))
"
    );
    let reference: serde_json::Value = serde_json::from_str(&python(&script, dir.path())).unwrap();
    let system = System::new(
        serde_json::from_value(reference["positions"].clone()).unwrap(),
        serde_json::from_value(reference["numbers"].clone()).unwrap(),
        Some(ddmlip_atoms::Cell::new(
            serde_json::from_value(reference["cell"].clone()).unwrap(),
        )),
        [true; 3],
    );
    write_structure(dir.path().join("POSCAR"), std::slice::from_ref(&system)).unwrap();
    write_structure(
        dir.path().join("out.xyz.gz"),
        &[system.clone(), system.clone()],
    )
    .unwrap();
    let back = python(
        r#"
import sys, json
from ase.io import read
d = sys.argv[1]
out = []
for atoms in [read(d + '/POSCAR', format='vasp')] + read(d + '/out.xyz.gz', index=':'):
    out.append(dict(numbers=atoms.numbers.tolist(), positions=atoms.positions.tolist(), cell=atoms.cell.tolist()))
print(json.dumps(out))
"#,
        dir.path(),
    );
    let back: Vec<serde_json::Value> = serde_json::from_str(&back).unwrap();
    assert_eq!(back.len(), 3);
    for b in &back {
        assert_close(&system, b, 1e-12);
    }
    // A POSCAR holds one frame.
    assert!(write_structure(dir.path().join("two.vasp"), &[system.clone(), system]).is_err());
}

#[test]
fn ase_written_lammps_data_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "{BUILD}
from ase.io import write
atoms.set_initial_charges([0.5, -0.5, 0.5, -0.5, 0.0, 0.0])
write(d + '/atomic.data', atoms, format='lammps-data', masses=True, atom_style='atomic')
write(d + '/charge.lmp', atoms, format='lammps-data', masses=True, atom_style='charge')
from ase.io import read
back = read(d + '/atomic.data', format='lammps-data', atom_style='atomic')
print(json.dumps(dict(numbers=atoms.numbers.tolist(), positions=back.positions.tolist(), cell=back.cell.tolist(), charges=atoms.get_initial_charges().tolist())))
"
    );
    let reference: serde_json::Value = serde_json::from_str(&python(&script, dir.path())).unwrap();
    // ASE rotates a triclinic cell into LAMMPS's lower-triangular form; its
    // own reading of the file is the reference for cell and positions.
    for name in ["atomic.data", "charge.lmp"] {
        let frames = read_structure(dir.path().join(name)).unwrap();
        assert_eq!(frames.len(), 1);
        assert_close(&frames[0], &reference, 1e-6);
    }
    let charged = read_structure(dir.path().join("charge.lmp")).unwrap();
    let charges: Vec<f64> = serde_json::from_value(reference["charges"].clone()).unwrap();
    match charged[0].properties.arrays.get("initial_charges") {
        Some(ddmlip_atoms::Column::Float(q, 1)) => {
            for (a, b) in q.iter().zip(&charges) {
                assert!((a - b).abs() < 1e-9);
            }
        }
        other => panic!("{other:?}"),
    }
}
