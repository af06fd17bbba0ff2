//! `eval` over a structure file, frame after frame: one `Evaluator` keeps
//! every rank's memory from one frame to the next, the file is read as a
//! stream, each frame's results are checked (finite) and written (`--output`)
//! before the next is read, and a progress bar on a terminal's stderr shows
//! long runs. Also the checks `eval` makes before computing (output path)
//! and the warning for a spec never validated for the model.

use crate::error::CliError;
use anyhow::anyhow;
use ddmlip_atoms::extxyz::FrameReader;
use ddmlip_atoms::formats::format_from_name;
use ddmlip_atoms::{stream_structure, Format, StructureError, StructureWriter, System};
use ddmlip_domain::PartitionHealth;
use ddmlip_engine::Model;
use ddmlip_runtime::{EvalError, EvalOptions, EvalResult, Evaluator};
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

/// The path that means stdin (`--structure -`) or stdout (`--output -`).
pub const STDIO: &str = "-";

/// True when `path` is `-`.
pub fn is_stdio(path: &Path) -> bool {
    path.as_os_str() == STDIO
}

/// Fails before any computation when `path` cannot be written (missing
/// folder, no permission, a directory): bad input, exit status 2. A file
/// that did not exist is not left behind.
pub fn check_writable(path: &Path) -> Result<(), CliError> {
    if is_stdio(path) {
        return Ok(());
    }
    if path.is_dir() {
        return Err(CliError::input(anyhow!(
            "cannot write --output {}: it is a directory",
            path.display()
        )));
    }
    let existed = path.exists();
    match std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) => Err(CliError::input(anyhow!(
            "cannot write --output {}: {e}",
            path.display()
        ))),
    }
}

/// Fails (bad input, exit status 2) when `output` is a one-frame format
/// (POSCAR, LAMMPS data) and `structure` has `frames` > 1 frames.
pub fn check_output_holds(output: &Path, structure: &Path, frames: usize) -> Result<(), CliError> {
    if is_stdio(output) || frames <= 1 {
        return Ok(());
    }
    let format = format_from_name(output).unwrap_or(Format::ExtendedXyz);
    if format.holds_many_frames() {
        return Ok(());
    }
    Err(CliError::input(anyhow!(
        "--output {}: a {format} file holds one frame but {} has several; write them as \
         extended XYZ (--output NAME.xyz)",
        output.display(),
        structure.display()
    )))
}

/// Warns on stderr when the spec given to a split run is no evidence for
/// this model (never validated, validated for another model, failed, or
/// passed only on a degenerate split), with the command that validates it.
pub fn warn_unvalidated_spec(
    spec: &ddmlip_spec::MLIPSpec,
    spec_path: &Path,
    model: &dyn Model,
    model_arg: &str,
    structure: &Path,
    ranks: usize,
) {
    if let Some(why) = ddmlip_validate::spec_provenance_warning(spec, model) {
        let spec_path = spec_path.display();
        eprintln!(
            "warning: spec {spec_path} {why}.\n  Validate it for this model (it records the \
             result in the file): ddmlip validate --model {model_arg} --structure {} --ranks \
             {ranks} --spec {spec_path} --spec-out {spec_path}",
            structure.display()
        );
    }
}

/// One frame's results, in input atom order.
#[derive(Debug, Clone)]
pub struct FrameResult {
    /// Atoms in the frame.
    pub atoms: usize,
    /// Total energy (eV).
    pub energy: f64,
    /// Forces (eV/Å).
    pub forces: Vec<[f64; 3]>,
    /// Stress (eV/Å³, Voigt xx yy zz yz xz xy); `None` for a frame that is
    /// not periodic along all three axes.
    pub stress: Option<[f64; 6]>,
    /// Per-atom energies (eV), when the model has them.
    pub atomic_energies: Option<Vec<f64>>,
    /// Further model outputs (name, row width, values).
    pub extra: Vec<(String, usize, Vec<f64>)>,
    /// Health of the frame's split (split runs only).
    pub health: Option<PartitionHealth>,
    /// Bytes the ranks sent for this frame.
    pub bytes_sent: u64,
}

/// Why a frame has no stress.
pub const NO_STRESS_REASON: &str =
    "the frame is not periodic along all three axes (no cell volume)";

/// Every frame of a run.
pub struct BatchRun {
    pub frames: Vec<FrameResult>,
    pub seconds: f64,
}

impl BatchRun {
    /// Atoms over all frames.
    pub fn atoms(&self) -> usize {
        self.frames.iter().map(|f| f.atoms).sum()
    }

    /// Per-frame split health, in frame order (empty for one process).
    pub fn health(&self) -> Vec<PartitionHealth> {
        self.frames
            .iter()
            .filter_map(|f| f.health.clone())
            .collect()
    }
}

/// The first non-finite value of a result, as an error naming the model:
/// NaN or inf is never a result (exit status 1, the model failed).
fn check_finite(model: &str, frame: usize, r: &FrameResult) -> Result<(), CliError> {
    let bad = |what: String, v: f64| {
        CliError::failed(anyhow!(
            "model `{model}` gave a non-finite {what} ({v}) for frame {frame}: not a result. \
             The structure may hold atoms far closer than the model was made for, or the \
             model's parameters overflow"
        ))
    };
    if !r.energy.is_finite() {
        return Err(bad("energy".into(), r.energy));
    }
    for (i, f) in r.forces.iter().enumerate() {
        if let Some(&v) = f.iter().find(|v| !v.is_finite()) {
            return Err(bad(format!("force on atom {i}"), v));
        }
    }
    if let Some(&v) = r.stress.iter().flatten().find(|v| !v.is_finite()) {
        return Err(bad("stress".into(), v));
    }
    if let Some((i, &v)) = r
        .atomic_energies
        .iter()
        .flatten()
        .enumerate()
        .find(|(_, v)| !v.is_finite())
    {
        return Err(bad(format!("energy of atom {i}"), v));
    }
    Ok(())
}

fn frame_result(sys: &System, r: &EvalResult) -> FrameResult {
    let health = r
        .diagnostics
        .partitions
        .first()
        .map(|p| ddmlip_domain::partition_health(p, sys));
    let extra = r
        .outputs
        .iter()
        .filter(|(name, _)| {
            !["energy", "forces", "stress", "atomic_energies"].contains(&name.as_str())
                && !name.starts_with('_')
        })
        .map(|(name, o)| (name.clone(), o.width, o.values.clone()))
        .collect();
    FrameResult {
        atoms: sys.len(),
        energy: r
            .energy()
            .and_then(|e| e.first().copied())
            .unwrap_or(f64::NAN),
        forces: r.forces().unwrap_or_default(),
        stress: r.stress().and_then(|s| s.first().copied().flatten()),
        atomic_energies: r.atomic_energies().map(<[f64]>::to_vec),
        extra,
        health,
        bytes_sent: r.diagnostics.bytes_sent,
    }
}

/// A spinner on stderr, drawn only on a terminal and only once a run has
/// taken longer than `after`.
struct Progress {
    bar: indicatif::ProgressBar,
    terminal: bool,
    shown: bool,
    after: Duration,
}

impl Progress {
    fn new(enabled: bool) -> Self {
        let bar = indicatif::ProgressBar::hidden();
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {elapsed_precise} frame {pos}: {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        Self {
            bar,
            terminal: enabled && std::io::stderr().is_terminal(),
            shown: false,
            after: Duration::from_secs(2),
        }
    }

    fn tick(&mut self, started: Instant, frames: u64, message: String) {
        if self.terminal && !self.shown && started.elapsed() >= self.after {
            self.bar
                .set_draw_target(indicatif::ProgressDrawTarget::stderr());
            self.bar.enable_steady_tick(Duration::from_millis(200));
            self.shown = true;
        }
        self.bar.set_position(frames);
        self.bar.set_message(message);
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// An evaluation error of frame `frame` of `file`, naming both. The frame
/// was evaluated alone, so the runtime calls it frame 0.
fn eval_error(file: &Path, frame: usize, e: EvalError) -> CliError {
    let input = matches!(
        e,
        EvalError::Input(_) | EvalError::Engine(ddmlip_engine::EngineError::Input(_))
    );
    let text = e.to_string();
    let text = text
        .strip_prefix("frame 0: ")
        .map(str::to_string)
        .or_else(|| {
            text.strip_prefix("frame 0 ")
                .map(|t| format!("the frame {t}"))
        })
        .unwrap_or(text);
    let e = anyhow!("{}: frame {frame}: {text}", file.display());
    if input {
        CliError::input(e)
    } else {
        CliError::failed(e)
    }
}

/// Evaluates every frame of `structure` (`-`: stdin) one after another on one
/// [`Evaluator`], writing each frame with its results to `output` (`-`:
/// stdout) as soon as it is done. `progress` allows the stderr spinner.
pub fn run_batch(
    model: &dyn Model,
    opts: EvalOptions,
    structure: &Path,
    output: Option<&Path>,
    progress: bool,
) -> Result<BatchRun, CliError> {
    let started = Instant::now();
    // Files in any format ddmlip reads (extended XYZ streamed, gzip too);
    // stdin as extended XYZ.
    let frames: Box<dyn Iterator<Item = Result<System, StructureError>>> = if is_stdio(structure) {
        Box::new(
            FrameReader::with_file_name(std::io::BufReader::new(std::io::stdin()), "stdin")
                .map(|f| f.map_err(StructureError::from)),
        )
    } else {
        stream_structure(structure).map_err(CliError::input)?
    };
    // A POSCAR or LAMMPS data file holds one frame: refuse a second before
    // computing or creating anything (this reads one frame ahead).
    let mut frames = frames.peekable();
    let first = frames.next();
    if let (Some(p), Some(_), Some(_)) = (output, &first, frames.peek()) {
        check_output_holds(p, structure, 2)?;
    }
    let frames = first.into_iter().chain(frames);
    let mut writer = match output {
        None => None,
        Some(p) if is_stdio(p) => Some(StructureWriter::from_writer(
            Box::new(std::io::stdout().lock()),
            Format::ExtendedXyz,
            "stdout",
        )),
        Some(p) => Some(StructureWriter::create(p).map_err(CliError::input)?),
    };
    let mut evaluator = Evaluator::new(model, opts);
    let mut bar = Progress::new(progress);
    let mut results = Vec::new();
    for (k, frame) in frames.enumerate() {
        let mut sys = frame.map_err(CliError::input)?;
        let r = evaluator
            .evaluate(std::slice::from_ref(&sys))
            .map_err(|e| eval_error(structure, k, e))?;
        let fr = frame_result(&sys, &r);
        drop(r);
        check_finite(&model.name(), k, &fr)?;
        if let Some(w) = writer.as_mut() {
            sys.set_results(&ddmlip_atoms::Results {
                energy: fr.energy,
                forces: &fr.forces,
                stress: fr.stress,
                energies: fr.atomic_energies.as_deref(),
            });
            w.write_frame(&sys)
                .map_err(|e| CliError::input(anyhow!("frame {k}: {e}")))?;
        }
        bar.tick(
            started,
            k as u64 + 1,
            format!("{} atoms, E = {:.6} eV", fr.atoms, fr.energy),
        );
        results.push(fr);
    }
    bar.finish();
    if results.is_empty() {
        return Err(CliError::input(anyhow!(
            "{}: no frames",
            structure.display()
        )));
    }
    if let Some(w) = writer {
        w.finish().map_err(CliError::input)?;
    }
    Ok(BatchRun {
        frames: results,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The `eval --json` object: the top-level `energy`, `forces`, `stress`,
/// `atomic_energies` (and extra outputs) keep their batch shape
/// (DESIGN.md §6), beside `model`, `units` and per-frame objects in
/// `frames`.
pub fn batch_json(model: &dyn Model, run: &BatchRun, ranks: usize, dtype: &str) -> Value {
    let mut obj = serde_json::Map::new();
    obj.insert("model".into(), json!(model.name()));
    obj.insert(
        "units".into(),
        json!({"energy": "eV", "forces": "eV/Å", "stress": "eV/Å³ (ASE sign, Voigt xx yy zz yz xz xy)",
               "atomic_energies": "eV", "positions": "Å"}),
    );
    obj.insert("ranks".into(), json!(ranks));
    obj.insert("dtype".into(), json!(dtype));
    let health = run.health();
    if !health.is_empty() {
        obj.insert("partition_health".into(), json!(health));
    }
    let energy: Vec<f64> = run.frames.iter().map(|f| f.energy).collect();
    obj.insert("energy".into(), json!(energy));
    let forces: Vec<[f64; 3]> = run
        .frames
        .iter()
        .flat_map(|f| f.forces.iter().copied())
        .collect();
    obj.insert("forces".into(), json!(forces));
    obj.insert(
        "stress".into(),
        json!(run.frames.iter().map(|f| f.stress).collect::<Vec<_>>()),
    );
    if run.frames.iter().all(|f| f.atomic_energies.is_some()) {
        let ae: Vec<f64> = run
            .frames
            .iter()
            .flat_map(|f| f.atomic_energies.iter().flatten().copied())
            .collect();
        obj.insert("atomic_energies".into(), json!(ae));
    }
    // Extra outputs (charges, …) concatenated over frames, rows of `width`.
    if let Some(first) = run.frames.first() {
        for (name, width, _) in &first.extra {
            let mut rows: Vec<Value> = Vec::new();
            for f in &run.frames {
                if let Some((_, _, v)) = f.extra.iter().find(|(n, _, _)| n == name) {
                    if *width == 1 {
                        rows.extend(v.iter().map(|&x| json!(x)));
                    } else {
                        rows.extend(v.chunks(*width).map(|c| json!(c)));
                    }
                }
            }
            obj.insert(name.clone(), Value::Array(rows));
        }
    }
    let frames: Vec<Value> = run
        .frames
        .iter()
        .map(|f| {
            let mut o = serde_json::Map::new();
            o.insert("atoms".into(), json!(f.atoms));
            o.insert("energy".into(), json!(f.energy));
            o.insert("forces".into(), json!(f.forces));
            match f.stress {
                Some(s) => {
                    o.insert("stress".into(), json!(s));
                }
                None => {
                    o.insert("stress".into(), Value::Null);
                    o.insert("stress_null_reason".into(), json!(NO_STRESS_REASON));
                }
            }
            if let Some(ae) = &f.atomic_energies {
                o.insert("atomic_energies".into(), json!(ae));
            }
            Value::Object(o)
        })
        .collect();
    obj.insert("frames".into(), Value::Array(frames));
    Value::Object(obj)
}

/// The human summary: one line (and a stress line) per frame.
pub fn batch_text(model: &dyn Model, run: &BatchRun, ranks: usize) -> String {
    let mut s = format!(
        "model {} | {} frame(s), {} atoms | {} rank(s) | {:.3} s\n",
        model.name(),
        run.frames.len(),
        run.atoms(),
        ranks,
        run.seconds
    );
    for (i, f) in run.frames.iter().enumerate() {
        let fmax = f
            .forces
            .iter()
            .map(|v| (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt())
            .fold(0.0, f64::max);
        let sum = f
            .forces
            .iter()
            .fold([0.0; 3], |a, v| [a[0] + v[0], a[1] + v[1], a[2] + v[2]]);
        s.push_str(&format!(
            "frame {i}: {} atoms  E = {} eV  ({} eV/atom)  max|F| = {} eV/Å  |ΣF| = {:.1e}\n",
            f.atoms,
            fixed_or_sci(f.energy, 10),
            fixed_or_sci(f.energy / f.atoms as f64, 6),
            fixed_or_sci(fmax, 6),
            (sum[0] * sum[0] + sum[1] * sum[1] + sum[2] * sum[2]).sqrt()
        ));
        if let Some(st) = f.stress {
            s.push_str(&format!(
                "         stress (eV/Å³, xx yy zz yz xz xy) = [{}]\n",
                st.iter()
                    .map(|v| format!("{v:.6e}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let bytes: u64 = run.frames.iter().map(|f| f.bytes_sent).sum();
    if bytes > 0 {
        s.push_str(&format!("halo/collective traffic: {bytes} bytes sent\n"));
    }
    s
}

/// `x` with `decimals` decimals, or in scientific notation once it is too
/// large for a fixed-point line to stay readable.
pub fn fixed_or_sci(x: f64, decimals: usize) -> String {
    if x.abs() < 1e9 {
        format!("{x:.decimals$}")
    } else {
        format!("{x:.decimals$e}")
    }
}

/// A warning for energies far outside any physical range (atoms much closer
/// than any training data), `None` otherwise.
pub fn absurd_energy_warning(run: &BatchRun) -> Option<String> {
    let worst = run
        .frames
        .iter()
        .enumerate()
        .map(|(i, f)| (i, (f.energy / f.atoms.max(1) as f64).abs()))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    // Cohesive energies are a few eV per atom; 1 keV per atom means atoms
    // sit far closer together than any material (or training set) has them.
    (worst.1 > 1e3).then(|| {
        format!(
            "warning: frame {}: {} eV per atom is far outside any physical range: atoms are \
             probably much closer together than the model was made for (check the structure's \
             units and cell; `ddmlip neighbors --structure FILE --cutoff 3` shows the shortest \
             distance)\n",
            worst.0,
            fixed_or_sci(
                run.frames[worst.0].energy / run.frames[worst.0].atoms as f64,
                3
            )
        )
    })
}
