//! `ddmlip.md` and `ddmlip.relax`: the `ddmlip md` / `ddmlip relax`
//! commands as functions. The numerics are `ddmlip-md`'s; this converts
//! arrays, checks input with the commands' messages, collects the thermo
//! rows and the final state, and writes the trajectory.

use crate::{message, parse_balance, parse_dtype, positions_of, system, value_error};
use ddmlip::{BalancePolicy, Model, System};
use ddmlip_atoms::Column;
use ddmlip_md::{
    maxwell_boltzmann, CellRelax, Checkpoint, Ensemble, Frame, MdConfig, MdError, MdSink,
    RelaxConfig, StartState, ThermoRow, Topology,
};
use numpy::{PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::fs::File;
use std::path::PathBuf;

/// Bad input → `ValueError`, anything else → `RuntimeError` (the
/// commands' exit statuses 2 and 1).
fn md_error(e: MdError) -> PyErr {
    match e {
        MdError::Input(_) => PyValueError::new_err(message(&e)),
        _ => PyRuntimeError::new_err(message(&e)),
    }
}

fn input(text: String) -> PyErr {
    PyValueError::new_err(text)
}

/// Loads the model (with its fidelity) and checks the system against it,
/// as the commands do.
fn load_checked(
    py: Python<'_>,
    model: &str,
    modal: Option<&str>,
    sys: &System,
) -> PyResult<Box<dyn Model>> {
    let model = py
        .detach(|| ddmlip_models::load_model_with_modal(model, modal))
        .map_err(value_error)?;
    ddmlip::runtime::check_batch(model.as_ref(), std::slice::from_ref(sys)).map_err(value_error)?;
    Ok(model)
}

/// The thermo columns, in the order of the command's CSV log.
const THERMO_COLUMNS: usize = 12;

/// Collects the thermo rows the command would log, the final state, and
/// writes trajectory frames as the command does.
struct CollectSink {
    template: System,
    has_masses: bool,
    traj: Option<(PathBuf, File)>,
    dt_fs: f64,
    log_every: u64,
    first_step: u64,
    last_step: u64,
    rows: Vec<[f64; THERMO_COLUMNS]>,
    temperatures: Vec<f64>,
    last: Option<Frame>,
}

impl CollectSink {
    /// A frame as the command's extended XYZ writes it.
    fn system(&self, frame: &Frame) -> System {
        frame.to_system(&self.template, self.has_masses, self.dt_fs)
    }
}

impl MdSink for CollectSink {
    fn thermo(&mut self, row: &ThermoRow) -> Result<(), MdError> {
        if row.step > self.first_step {
            self.temperatures.push(row.temperature);
        }
        if row.step.is_multiple_of(self.log_every) || row.step == self.last_step {
            self.rows.push([
                row.step as f64,
                row.time_ps,
                row.temperature,
                row.potential,
                row.kinetic,
                row.total,
                row.conserved,
                row.pressure_gpa.unwrap_or(f64::NAN),
                row.volume.unwrap_or(f64::NAN),
                row.rebuilds as f64,
                row.migrated as f64,
                row.ns_per_day,
            ]);
        }
        Ok(())
    }

    fn frame(&mut self, frame: &Frame, is_final: bool) -> Result<(), MdError> {
        if is_final {
            self.last = Some(frame.clone());
            return Ok(());
        }
        if self.traj.is_none() {
            return Ok(());
        }
        let sys = self.system(frame);
        if let Some((path, f)) = self.traj.as_mut() {
            // One frame at a time, flushed, as the command writes them.
            ddmlip_atoms::extxyz::write_frames(&mut *f, &[sys])
                .map_err(|e| MdError::Output(format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }

    fn checkpoint(&mut self, _: &Checkpoint) -> Result<(), MdError> {
        Ok(())
    }
}

/// The final state as a dict: `positions`, `momenta`, `forces` (N×3),
/// `cell` (3×3), `energy` (eV), `stress` (6, or None).
fn frame_dict<'py>(py: Python<'py>, frame: &Frame) -> PyResult<Bound<'py, PyDict>> {
    let rows = |v: &[[f64; 3]]| -> PyResult<Bound<'py, PyArray2<f64>>> {
        crate::array2(py, v.iter().flatten().copied().collect(), v.len(), 3)
    };
    let out = PyDict::new(py);
    out.set_item("positions", rows(&frame.positions)?)?;
    out.set_item("momenta", rows(&frame.momenta)?)?;
    out.set_item("forces", rows(&frame.forces)?)?;
    out.set_item("cell", rows(&frame.cell.matrix)?)?;
    out.set_item("energy", frame.energy)?;
    out.set_item(
        "stress",
        frame.stress.map(|s| PyArray1::from_vec(py, s.to_vec())),
    )?;
    Ok(out)
}

/// Runs MD (`ddmlip md` on thread ranks). Returns `(summary_json, thermo,
/// final)`: the command's `--json` summary, the rows of its CSV log (R×12,
/// NaN where the log has an empty field), and the final state
/// ([`frame_dict`]).
#[pyfunction]
#[pyo3(signature = (model, positions, numbers, cell, pbc, masses, has_masses, momenta, ensemble, dt, steps, temperature=None, friction=1.0, tdamp=None, chain=3, init_temperature=None, seed=0, skin=1.0, ranks=1, dtype="float64", balance="geometric", modal=None, traj=None, traj_every=10, log_every=10))]
#[allow(clippy::too_many_arguments)]
pub fn md_run<'py>(
    py: Python<'py>,
    model: &str,
    positions: PyReadonlyArray2<'py, f64>,
    numbers: PyReadonlyArray1<'py, i64>,
    cell: Option<PyReadonlyArray2<'py, f64>>,
    pbc: [bool; 3],
    masses: PyReadonlyArray1<'py, f64>,
    has_masses: bool,
    momenta: Option<PyReadonlyArray2<'py, f64>>,
    ensemble: &str,
    dt: f64,
    steps: i64,
    temperature: Option<f64>,
    friction: f64,
    tdamp: Option<f64>,
    chain: usize,
    init_temperature: Option<f64>,
    seed: u64,
    skin: f64,
    ranks: usize,
    dtype: &str,
    balance: &str,
    modal: Option<&str>,
    traj: Option<PathBuf>,
    traj_every: u64,
    log_every: u64,
) -> PyResult<(String, Bound<'py, PyArray2<f64>>, Bound<'py, PyDict>)> {
    // The command's checks, in its order and with its messages.
    if !(dt.is_finite() && dt > 0.0) {
        return Err(input(format!(
            "--dt must be a positive time step in fs, got {dt}"
        )));
    }
    if steps <= 0 {
        return Err(input(format!("--steps must be at least 1, got {steps}")));
    }
    for (flag, v) in [
        ("--temperature", temperature),
        ("--init-temperature", init_temperature),
    ] {
        if let Some(t) = v {
            if !(t.is_finite() && t >= 0.0) {
                return Err(input(format!(
                    "{flag} must be a non-negative temperature in K, got {t}"
                )));
            }
        }
    }
    if !(friction.is_finite() && friction >= 0.0) {
        return Err(input(format!(
            "--friction must be a non-negative rate in 1/ps, got {friction}"
        )));
    }
    if traj_every == 0 || log_every == 0 {
        return Err(input(
            "--traj-every and --log-every must be at least 1".into(),
        ));
    }
    if ranks == 0 {
        return Err(input("ranks must be at least 1".into()));
    }
    let needs = |name: &str| input(format!("--ensemble {name} needs --temperature K"));
    let ensemble = match ensemble {
        "nve" => Ensemble::Nve,
        "langevin" => Ensemble::Langevin {
            temperature: temperature.ok_or_else(|| needs("langevin"))?,
            friction_per_ps: friction,
        },
        "nose-hoover" => Ensemble::NoseHoover {
            temperature: temperature.ok_or_else(|| needs("nose-hoover"))?,
            tdamp_fs: tdamp.unwrap_or(100.0 * dt),
            chain,
        },
        other => {
            return Err(input(format!(
                "invalid value '{other}' for '--ensemble <ENSEMBLE>' [possible values: nve, langevin, nose-hoover]"
            )))
        }
    };
    let mut sys = system(positions, numbers, cell, pbc)?;
    sys.validate().map_err(value_error)?;
    if sys.is_empty() {
        return Err(input("the structure has no atoms".into()));
    }
    let masses = masses.as_array().to_vec();
    if masses.len() != sys.len() {
        return Err(input(format!(
            "masses ({}) and atoms ({}) differ in length",
            masses.len(),
            sys.len()
        )));
    }
    let model = load_checked(py, model, modal, &sys)?;
    if let Some((i, m)) = masses
        .iter()
        .enumerate()
        .find(|(_, m)| !(m.is_finite() && **m > 0.0))
    {
        return Err(input(format!(
            "atom {i} has mass {m}; masses must be positive"
        )));
    }
    let momenta = match momenta {
        Some(p) => {
            let p = positions_of(p).map_err(|_| {
                input("column `momenta` must hold 3 real number(s) per atom".into())
            })?;
            if p.len() != sys.len() {
                return Err(input(
                    "column `momenta` must hold 3 real number(s) per atom".into(),
                ));
            }
            p
        }
        None => match init_temperature {
            Some(t) => maxwell_boltzmann(&masses, t, seed),
            None => vec![[0.0; 3]; sys.len()],
        },
    };
    if has_masses {
        sys.properties
            .arrays
            .insert("masses".into(), Column::Float(masses.clone(), 1));
    }
    let topology = Topology {
        numbers: sys.numbers.clone(),
        masses,
        pbc: sys.pbc,
    };
    let start = StartState::fresh(sys.cell_or_zero(), sys.positions.clone(), momenta);
    let mut config = MdConfig::new(ensemble, dt, steps as u64);
    config.seed = seed;
    config.skin = skin;
    config.dtype = parse_dtype(dtype)?;
    config.even_counts = matches!(parse_balance(balance)?, BalancePolicy::Atoms);
    config.frame_every = if traj.is_some() { traj_every } else { 0 };
    config.thermo_every = 1;
    config.final_frame = true;
    config.check().map_err(md_error)?;
    let traj = match traj {
        Some(path) => {
            let f = File::create(&path).map_err(|e| input(format!("{}: {e}", path.display())))?;
            Some((path, f))
        }
        None => None,
    };
    let mut sink = CollectSink {
        template: sys,
        has_masses,
        traj,
        dt_fs: dt,
        log_every,
        first_step: 0,
        last_step: steps as u64,
        rows: Vec::new(),
        temperatures: Vec::new(),
        last: None,
    };
    let summary = py
        .detach(|| {
            ddmlip_md::run_threads(model.as_ref(), &topology, &start, &config, ranks, &mut sink)
        })
        .map_err(md_error)?;
    let mut json =
        serde_json::to_value(&summary).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let t = &sink.temperatures;
    json["mean_temperature_logged"] = serde_json::json!(if t.is_empty() {
        None
    } else {
        Some(t.iter().sum::<f64>() / t.len() as f64)
    });
    let last = sink.last.as_ref().ok_or_else(|| {
        PyRuntimeError::new_err("internal error: the run reported no final state")
    })?;
    let n_rows = sink.rows.len();
    let thermo = crate::array2(
        py,
        sink.rows.iter().flatten().copied().collect(),
        n_rows,
        THERMO_COLUMNS,
    )?;
    Ok((json.to_string(), thermo, frame_dict(py, last)?))
}

/// Relaxes positions, with `relax_cell` also the cell towards `pressure`
/// (GPa), with FIRE (`ddmlip relax [--cell --pressure P]` on thread ranks). Returns
/// `(summary_json, final)`: the command's `--json` summary and the final
/// state ([`frame_dict`]; momenta are zero).
#[pyfunction]
#[pyo3(signature = (model, positions, numbers, cell, pbc, fmax=0.05, max_steps=1000, skin=1.0, ranks=1, dtype="float64", balance="geometric", modal=None, relax_cell=false, pressure=None))]
#[allow(clippy::too_many_arguments)]
pub fn relax_run<'py>(
    py: Python<'py>,
    model: &str,
    positions: PyReadonlyArray2<'py, f64>,
    numbers: PyReadonlyArray1<'py, i64>,
    cell: Option<PyReadonlyArray2<'py, f64>>,
    pbc: [bool; 3],
    fmax: f64,
    max_steps: u64,
    skin: f64,
    ranks: usize,
    dtype: &str,
    balance: &str,
    modal: Option<&str>,
    relax_cell: bool,
    pressure: Option<f64>,
) -> PyResult<(String, Bound<'py, PyDict>)> {
    if ranks == 0 {
        return Err(input("ranks must be at least 1".into()));
    }
    if pressure.is_some() && !relax_cell {
        return Err(input(
            "pressure sets the target of the cell relaxation; it needs cell=True".into(),
        ));
    }
    let sys = system(positions, numbers, cell, pbc)?;
    let model = load_checked(py, model, modal, &sys)?;
    let topology = Topology {
        numbers: sys.numbers.clone(),
        // FIRE is mass-less; masses are not read.
        masses: vec![1.0; sys.len()],
        pbc: sys.pbc,
    };
    let config = RelaxConfig {
        fmax,
        max_steps,
        skin,
        dtype: parse_dtype(dtype)?,
        even_counts: matches!(parse_balance(balance)?, BalancePolicy::Atoms),
        cell: relax_cell.then(|| CellRelax {
            pressure_gpa: pressure.unwrap_or(0.0),
        }),
        ..Default::default()
    };
    let cell = sys.cell_or_zero();
    let summary = py
        .detach(|| {
            ddmlip_md::relax_threads(
                model.as_ref(),
                &topology,
                cell,
                &sys.positions,
                &config,
                ranks,
            )
        })
        .map_err(md_error)?;
    let last = summary.last.as_ref().ok_or_else(|| {
        PyRuntimeError::new_err("internal error: the relaxation reported no final state")
    })?;
    let json =
        serde_json::to_string(&summary).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok((json, frame_dict(py, last)?))
}
