//! Interoperability with ASE, the reference implementation of extended XYZ:
//! files written by `ase.io.write` must read to exactly the values
//! `ase.io.read` gives, and files written here must read in ASE to exactly
//! our values. Python prints what ASE read as JSON (floats in Python's
//! shortest round-trip repr), and every float is compared bit for bit.
//!
//! Requires Python 3 with ASE (`pip install ase`); fails, never skips, without it.

use ddmlip_atoms::extxyz::{read_file, write_file};
use ddmlip_atoms::{elements, Column, InfoValue, System};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Python helper that prints the frames ASE reads from `sys.argv[1]` as JSON.
const DUMP_PY: &str = r#"
import json, sys
import numpy as np
import ase.io
from ase.io.extxyz import per_atom_properties

def enc(v):
    if isinstance(v, (bool, np.bool_)):
        return {"t": "bool", "v": bool(v)}
    if isinstance(v, (int, np.integer)):
        return {"t": "int", "v": int(v)}
    if isinstance(v, (float, np.floating)):
        return {"t": "float", "v": float(v)}
    if isinstance(v, str):
        return {"t": "str", "v": v}
    if isinstance(v, list) and v and all(isinstance(x, bool) for x in v):
        # ASE keeps "T F T" as a Python list of bools.
        return {"t": "array", "kind": "b", "shape": [len(v)], "v": v}
    if isinstance(v, np.ndarray):
        return {"t": "array", "kind": v.dtype.kind, "shape": list(v.shape), "v": v.tolist()}
    return {"t": "other", "v": v}

def dump(images):
    out = []
    for a in images:
        d = {"numbers": a.numbers.tolist(), "positions": a.positions.tolist(),
             "cell": a.cell.array.tolist(), "pbc": a.pbc.tolist(),
             "info": {k: enc(v) for k, v in a.info.items()},
             "arrays": {k: enc(v) for k, v in a.arrays.items() if k not in ("numbers", "positions")},
             "per_atom": {}, "per_config": {}}
        if a.calc is not None:
            for k, v in a.calc.results.items():
                group = "per_atom" if k in per_atom_properties else "per_config"
                d[group][k] = enc(np.asarray(v) if not np.isscalar(v) else v)
        out.append(d)
    return out

print(json.dumps(dump(ase.io.read(sys.argv[1], index=":", format="extxyz"))))
"#;

/// Python that writes test structures with ASE to `sys.argv[1]`.
const WRITE_PY: &str = r#"
import sys
import numpy as np
import ase.io
from ase import Atoms
from ase.build import fcc111, molecule
from ase.calculators.singlepoint import SinglePointCalculator

rng = np.random.default_rng(20240611)

# Triclinic, fully periodic, with results and extra columns / info values.
cell = np.array([[5.21, 0.13, -0.27], [0.91, 5.63, 0.08], [-0.64, 0.72, 6.11]])
n = 7
bulk = Atoms(["Si", "O", "O", "Cu", "H", "Fe", "Og"], scaled_positions=rng.random((n, 3)),
             cell=cell, pbc=True)
bulk.info["int_info"] = 7
bulk.info["float_info"] = 0.1 + 0.2
bulk.info["str_info"] = "hello world"
bulk.info["quote_info"] = 'say "hi" {x}'
bulk.info["bool_info"] = True
bulk.info["vec_info"] = np.array([1.5, -2.25, 3e-7, 1e300])
bulk.info["ivec_info"] = np.array([1, -2, 3])
bulk.info["mat_info"] = np.arange(6.0).reshape(2, 3)
bulk.set_array("tag_col", rng.integers(-5, 100, size=n))
bulk.set_array("label", np.array(["a%d" % i for i in range(n)]))
bulk.set_array("flag", rng.random(n) > 0.5)
bulk.set_array("vec2", rng.normal(size=(n, 2)))
bulk.calc = SinglePointCalculator(bulk, energy=-123.456789012345, free_energy=-123.5,
                                  forces=rng.normal(size=(n, 3)), stress=rng.normal(size=6))

# Slab with vacuum: periodic in-plane only.
slab = fcc111("Al", size=(2, 2, 3), vacuum=7.5)
slab.rattle(stdev=0.05, seed=3)
slab.calc = SinglePointCalculator(slab, energy=-42.0, forces=rng.normal(size=(len(slab), 3)))

# Molecule without a cell.
mol = molecule("CH3CH2OH")
mol.info["name"] = "ethanol"

ase.io.write(sys.argv[1], [bulk, slab, mol], format="extxyz")
"#;

fn require_ase() {
    let ok = Command::new("python3")
        .args(["-c", "import ase, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "this test needs Python 3 with ASE and numpy: run `pip install ase`"
    );
}

fn python(script: &str, arg: &Path) -> String {
    require_ase();
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(arg)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn ase_read(path: &Path) -> Vec<Value> {
    let json = python(DUMP_PY, path);
    match serde_json::from_str(&json).expect("json from python") {
        Value::Array(frames) => frames,
        other => panic!("expected a list of frames, got {other}"),
    }
}

/// A path named `name` in a fresh temporary directory, removed when the
/// returned guard drops.
fn temp_path(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn flat_f64(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(flat_f64).collect(),
        other => vec![f(other)],
    }
}

fn flat(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items.iter().flat_map(flat).collect(),
        other => vec![other.clone()],
    }
}

fn assert_bits(ours: &[f64], theirs: &[f64], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths differ");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{what}[{i}]: ours {a:?} vs ASE {b:?}"
        );
    }
}

/// Asserts that one of our info values equals ASE's encoded value exactly.
fn assert_info_eq(ours: &InfoValue, theirs: &Value, what: &str) {
    let t = theirs["t"].as_str().unwrap();
    let v = &theirs["v"];
    match ours {
        InfoValue::Int(i) => assert_eq!((t, v.as_i64()), ("int", Some(*i)), "{what}"),
        InfoValue::Float(x) => {
            assert_eq!(t, "float", "{what}");
            assert_bits(&[*x], &[f(v)], what);
        }
        InfoValue::Bool(b) => assert_eq!((t, v.as_bool()), ("bool", Some(*b)), "{what}"),
        InfoValue::Str(s) => match s.strip_prefix("_JSON ").map(serde_json::from_str::<Value>) {
            // A JSON payload we keep verbatim must be what ASE decoded.
            Some(Ok(decoded)) => assert_eq!(&decoded, v, "{what}"),
            _ => assert_eq!((t, v.as_str()), ("str", Some(s.as_str())), "{what}"),
        },
        InfoValue::IntArray(a) => {
            assert_eq!((t, theirs["kind"].as_str()), ("array", Some("i")), "{what}");
            let theirs: Vec<i64> = flat(v).iter().map(|x| x.as_i64().unwrap()).collect();
            assert_eq!(a, &theirs, "{what}");
        }
        InfoValue::FloatArray(a) => {
            assert_eq!((t, theirs["kind"].as_str()), ("array", Some("f")), "{what}");
            assert_bits(a, &flat_f64(v), what);
        }
        InfoValue::BoolArray(a) => {
            assert_eq!((t, theirs["kind"].as_str()), ("array", Some("b")), "{what}");
            let theirs: Vec<bool> = flat(v).iter().map(|x| x.as_bool().unwrap()).collect();
            assert_eq!(a, &theirs, "{what}");
        }
    }
}

fn assert_column_eq(ours: &Column, theirs: &Value, n_atoms: usize, what: &str) {
    let kind = theirs["kind"].as_str().unwrap();
    let shape: Vec<u64> = theirs["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let values = flat(&theirs["v"]);
    let width = match ours {
        Column::Float(v, w) => {
            assert_eq!(kind, "f", "{what}");
            assert_bits(v, &values.iter().map(f).collect::<Vec<_>>(), what);
            *w
        }
        Column::Int(v, w) => {
            assert_eq!(kind, "i", "{what}");
            assert_eq!(
                v,
                &values
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect::<Vec<_>>(),
                "{what}"
            );
            *w
        }
        Column::Bool(v, w) => {
            assert_eq!(kind, "b", "{what}");
            assert_eq!(
                v,
                &values
                    .iter()
                    .map(|x| x.as_bool().unwrap())
                    .collect::<Vec<_>>(),
                "{what}"
            );
            *w
        }
        Column::Str(v, w) => {
            assert!(kind == "U" || kind == "O", "{what}: dtype kind {kind}");
            assert_eq!(
                v,
                &values
                    .iter()
                    .map(|x| x.as_str().unwrap().to_string())
                    .collect::<Vec<_>>(),
                "{what}"
            );
            *w
        }
    };
    let expected_shape = if width == 1 {
        vec![n_atoms as u64]
    } else {
        vec![n_atoms as u64, width as u64]
    };
    assert_eq!(shape, expected_shape, "{what}: shape");
}

/// Asserts that our system and ASE's reading of the same file agree exactly.
fn assert_same_as_ase(ours: &System, theirs: &Value, frame: usize) {
    let ctx = |what: &str| format!("frame {frame}: {what}");
    let numbers: Vec<u32> = theirs["numbers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ours.numbers, numbers, "{}", ctx("numbers"));
    let positions: Vec<f64> = ours.positions.iter().flatten().copied().collect();
    assert_bits(
        &positions,
        &flat_f64(&theirs["positions"]),
        &ctx("positions"),
    );
    let cell = flat_f64(&theirs["cell"]);
    match &ours.cell {
        Some(c) => assert_bits(
            &c.matrix.iter().flatten().copied().collect::<Vec<_>>(),
            &cell,
            &ctx("cell"),
        ),
        None => assert!(
            cell.iter().all(|&x| x == 0.0),
            "{}",
            ctx("ASE has a cell, we have none")
        ),
    }
    let pbc: Vec<bool> = theirs["pbc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_bool().unwrap())
        .collect();
    assert_eq!(ours.pbc.to_vec(), pbc, "{}", ctx("pbc"));

    // ASE moves calculator results out of info/arrays; we keep them there.
    let their_info = theirs["info"].as_object().unwrap();
    let per_config = theirs["per_config"].as_object().unwrap();
    let their_arrays = theirs["arrays"].as_object().unwrap();
    let per_atom = theirs["per_atom"].as_object().unwrap();
    assert_eq!(
        ours.properties.info.len(),
        their_info.len() + per_config.len(),
        "{}",
        ctx(&format!(
            "info keys: ours {:?}, ASE info {their_info:?} results {per_config:?}",
            ours.properties.info.keys()
        ))
    );
    for (key, value) in &ours.properties.info {
        if key == "stress" {
            let voigt = ours.stress_voigt().expect("stress");
            assert_bits(
                &voigt,
                &flat_f64(&per_config["stress"]["v"]),
                &ctx("stress (Voigt)"),
            );
            continue;
        }
        let theirs = their_info
            .get(key)
            .or_else(|| per_config.get(key))
            .unwrap_or_else(|| panic!("{}", ctx(&format!("ASE lacks info `{key}`"))));
        assert_info_eq(value, theirs, &ctx(&format!("info `{key}`")));
    }
    assert_eq!(
        ours.properties.arrays.len(),
        their_arrays.len() + per_atom.len(),
        "{}",
        ctx("array names")
    );
    for (name, column) in &ours.properties.arrays {
        let theirs = their_arrays
            .get(name)
            .or_else(|| per_atom.get(name))
            .unwrap_or_else(|| panic!("{}", ctx(&format!("ASE lacks array `{name}`"))));
        assert_column_eq(column, theirs, ours.len(), &ctx(&format!("array `{name}`")));
    }
}

#[test]
fn element_table_matches_ase() {
    require_ase();
    let out = Command::new("python3")
        .args([
            "-c",
            "import json; from ase.data import chemical_symbols as s, atomic_masses as m; \
             print(json.dumps([[x, float(y)] for x, y in zip(s, m)]))",
        ])
        .output()
        .unwrap();
    let table: Vec<(String, f64)> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(table.len() as u32, elements::MAX_ATOMIC_NUMBER + 1);
    for (z, (symbol, mass)) in table.iter().enumerate() {
        let z = z as u32;
        assert_eq!(elements::symbol(z), Some(symbol.as_str()), "Z={z}");
        assert_eq!(elements::atomic_number(symbol), Some(z), "{symbol}");
        assert_eq!(
            elements::mass(z).map(f64::to_bits),
            Some(mass.to_bits()),
            "mass of {symbol}"
        );
    }
}

#[test]
fn reads_what_ase_writes() {
    let (_dir, path) = temp_path("ase_written.xyz");
    python(WRITE_PY, &path);
    let ours = read_file(&path).unwrap();
    let theirs = ase_read(&path);
    assert_eq!(ours.len(), 3);
    assert_eq!(ours.len(), theirs.len());
    for (frame, (system, reference)) in ours.iter().zip(&theirs).enumerate() {
        assert_same_as_ase(system, reference, frame);
    }
    // The three structures ASE wrote: triclinic bulk, slab, molecule.
    assert_eq!(ours[0].pbc, [true; 3]);
    assert_eq!(ours[1].pbc, [true, true, false]);
    assert_eq!((ours[2].cell, ours[2].pbc), (None, [false; 3]));
    assert!(
        ours[0].energy().is_some()
            && ours[0].forces().is_some()
            && ours[0].stress_voigt().is_some()
    );
    assert!(
        ours[1].energy().is_some()
            && ours[1].forces().is_some()
            && ours[1].stress_voigt().is_none()
    );
    std::fs::remove_file(&path).ok();
}

/// Deterministic full-precision pseudo-random numbers (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[test]
fn ase_reads_what_we_write() {
    // Start from ASE's own structures (results, columns, _JSON values) and
    // make every float full precision, then add awkward info values.
    let (_dir, source) = temp_path("ase_source.xyz");
    python(WRITE_PY, &source);
    let mut frames = read_file(&source).unwrap();
    let mut rng = Rng(7);
    for system in &mut frames {
        for p in system.positions.iter_mut().flatten() {
            *p += rng.uniform() * 1e-3 - 5e-4;
        }
        if let Some(cell) = &mut system.cell {
            cell.matrix[0][0] += rng.uniform() * 1e-6;
        }
        for column in system.properties.arrays.values_mut() {
            if let Column::Float(values, _) = column {
                values
                    .iter_mut()
                    .for_each(|x| *x = (rng.uniform() - 0.5) * 1e3);
            }
        }
        if system.energy().is_some() {
            system.set_energy(-rng.uniform() * 1e4);
        }
    }
    let s = &mut frames[0];
    s.set_stress_voigt([
        rng.uniform(),
        rng.uniform(),
        rng.uniform(),
        -rng.uniform(),
        1e-310,
        -0.0,
    ]);
    let info = &mut s.properties.info;
    let extra = [
        ("tiny", InfoValue::Float(5e-324)),
        ("huge", InfoValue::Float(1.7976931348623157e308)),
        ("neg_zero", InfoValue::Float(-0.0)),
        ("integral_float", InfoValue::Float(3.0)),
        ("exp_float", InfoValue::Float(1e22)),
        ("big_int", InfoValue::Int(i64::MIN)),
        ("one_float", InfoValue::FloatArray(vec![0.1])),
        ("one_int", InfoValue::IntArray(vec![-4])),
        ("one_bool", InfoValue::BoolArray(vec![false])),
        ("empty_ints", InfoValue::IntArray(vec![])),
        ("bools", InfoValue::BoolArray(vec![true, false, true])),
        ("num_like", InfoValue::Str("12".into())),
        ("float_like", InfoValue::Str("1.5 2".into())),
        ("bool_like", InfoValue::Str("T".into())),
        ("empty_str", InfoValue::Str(String::new())),
        (
            "tricky",
            InfoValue::Str(r#"a "b" \c {d} [e] f='g' h=i, j"#.into()),
        ),
        ("multi line", InfoValue::Str("first\nsecond\ttab é".into())),
        ("json_like", InfoValue::Str("_JSON not json".into())),
    ];
    for (key, value) in extra {
        info.insert(key.to_string(), value);
    }
    s.properties.arrays.insert(
        "neg_ints".into(),
        Column::Int((0..7).map(|i| -i * 300_000_007).collect(), 1),
    );
    s.properties.arrays.insert(
        "mask3".into(),
        Column::Bool((0..21).map(|i| i % 3 == 0).collect(), 3),
    );

    let (_dir, path) = temp_path("ours.xyz");
    write_file(&path, &frames).unwrap();
    let theirs = ase_read(&path);
    assert_eq!(theirs.len(), frames.len());
    for (frame, (system, reference)) in frames.iter().zip(&theirs).enumerate() {
        assert_same_as_ase(system, reference, frame);
    }
    // And our reader gives back exactly what we wrote, except that the
    // stress is stored as the 9 numbers ASE expects.
    let back = read_file(&path).unwrap();
    for (a, b) in frames.iter().zip(&back) {
        assert_eq!(
            a.stress_voigt().map(|v| v.map(f64::to_bits)),
            b.stress_voigt().map(|v| v.map(f64::to_bits))
        );
        let mut a = a.clone();
        let mut b = b.clone();
        a.properties.info.remove("stress");
        b.properties.info.remove("stress");
        assert_eq!(a, b);
    }
    std::fs::remove_file(&path).ok();
    std::fs::remove_file(&source).ok();
}

/// ASE saves a structure after a Lennard-Jones calculation with every result it has
/// (energy, free_energy, per-atom energies, stresses); replacing the results
/// must leave none of them behind for ASE to read as current.
const STALE_PY: &str = r#"
import sys
import ase.io
from ase.build import bulk
from ase.calculators.lj import LennardJones
a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
a.rattle(0.05, seed=3)
a.calc = LennardJones(sigma=2.3, epsilon=0.1, rc=5.0)
a.get_potential_energy()
assert {"energies", "stresses", "free_energy"} <= set(a.calc.results)
a.calc.results["free_energy"] = a.calc.results["energy"] - 0.25
ase.io.write(sys.argv[1], a, format="extxyz")
"#;

const CHECK_PY: &str = r#"
import json, sys
import ase.io
a = ase.io.read(sys.argv[1], format="extxyz")
r = a.calc.results
print(json.dumps({
    "energy": a.get_potential_energy(),
    "free_energy": a.get_potential_energy(force_consistent=True),
    "energies": a.get_potential_energies().tolist(),
    "forces": a.get_forces().tolist(),
    "stress": a.get_stress().tolist(),
    "keys": sorted(r.keys()),
}))
"#;

#[test]
fn replaced_results_leave_nothing_stale_for_ase() {
    let (_dir, path) = temp_path("stale_results.xyz");
    python(STALE_PY, &path);
    let mut frames = read_file(&path).unwrap();
    let sys = &mut frames[0];
    let n = sys.len();
    // The file really carries stale results of every kind ASE writes.
    for key in ["energy", "free_energy", "stress"] {
        assert!(sys.properties.info.contains_key(key), "{key}");
    }
    for key in ["energies", "stresses", "forces"] {
        assert!(sys.properties.arrays.contains_key(key), "{key}");
    }
    let forces: Vec<[f64; 3]> = (0..n).map(|i| [i as f64, -0.5, 0.25]).collect();
    let energies: Vec<f64> = (0..n).map(|i| -1.0 - 0.125 * i as f64).collect();
    let energy: f64 = energies.iter().sum();
    let stress = [0.1, 0.2, 0.3, 0.04, 0.05, 0.06];
    sys.set_results(&ddmlip_atoms::Results {
        energy,
        forces: &forces,
        stress: Some(stress),
        energies: Some(&energies),
    });
    write_file(&path, &frames).unwrap();
    let back: Value = serde_json::from_str(&python(CHECK_PY, &path)).unwrap();
    assert_eq!(back["energy"].as_f64(), Some(energy));
    assert_eq!(back["free_energy"].as_f64(), Some(energy));
    let e: Vec<f64> = serde_json::from_value(back["energies"].clone()).unwrap();
    assert_eq!(e, energies);
    let f: Vec<[f64; 3]> = serde_json::from_value(back["forces"].clone()).unwrap();
    assert_eq!(f, forces);
    let s: Vec<f64> = serde_json::from_value(back["stress"].clone()).unwrap();
    assert_eq!(s, stress);
    let keys: Vec<String> = serde_json::from_value(back["keys"].clone()).unwrap();
    assert_eq!(
        keys,
        ["energies", "energy", "forces", "free_energy", "stress"]
    );
    // Without stress or per-atom energies, the old ones are dropped, not kept.
    frames[0].set_results(&ddmlip_atoms::Results {
        energy,
        forces: &forces,
        stress: None,
        energies: None,
    });
    for key in ["stress", "free_energy"] {
        let present = frames[0].properties.info.contains_key(key);
        assert_eq!(present, key == "free_energy", "{key}");
    }
    assert!(!frames[0].properties.arrays.contains_key("energies"));
    assert!(!frames[0].properties.arrays.contains_key("stresses"));
}
