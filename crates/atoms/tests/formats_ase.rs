//! POSCAR, LAMMPS data and gzip-compressed files against ASE, both ways:
//! ASE writes (`ase.io.write`, formats `vasp` Cartesian and Direct,
//! `lammps-data` and `.xyz.gz`), ddmlip reads; ddmlip writes, ASE reads. Positions, cells and elements
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

/// Lengths |a|, |b|, |c| and angles cos(b,c), cos(a,c), cos(a,b) of a cell.
fn lengths_and_cosines(m: &[[f64; 3]; 3]) -> [f64; 6] {
    let dot = |u: [f64; 3], v: [f64; 3]| u[0] * v[0] + u[1] * v[1] + u[2] * v[2];
    let len = |k: usize| dot(m[k], m[k]).sqrt();
    let cos = |i: usize, j: usize| dot(m[i], m[j]) / (len(i) * len(j));
    [len(0), len(1), len(2), cos(1, 2), cos(0, 2), cos(0, 1)]
}

fn distances(positions: &[[f64; 3]]) -> Vec<f64> {
    let mut out = Vec::new();
    for (i, a) in positions.iter().enumerate() {
        for b in &positions[i + 1..] {
            out.push(
                ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2) + (a[2] - b[2]).powi(2)).sqrt(),
            );
        }
    }
    out
}

/// Same cell up to a rotation, same species, same interatomic distances.
fn assert_same_up_to_rotation(
    system: &System,
    numbers: &[u32],
    positions: &[[f64; 3]],
    cell: &[[f64; 3]; 3],
    tol: f64,
) {
    assert_eq!(system.numbers, numbers);
    let got = lengths_and_cosines(&system.cell.unwrap().matrix);
    let want = lengths_and_cosines(cell);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < tol, "cell {got:?} vs {want:?}");
    }
    for (a, b) in distances(&system.positions)
        .iter()
        .zip(&distances(positions))
    {
        assert!((a - b).abs() < tol, "distance {a} vs {b}");
    }
}

#[test]
fn ddmlip_written_lammps_data_is_read_by_ase_and_ddmlip() {
    let dir = tempfile::tempdir().unwrap();
    // A cell that is not lower-triangular, so writing must rotate it.
    let cell = [[5.6, 0.3, -0.2], [0.8, 5.4, 0.4], [-0.6, 0.9, 5.9]];
    let numbers = vec![11, 17, 11, 17, 14, 8];
    let positions = vec![
        [0.1, 0.2, 0.3],
        [2.8, 0.1, 0.2],
        [0.3, 2.9, 0.1],
        [2.7, 2.8, 0.4],
        [1.5, 1.4, 4.9],
        [6.2, -0.7, 2.2],
    ];
    let charges = vec![0.5, -0.5, 0.25, -0.25, 1.5, -1.5];
    let plain = System::new(
        positions.clone(),
        numbers.clone(),
        Some(ddmlip_atoms::Cell::new(cell)),
        [true; 3],
    );
    let mut charged = plain.clone();
    charged.properties.arrays.insert(
        "initial_charges".into(),
        ddmlip_atoms::Column::Float(charges.clone(), 1),
    );
    write_structure(dir.path().join("atomic.data"), std::slice::from_ref(&plain)).unwrap();
    write_structure(
        dir.path().join("charge.lmp"),
        std::slice::from_ref(&charged),
    )
    .unwrap();
    write_structure(
        dir.path().join("data.gz.lmp.gz"),
        std::slice::from_ref(&charged),
    )
    .unwrap();
    let text = std::fs::read_to_string(dir.path().join("charge.lmp")).unwrap();
    assert!(
        text.contains("Atoms # charge") && text.contains("xy xz yz"),
        "{text}"
    );

    // ddmlip reads its own files back: same structure up to the rotation,
    // the cell in LAMMPS's lower-triangular form, charges kept.
    for name in ["atomic.data", "charge.lmp", "data.gz.lmp.gz"] {
        let back = read_structure(dir.path().join(name)).unwrap();
        assert_eq!(back.len(), 1);
        assert_same_up_to_rotation(&back[0], &numbers, &positions, &cell, 1e-12);
        let m = back[0].cell.unwrap().matrix;
        assert_eq!([m[0][1], m[0][2], m[1][2]], [0.0; 3]);
        let q = back[0].properties.arrays.get("initial_charges");
        if name == "atomic.data" {
            assert!(q.is_none());
        } else {
            assert_eq!(q, Some(&ddmlip_atoms::Column::Float(charges.clone(), 1)));
        }
    }

    // ASE reads them: cell lengths / angles, species, distances, charges,
    // and the fractional coordinates of the original structure.
    let back = python(
        r#"
import sys, json
from ase.io import read
d = sys.argv[1]
out = []
for name, style in [('atomic.data', 'atomic'), ('charge.lmp', 'charge'), ('data.gz.lmp.gz', 'charge')]:
    a = read(d + '/' + name, format='lammps-data', atom_style=style)
    out.append(dict(numbers=a.numbers.tolist(), positions=a.positions.tolist(), cell=a.cell.tolist(),
                    scaled=a.get_scaled_positions(wrap=False).tolist(), charges=a.get_initial_charges().tolist()))
print(json.dumps(out))
"#,
        dir.path(),
    );
    let back: Vec<serde_json::Value> = serde_json::from_str(&back).unwrap();
    assert_eq!(back.len(), 3);
    let inverse = ddmlip_atoms::Cell::new(cell).inverse().unwrap();
    let fractional: Vec<[f64; 3]> = positions
        .iter()
        .map(|&p| ddmlip_atoms::to_fractional(&inverse, p))
        .collect();
    for (b, with_charges) in back.iter().zip([false, true, true]) {
        let ase_numbers: Vec<u32> = serde_json::from_value(b["numbers"].clone()).unwrap();
        let ase_positions: Vec<[f64; 3]> = serde_json::from_value(b["positions"].clone()).unwrap();
        let ase_cell: [[f64; 3]; 3] = serde_json::from_value(b["cell"].clone()).unwrap();
        let ase_system = System::new(
            ase_positions,
            ase_numbers,
            Some(ddmlip_atoms::Cell::new(ase_cell)),
            [true; 3],
        );
        assert_same_up_to_rotation(&ase_system, &numbers, &positions, &cell, 1e-9);
        let scaled: Vec<[f64; 3]> = serde_json::from_value(b["scaled"].clone()).unwrap();
        for (s, f) in scaled.iter().zip(&fractional) {
            for k in 0..3 {
                assert!((s[k] - f[k]).abs() < 1e-9, "{s:?} vs {f:?}");
            }
        }
        let q: Vec<f64> = serde_json::from_value(b["charges"].clone()).unwrap();
        let want = if with_charges {
            charges.clone()
        } else {
            vec![0.0; 6]
        };
        assert_eq!(q, want);
    }

    // A data file holds one frame; a system without a cell has no box.
    let two = write_structure(dir.path().join("two.data"), &[plain.clone(), plain.clone()]);
    assert!(
        matches!(
            two,
            Err(ddmlip_atoms::StructureError::OneFrameOnly { frames: 2, .. })
        ),
        "{two:?}"
    );
    let mut no_cell = plain;
    no_cell.cell = None;
    let err = write_structure(dir.path().join("nocell.data"), &[no_cell]).unwrap_err();
    assert!(err.to_string().contains("no cell"), "{err}");
}
