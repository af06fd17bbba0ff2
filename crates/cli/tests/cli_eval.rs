//! `eval`, `neighbors` and `partition` through the real binary, on structure
//! files written by ASE, checked against ASE (neighbour counts, reading
//! `--output` back) and against the binary's own single-process /
//! frame-by-frame runs.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

/// Equivalence tolerance of docs/design.md §7 (f64, relative to the quantity's scale).
const RTOL: f64 = 1e-10;

/// Runs python3 with `script` and `args`; fails clearly when ASE is missing.
fn python(script: &str, args: &[&str]) -> String {
    let prelude = "import sys\ntry:\n    import ase, ase.io, numpy as np\nexcept ImportError as err:\n    sys.stderr.write('ASE (python3 -m pip install ase) is required for this test: %s\\n' % err)\n    sys.exit(3)\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!("{prelude}{script}"))
        .args(args)
        .output()
        .expect("python3 must be on PATH for the ASE reference");
    assert!(
        out.status.success(),
        "python/ASE failed (is ASE installed?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Writes, with ASE: `tric.xyz` (periodic triclinic, Cu/O/H, cell heights
/// below 7 Å), `slab.xyz` (pbc T T F), `cluster.xyz` (no cell) and
/// `batch.xyz` (the three as frames), plus `tric_perm.xyz` (tric with its
/// atoms in a known permuted order, printed on stdout).
const WRITE_STRUCTURES: &str = r#"
import json
from ase import Atoms
from ase.build import bulk, fcc111
out = sys.argv[1]
tric = bulk("Cu", "fcc", a=3.7).repeat((3, 3, 2))
tric.rattle(0.08, seed=3)
symbols = tric.get_chemical_symbols()
for i in range(0, len(tric), 5):
    symbols[i] = "O"
symbols[3] = "H"
tric.set_chemical_symbols(symbols)
slab = fcc111("Cu", size=(3, 3, 3), vacuum=5.0)
slab.rattle(0.08, seed=4)
cluster = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((2, 2, 2))
cluster.rattle(0.08, seed=5)
cluster = Atoms(cluster.get_chemical_symbols(), positions=cluster.positions)
ase.io.write(out + "/tric.xyz", tric, format="extxyz")
ase.io.write(out + "/slab.xyz", slab, format="extxyz")
ase.io.write(out + "/cluster.xyz", cluster, format="extxyz")
ase.io.write(out + "/batch.xyz", [tric, slab, cluster], format="extxyz")
perm = np.random.RandomState(6).permutation(len(tric))
ase.io.write(out + "/tric_perm.xyz", tric[perm], format="extxyz")
print(json.dumps(perm.tolist()))
"#;

struct Files {
    dir: PathBuf,
    /// `tric_perm.xyz` atom k is `tric.xyz` atom `perm[k]`.
    perm: Vec<usize>,
}

impl Files {
    /// Written once per test process (importing ASE costs about a second of
    /// CPU). The folder is per process: nextest runs each test in its own
    /// process, in parallel, and a shared folder would be rewritten under a
    /// reader's feet.
    fn get() -> &'static Files {
        static FILES: OnceLock<Files> = OnceLock::new();
        FILES.get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("cli_eval_structures_{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let perm = python(WRITE_STRUCTURES, &[dir.to_str().unwrap()]);
            Files {
                perm: serde_json::from_str(perm.trim()).unwrap(),
                dir,
            }
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn run_ok(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "`ddmlip {}` failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `eval --json` parsed into plain vectors.
#[derive(Debug)]
struct Eval {
    energy: Vec<f64>,
    forces: Vec<[f64; 3]>,
    stress: Vec<Option<[f64; 6]>>,
    atomic: Vec<f64>,
}

fn eval(model: &str, structure: &Path, extra: &[&str]) -> Eval {
    let mut args = vec![
        "eval",
        "--model",
        model,
        "--structure",
        structure.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let stdout = run_ok(&args);
    // One JSON object and nothing else on stdout.
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("eval --json stdout is not one JSON object ({e}):\n{stdout}"));
    Eval {
        energy: serde_json::from_value(v["energy"].clone()).unwrap(),
        forces: serde_json::from_value(v["forces"].clone()).unwrap(),
        stress: serde_json::from_value(v["stress"].clone()).unwrap(),
        atomic: serde_json::from_value(v["atomic_energies"].clone()).unwrap_or_default(),
    }
}

fn max_abs<'a>(xs: impl IntoIterator<Item = &'a f64>) -> f64 {
    xs.into_iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let scale = max_abs(want).max(f64::MIN_POSITIVE);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= RTOL * scale,
            "{what}[{i}]: {g:e} vs {w:e} (scale {scale:e})"
        );
    }
}

fn assert_same(what: &str, a: &Eval, b: &Eval) {
    assert_close(&format!("{what} energy"), &a.energy, &b.energy);
    let flat = |f: &[[f64; 3]]| f.iter().flatten().copied().collect::<Vec<_>>();
    assert_close(
        &format!("{what} forces"),
        &flat(&a.forces),
        &flat(&b.forces),
    );
    assert_eq!(a.stress.len(), b.stress.len());
    for (s, (x, y)) in a.stress.iter().zip(&b.stress).enumerate() {
        match (x, y) {
            (Some(x), Some(y)) => assert_close(&format!("{what} stress {s}"), x, y),
            (None, None) => {}
            _ => panic!("{what}: stress presence differs in frame {s}"),
        }
    }
    assert_close(&format!("{what} atomic energies"), &a.atomic, &b.atomic);
}

fn model_names() -> Vec<String> {
    // SevenNet-0 stands for the SevenNet family: the other pretrained
    // checkpoints run the same kernels (split runs are tested in the models
    // crate; MF-0 needs --modal, tested in cli_sevennet).
    let names: Vec<String> = run_ok(&["models"])
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| !n.starts_with("sevennet-") || n == "sevennet-0")
        .collect();
    for required in [
        "lj",
        "eam-demo",
        "bp-demo",
        "schnet-demo",
        "qeq-demo",
        "rebuild-demo",
    ] {
        assert!(
            names.iter().any(|n| n == required),
            "`models` lacks {required}"
        );
    }
    names
}

/// Atoms per frame of batch.xyz: 18 (tric), 27 (slab), 32 (cluster).
const FRAME_SIZES: [usize; 3] = [18, 27, 32];

#[test]
fn eval_json_shape_and_input_order() {
    let f = Files::get();
    let r = eval("schnet-demo", &f.path("batch.xyz"), &[]);
    let n_atoms: usize = FRAME_SIZES.iter().sum();
    assert_eq!(r.energy.len(), 3);
    assert_eq!(r.forces.len(), n_atoms);
    assert_eq!(r.atomic.len(), n_atoms);
    // Stress for the two periodic frames, null for the cluster.
    assert!(r.stress[0].is_some() && r.stress[1].is_some());
    assert!(r.stress[2].is_none());
    assert_eq!(r.stress.len(), 3);
    // Per-atom energies add up to each frame's energy (an independent sum).
    let mut offset = 0;
    for (s, n) in FRAME_SIZES.into_iter().enumerate() {
        let sum: f64 = r.atomic[offset..offset + n].iter().sum();
        assert!(
            (sum - r.energy[s]).abs() <= 1e-10 * r.energy[s].abs(),
            "frame {s}: Σ atomic {sum} vs energy {}",
            r.energy[s]
        );
        offset += n;
    }

    // Forces follow the input order: permuting the atoms in the file permutes
    // the forces and per-atom energies the same way.
    let plain = eval("schnet-demo", &f.path("tric.xyz"), &[]);
    let permuted = eval("schnet-demo", &f.path("tric_perm.xyz"), &[]);
    let reordered = Eval {
        energy: plain.energy.clone(),
        forces: f.perm.iter().map(|&i| plain.forces[i]).collect(),
        stress: plain.stress.clone(),
        atomic: f.perm.iter().map(|&i| plain.atomic[i]).collect(),
    };
    assert!(f.perm.iter().enumerate().any(|(k, &i)| k != i));
    assert_same("permuted file", &permuted, &reordered);
}

#[test]
fn batch_equals_frames_one_by_one() {
    let f = Files::get();
    for model in ["lj", "eam-demo", "qeq-demo", "schnet-demo", "rebuild-demo"] {
        let batch = eval(model, &f.path("batch.xyz"), &[]);
        let singles: Vec<Eval> = ["tric.xyz", "slab.xyz", "cluster.xyz"]
            .iter()
            .map(|n| eval(model, &f.path(n), &[]))
            .collect();
        let joined = Eval {
            energy: singles.iter().flat_map(|e| e.energy.clone()).collect(),
            forces: singles.iter().flat_map(|e| e.forces.clone()).collect(),
            stress: singles.iter().flat_map(|e| e.stress.clone()).collect(),
            atomic: singles.iter().flat_map(|e| e.atomic.clone()).collect(),
        };
        assert_same(&format!("{model} batch vs frames"), &batch, &joined);
    }
}

#[test]
fn three_ranks_equal_one_process() {
    let f = Files::get();
    for model in model_names() {
        let single = eval(&model, &f.path("batch.xyz"), &[]);
        let split = eval(&model, &f.path("batch.xyz"), &["--ranks", "3"]);
        assert_same(&format!("{model} --ranks 3"), &split, &single);
        let even = eval(
            &model,
            &f.path("batch.xyz"),
            &["--ranks", "3", "--balance", "atoms"],
        );
        assert_same(
            &format!("{model} --ranks 3 --balance atoms"),
            &even,
            &single,
        );
    }
}

/// Reads every file in argv with ASE and prints, per file and frame, the
/// structure and (when the file has them) energy, forces and stress.
const READ_FRAMES: &str = r#"
import json
out = []
for path in sys.argv[1:]:
    frames = []
    for a in ase.io.read(path, index=":"):
        r = a.calc.results if a.calc is not None else {}
        stress = a.get_stress(voigt=True).tolist() if "stress" in r else None
        frames.append({"energy": r.get("energy"),
                       "forces": a.get_forces().tolist() if "forces" in r else None,
                       "stress": stress, "positions": a.positions.tolist(),
                       "numbers": a.numbers.tolist(), "pbc": a.pbc.tolist()})
    out.append(frames)
print(json.dumps(out))
"#;

#[test]
fn output_file_reads_back_in_ase() {
    let f = Files::get();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.xyz");
    let input = f.path("batch.xyz");
    let r = eval("qeq-demo", &input, &["--output", out.to_str().unwrap()]);
    let files: Vec<Vec<Value>> = serde_json::from_str(&python(
        READ_FRAMES,
        &[out.to_str().unwrap(), input.to_str().unwrap()],
    ))
    .unwrap();
    let (written, input) = (&files[0], &files[1]);
    assert_eq!(written.len(), 3);
    let mut offset = 0;
    for (s, (w, i)) in written.iter().zip(input).enumerate() {
        let n = FRAME_SIZES[s];
        assert_close(
            &format!("frame {s} energy"),
            &[w["energy"].as_f64().expect("energy in the output file")],
            &[r.energy[s]],
        );
        let forces: Vec<[f64; 3]> = serde_json::from_value(w["forces"].clone()).unwrap();
        let want: Vec<f64> = r.forces[offset..offset + n]
            .iter()
            .flatten()
            .copied()
            .collect();
        let got: Vec<f64> = forces.iter().flatten().copied().collect();
        assert_close(&format!("frame {s} forces"), &got, &want);
        let stress: Option<[f64; 6]> = serde_json::from_value(w["stress"].clone()).unwrap();
        match (stress, r.stress[s]) {
            (Some(got), Some(want)) => assert_close(&format!("frame {s} stress"), &got, &want),
            (None, None) => {}
            (got, want) => panic!("frame {s}: stress in file {got:?} vs eval {want:?}"),
        }
        // The structure itself is carried through unchanged.
        assert_eq!(w["numbers"], i["numbers"], "frame {s} species");
        assert_eq!(w["pbc"], i["pbc"], "frame {s} pbc");
        let pos = |v: &Value| -> Vec<f64> {
            serde_json::from_value::<Vec<[f64; 3]>>(v["positions"].clone())
                .unwrap()
                .into_iter()
                .flatten()
                .collect()
        };
        assert_close(&format!("frame {s} positions"), &pos(w), &pos(i));
        offset += n;
    }
}

/// ASE's full neighbour-pair count for argv[1] (comma-separated files) and
/// every cutoff in argv[2:], as {file: [count per cutoff]}.
const ASE_PAIRS: &str = r#"
import json
from ase.neighborlist import neighbor_list
out = {}
for path in sys.argv[1].split(","):
    a = ase.io.read(path)
    out[path] = [len(neighbor_list("i", a, float(rc))) for rc in sys.argv[2:]]
print(json.dumps(out))
"#;

#[test]
fn neighbor_counts_equal_ase() {
    let f = Files::get();
    // 7 Å exceeds the triclinic cell's heights: several images of each atom.
    let cutoffs = ["2.9", "4.1", "7.0"];
    let paths: Vec<String> = ["tric.xyz", "slab.xyz", "cluster.xyz"]
        .iter()
        .map(|n| f.path(n).to_str().unwrap().to_string())
        .collect();
    let joined = paths.join(",");
    let mut ase_args = vec![joined.as_str()];
    ase_args.extend_from_slice(&cutoffs);
    let reference: std::collections::HashMap<String, Vec<u64>> =
        serde_json::from_str(&python(ASE_PAIRS, &ase_args)).unwrap();
    for path in &paths {
        for (rc, &want) in cutoffs.iter().zip(&reference[path]) {
            assert!(want > 0, "{path} rc {rc}: no pairs, test is vacuous");
            let full: Value = serde_json::from_str(&run_ok(&[
                "neighbors",
                "--structure",
                path,
                "--cutoff",
                rc,
                "--json",
            ]))
            .unwrap();
            assert_eq!(full["n_pairs"].as_u64(), Some(want), "{path} rc {rc} full");
            let half: Value = serde_json::from_str(&run_ok(&[
                "neighbors",
                "--structure",
                path,
                "--cutoff",
                rc,
                "--half",
                "--json",
            ]))
            .unwrap();
            assert_eq!(
                half["n_pairs"].as_u64(),
                Some(want / 2),
                "{path} rc {rc} half"
            );
        }
    }
}

#[test]
fn partition_owns_every_atom_once_and_draws_svg() {
    let f = Files::get();
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("split.svg");
    for (file, n_atoms) in [("tric.xyz", 18), ("slab.xyz", 27)] {
        for ranks in [1usize, 2, 3, 4] {
            let v: Value = serde_json::from_str(&run_ok(&[
                "partition",
                "--structure",
                f.path(file).to_str().unwrap(),
                "--ranks",
                &ranks.to_string(),
                "--cutoff",
                "3.0",
                "--json",
                "--svg",
                svg.to_str().unwrap(),
            ]))
            .unwrap();
            let per_rank = v["ranks"].as_array().unwrap();
            assert_eq!(per_rank.len(), ranks, "{file} {ranks} ranks");
            let owned: u64 = per_rank.iter().map(|r| r["owned"].as_u64().unwrap()).sum();
            assert_eq!(owned, n_atoms, "{file} {ranks} ranks: owned counts");
            let text = std::fs::read_to_string(&svg).unwrap();
            assert!(
                text.starts_with("<svg"),
                "{file}: not an SVG: {}",
                &text[..40.min(text.len())]
            );
            assert!(text.trim_end().ends_with("</svg>"));
            std::fs::remove_file(&svg).unwrap();
        }
    }
}

/// The slab (vacuum along z) split 4 ways: even-count cuts own every atom
/// once and spread them no less evenly than the regular grid.
#[test]
fn partition_balance_atoms_evens_out_the_slab() {
    let f = Files::get();
    let counts = |balance: &str| -> Vec<u64> {
        let v: Value = serde_json::from_str(&run_ok(&[
            "partition",
            "--structure",
            f.path("slab.xyz").to_str().unwrap(),
            "--ranks",
            "4",
            "--cutoff",
            "3.0",
            "--balance",
            balance,
            "--json",
        ]))
        .unwrap();
        v["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["owned"].as_u64().unwrap())
            .collect()
    };
    let spread = |c: &[u64]| c.iter().max().unwrap() - c.iter().min().unwrap();
    let (regular, even) = (counts("geometric"), counts("atoms"));
    assert_eq!(even.iter().sum::<u64>(), 27, "{even:?}");
    assert!(spread(&even) <= 1, "27 atoms over 4 ranks: {even:?}");
    assert!(spread(&even) <= spread(&regular), "{even:?} vs {regular:?}");
}
