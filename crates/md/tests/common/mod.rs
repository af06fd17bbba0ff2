//! Shared helpers of the MD tests: systems, a sink that keeps everything,
//! and a runner.
#![allow(dead_code)]

use ddmlip_atoms::{build, elements, Cell};
use ddmlip_md::{
    run_threads, Checkpoint, Frame, MdConfig, MdError, MdSink, MdSummary, StartState, ThermoRow,
    Topology,
};

/// Everything a run handed to its sink.
#[derive(Default)]
pub struct Collect {
    pub thermo: Vec<ThermoRow>,
    pub frames: Vec<Frame>,
    pub last: Option<Frame>,
    pub checkpoints: Vec<Checkpoint>,
}

impl MdSink for Collect {
    fn thermo(&mut self, row: &ThermoRow) -> Result<(), MdError> {
        self.thermo.push(*row);
        Ok(())
    }
    fn frame(&mut self, frame: &Frame, is_final: bool) -> Result<(), MdError> {
        if is_final {
            self.last = Some(frame.clone());
        } else {
            self.frames.push(frame.clone());
        }
        Ok(())
    }
    fn checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<(), MdError> {
        self.checkpoints.push(checkpoint.clone());
        Ok(())
    }
}

/// FCC argon, `n`³ conventional cells of `a` Å, rattled by up to `amp` Å.
pub fn fcc_argon(n: usize, a: f64, amp: f64) -> (Vec<[f64; 3]>, Cell) {
    let mut sys = build::fcc(18, a, n);
    build::rattle_uniform(&mut sys, amp, 0x9e37_79b9_7f4a_7c15);
    let l = n as f64 * a;
    (sys.positions, Cell::orthorhombic(l, l, l))
}

/// Argon topology for `n` atoms, periodic.
pub fn argon_topology(n: usize) -> Topology {
    Topology {
        numbers: vec![18; n],
        masses: vec![elements::mass(18).unwrap(); n],
        pbc: [true; 3],
    }
}

/// Runs on `ranks` thread ranks, keeping everything.
pub fn run(
    model: &dyn ddmlip_engine::Model,
    topology: &Topology,
    start: &StartState,
    config: &MdConfig,
    ranks: usize,
) -> (MdSummary, Collect) {
    let mut sink = Collect::default();
    let summary = run_threads(model, topology, start, config, ranks, &mut sink)
        .unwrap_or_else(|e| panic!("md on {ranks} ranks failed: {e}"));
    (summary, sink)
}

/// Largest minimum-image distance between two position sets (Å) in an
/// orthorhombic cell.
pub fn max_distance(a: &[[f64; 3]], b: &[[f64; 3]], cell: &Cell) -> f64 {
    let l = [cell.matrix[0][0], cell.matrix[1][1], cell.matrix[2][2]];
    a.iter()
        .zip(b)
        .map(|(p, q)| {
            let mut d2 = 0.0;
            for k in 0..3 {
                let mut d = p[k] - q[k];
                d -= l[k] * (d / l[k]).round();
                d2 += d * d;
            }
            d2.sqrt()
        })
        .fold(0.0, f64::max)
}

/// Largest component difference of two arrays.
pub fn max_abs_diff(a: &[[f64; 3]], b: &[[f64; 3]]) -> f64 {
    a.iter()
        .zip(b)
        .flat_map(|(p, q)| (0..3).map(move |k| (p[k] - q[k]).abs()))
        .fold(0.0, f64::max)
}

/// Runs `script` in `python3` with `request` as JSON on stdin and returns
/// the JSON it prints (the ASE references; ASE must be installed).
pub fn run_python_json(script: &str, request: &serde_json::Value) -> serde_json::Value {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 with ASE is required for this test");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the ASE reference failed");
    serde_json::from_slice(&out.stdout).unwrap()
}
