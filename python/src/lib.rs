//! `ddmlip._ddmlip`: the Rust half of the Python package `ddmlip`.
//!
//! The Python half (`ddmlip/__init__.py`) adapts these functions to ASE
//! (`ddmlip.Calculator`) and gives them their documented signatures; this
//! module only converts arrays, releases the GIL while Rust computes and
//! maps errors to Python exceptions:
//!
//! - bad input (unknown model, malformed spec, an element the model lacks,
//!   NaN positions, a degenerate cell, …) → `ValueError` with the message
//!   the `ddmlip` command prints after `error: `;
//! - a run that fails (a rank failing, an op producing NaN) → `RuntimeError`.
//!
//! Units are the command's: Å, eV, eV/Å, stress in eV/Å³ with ASE's sign
//! (Voigt `xx yy zz yz xz xy`).

use ddmlip::engine::EngineError;
use ddmlip::{
    trace_and_validate, BalancePolicy, Cell, DType, EvalError, EvalOptions, EvalResult, Evaluator,
    MLIPSpec, Model, System, ValidateError, ValidateOptions,
};
use numpy::ndarray::Array2;
use numpy::{PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod gpu;
mod md;

self_cell::self_cell!(
    /// A loaded model and an [`Evaluator`] borrowing it, kept together so
    /// that the evaluator (each rank's memory and thread pool) can live in a
    /// Python object between calls.
    struct LoadedEvaluator {
        owner: Box<dyn Model>,
        #[covariant]
        dependent: Evaluator,
    }
);

/// The message of an error and its causes joined by ": ", each cause once:
/// what `ddmlip` prints after `error: `.
fn message(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// Input errors become `ValueError`, failed runs `RuntimeError` (the
/// command's exit statuses 2 and 1).
fn eval_error(e: EvalError) -> PyErr {
    match &e {
        EvalError::Input(_) | EvalError::Engine(EngineError::Input(_)) => {
            PyValueError::new_err(message(&e))
        }
        _ => PyRuntimeError::new_err(message(&e)),
    }
}

fn value_error(e: impl std::error::Error + 'static) -> PyErr {
    PyValueError::new_err(message(&e))
}

fn parse_dtype(dtype: &str) -> PyResult<DType> {
    match dtype {
        "float64" | "f64" | "double" => Ok(DType::F64),
        "float32" | "f32" | "float" | "single" => Ok(DType::F32),
        other => Err(PyValueError::new_err(format!(
            "unknown dtype `{other}`: expected \"float64\" or \"float32\" (also \"f64\", \"f32\")"
        ))),
    }
}

fn parse_balance(balance: &str) -> PyResult<BalancePolicy> {
    match balance {
        "geometric" => Ok(BalancePolicy::Geometric),
        "atoms" => Ok(BalancePolicy::Atoms),
        other => Err(PyValueError::new_err(format!(
            "unknown balance `{other}`: expected \"geometric\" or \"atoms\""
        ))),
    }
}

fn parse_spec(spec_json: Option<&str>) -> PyResult<Option<MLIPSpec>> {
    spec_json
        .map(|text| MLIPSpec::from_json(text).map_err(value_error))
        .transpose()
}

fn parse_timeout(seconds: f64) -> PyResult<Duration> {
    if seconds.is_finite() && seconds > 0.0 {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(PyValueError::new_err(format!(
            "timeout must be a positive number of seconds, got {seconds}"
        )))
    }
}

/// Loads a built-in model, a model file or a SevenNet checkpoint (the
/// command's `--model`).
fn load_model(py: Python<'_>, model: &str) -> PyResult<Box<dyn Model>> {
    py.detach(|| ddmlip::load_model(model)).map_err(value_error)
}

/// Positions (N×3, Å) as rows.
fn positions_of(positions: PyReadonlyArray2<'_, f64>) -> PyResult<Vec<[f64; 3]>> {
    let pos = positions.as_array();
    if pos.ncols() != 3 {
        return Err(PyValueError::new_err(format!(
            "positions must have shape (N, 3), got {:?}",
            pos.shape()
        )));
    }
    Ok(pos.rows().into_iter().map(|r| [r[0], r[1], r[2]]).collect())
}

/// A cell (3×3, rows are lattice vectors); `None` or all zeros is no cell,
/// as ASE stores it (extended XYZ without `Lattice` reads the same way).
fn cell_of(cell: Option<PyReadonlyArray2<'_, f64>>) -> PyResult<Option<Cell>> {
    let Some(cell) = cell else {
        return Ok(None);
    };
    let c = cell.as_array();
    if c.shape() != [3, 3] {
        return Err(PyValueError::new_err(format!(
            "cell must have shape (3, 3), got {:?}",
            c.shape()
        )));
    }
    let cell = Cell::new([
        [c[[0, 0]], c[[0, 1]], c[[0, 2]]],
        [c[[1, 0]], c[[1, 1]], c[[1, 2]]],
        [c[[2, 0]], c[[2, 1]], c[[2, 2]]],
    ]);
    Ok((!cell.is_zero()).then_some(cell))
}

/// One system from arrays: `positions` (N×3, Å), `numbers` (N), `cell`
/// (see [`cell_of`]), `pbc`. Finiteness and the cell are checked by the
/// evaluation, with the command's messages.
fn system(
    positions: PyReadonlyArray2<'_, f64>,
    numbers: PyReadonlyArray1<'_, i64>,
    cell: Option<PyReadonlyArray2<'_, f64>>,
    pbc: [bool; 3],
) -> PyResult<System> {
    let positions = positions_of(positions)?;
    let numbers = numbers
        .as_array()
        .iter()
        .map(|&z| {
            u32::try_from(z)
                .ok()
                .filter(|&z| z > 0)
                .ok_or_else(|| PyValueError::new_err(format!("invalid atomic number {z}")))
        })
        .collect::<PyResult<Vec<u32>>>()?;
    if numbers.len() != positions.len() {
        return Err(PyValueError::new_err(format!(
            "positions ({}) and atomic numbers ({}) differ in length",
            positions.len(),
            numbers.len()
        )));
    }
    Ok(System::new(positions, numbers, cell_of(cell)?, pbc))
}

/// A batch of systems from parallel lists of arrays.
type SystemArrays<'py> = (
    PyReadonlyArray2<'py, f64>,
    PyReadonlyArray1<'py, i64>,
    Option<PyReadonlyArray2<'py, f64>>,
    [bool; 3],
);

/// Repeated evaluations of one model with fixed options, keeping each
/// rank's memory (and thread pool) between calls: what `ddmlip.Calculator`
/// drives. Not part of the public API.
#[pyclass(module = "ddmlip._ddmlip")]
struct Engine {
    /// The model and its evaluator; `None` only while the evaluator is
    /// being rebuilt. The mutex lets a call run without the GIL.
    loaded: Mutex<Option<LoadedEvaluator>>,
    /// Atom count of the last call: a different count starts a fresh
    /// evaluator, so a smaller system does not keep a larger one's memory.
    last_atoms: Mutex<usize>,
    opts: EvalOptions,
    model_name: String,
    cutoff: f64,
    /// Wall-clock seconds of the last call's evaluation in Rust (without
    /// the array conversions around it): the per-call overhead is a call's
    /// time minus this.
    last_seconds: Mutex<f64>,
    /// The model on a GPU (`device="cuda[:N]"`): calls go there, and the
    /// CPU evaluator above only gives the name and cutoff.
    gpu: Option<Mutex<gpu::GpuEngine>>,
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (model, ranks=1, dtype="float64", spec_json=None, balance="geometric", threads_per_rank=0, work_sharing=true, timeout=120.0, device="cpu"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &str,
        ranks: usize,
        dtype: &str,
        spec_json: Option<&str>,
        balance: &str,
        threads_per_rank: usize,
        work_sharing: bool,
        timeout: f64,
        device: &str,
    ) -> PyResult<Self> {
        let mut device = gpu::parse_device(device)?;
        // A model without CUDA kernels of its own runs through the op
        // engine, its generic ops on the GPU.
        let engine_device = match device {
            ddmlip::Device::Cuda(index) if !gpu::has_own_kernels(model)? => {
                device = ddmlip::Device::Cpu;
                Some(py.detach(|| gpu::engine_device(index))?)
            }
            _ => None,
        };
        if device != ddmlip::Device::Cpu && spec_json.is_some() {
            return Err(PyValueError::new_err(
                "spec does not apply to device=\"cuda\": the GPU models split the same way \
                 every time (ghost node features refreshed after every interaction block)",
            ));
        }
        let opts = EvalOptions {
            dtype: parse_dtype(dtype)?,
            ranks,
            spec: parse_spec(spec_json)?,
            balance: parse_balance(balance)?,
            threads_per_rank,
            work_sharing,
            timeout: parse_timeout(timeout)?,
            device: engine_device,
            ..Default::default()
        };
        if ranks == 0 {
            return Err(PyValueError::new_err("ranks must be at least 1"));
        }
        let gpu = match device {
            ddmlip::Device::Cpu => None,
            ddmlip::Device::Cuda(index) => {
                let precision = match opts.dtype {
                    DType::F32 => ddmlip_cuda::Precision::F32,
                    _ => ddmlip_cuda::Precision::F64,
                };
                let timeout = opts.timeout;
                let engine =
                    py.detach(|| gpu::GpuEngine::new(model, index, precision, ranks, timeout))?;
                Some(Mutex::new(engine))
            }
        };
        let model = load_model(py, model)?;
        let (model_name, cutoff) = (model.name(), model.cutoff());
        let loaded = LoadedEvaluator::new(model, |m| Evaluator::new(m.as_ref(), opts.clone()));
        Ok(Self {
            loaded: Mutex::new(Some(loaded)),
            last_atoms: Mutex::new(0),
            opts,
            model_name,
            cutoff,
            last_seconds: Mutex::new(0.0),
            gpu,
        })
    }

    /// Registry name of the model.
    #[getter]
    fn model_name(&self) -> &str {
        &self.model_name
    }

    /// Interaction cutoff of the model (Å).
    #[getter]
    fn cutoff(&self) -> f64 {
        self.cutoff
    }

    /// Seconds the last call spent evaluating in Rust, array conversions
    /// excluded.
    #[getter]
    fn last_seconds(&self) -> f64 {
        self.last_seconds.lock().map_or(f64::NAN, |s| *s)
    }

    /// Bytes of tensor memory the evaluator keeps for the next call.
    #[getter]
    fn held_bytes(&self) -> PyResult<usize> {
        let guard = self
            .loaded
            .lock()
            .map_err(|_| PyRuntimeError::new_err("the evaluator is poisoned"))?;
        Ok(guard
            .as_ref()
            .map_or(0, |l| l.borrow_dependent().held_bytes()))
    }

    /// Evaluates one system. Returns a dict: `energy` (float, eV),
    /// `forces` (N×3, eV/Å), `stress` (6, eV/Å³, or None when not
    /// periodic), `energies` (N, eV, or None when the model has none).
    #[pyo3(signature = (positions, numbers, cell, pbc))]
    fn evaluate<'py>(
        &self,
        py: Python<'py>,
        positions: PyReadonlyArray2<'py, f64>,
        numbers: PyReadonlyArray1<'py, i64>,
        cell: Option<PyReadonlyArray2<'py, f64>>,
        pbc: [bool; 3],
    ) -> PyResult<Bound<'py, PyDict>> {
        let batch = [system(positions, numbers, cell, pbc)?];
        let n = batch[0].len();
        if let Some(gpu) = &self.gpu {
            let started = Instant::now();
            let r = py.detach(|| {
                let engine = gpu
                    .lock()
                    .map_err(|_| PyRuntimeError::new_err("a previous evaluation panicked"))?;
                engine.evaluate(&batch[0])
            })?;
            if let Ok(mut seconds) = self.last_seconds.lock() {
                *seconds = started.elapsed().as_secs_f64();
            }
            let out = PyDict::new(py);
            out.set_item("energy", r.energy)?;
            out.set_item(
                "stress",
                r.stress.map(|s| PyArray1::from_vec(py, s.to_vec())),
            )?;
            let forces = r.forces.into_iter().flatten().collect();
            out.set_item("forces", array2(py, forces, n, 3)?)?;
            out.set_item("energies", PyArray1::from_vec(py, r.atomic_energies))?;
            return Ok(out);
        }
        let mut result = py.detach(|| self.run(&batch))?;
        let out = PyDict::new(py);
        out.set_item("energy", result.energy().and_then(|e| e.first().copied()))?;
        let stress = result
            .stress()
            .and_then(|s| s.first().copied().flatten())
            .map(|s| PyArray1::from_vec(py, s.to_vec()));
        out.set_item("stress", stress)?;
        let forces = take_output(&mut result, "forces").unwrap_or_default();
        out.set_item("forces", array2(py, forces, n, 3)?)?;
        let energies =
            take_output(&mut result, "atomic_energies").map(|v| PyArray1::from_vec(py, v));
        out.set_item("energies", energies)?;
        Ok(out)
    }
}

impl Engine {
    /// Runs the evaluator on `batch` (without the GIL), rebuilding it when
    /// the atom count changed since the last call.
    fn run(&self, batch: &[System]) -> PyResult<EvalResult> {
        let poisoned = || PyRuntimeError::new_err("a previous evaluation panicked");
        let mut guard = self.loaded.lock().map_err(|_| poisoned())?;
        let n: usize = batch.iter().map(System::len).sum();
        {
            let mut last = self.last_atoms.lock().map_err(|_| poisoned())?;
            if *last != n && *last != 0 {
                let model = guard.take().ok_or_else(poisoned)?.into_owner();
                let opts = self.opts.clone();
                *guard = Some(LoadedEvaluator::new(model, |m| {
                    Evaluator::new(m.as_ref(), opts)
                }));
            }
            *last = n;
        }
        let loaded = guard.as_mut().ok_or_else(poisoned)?;
        let started = Instant::now();
        let result = loaded
            .with_dependent_mut(|_, evaluator| evaluator.evaluate(batch))
            .map_err(eval_error);
        if let Ok(mut seconds) = self.last_seconds.lock() {
            *seconds = started.elapsed().as_secs_f64();
        }
        result
    }
}

/// The values of output `name`, moved out of the result (no copy).
fn take_output(result: &mut EvalResult, name: &str) -> Option<Vec<f64>> {
    result.outputs.remove(name).map(|o| o.values)
}

/// A rows×cols numpy array owning `values` (no copy).
fn array2(
    py: Python<'_>,
    values: Vec<f64>,
    rows: usize,
    cols: usize,
) -> PyResult<Bound<'_, PyArray2<f64>>> {
    let array = Array2::from_shape_vec((rows, cols), values)
        .map_err(|e| PyRuntimeError::new_err(format!("output of unexpected shape: {e}")))?;
    Ok(PyArray2::from_owned_array(py, array))
}

/// Validates `model` on a batch; returns the report as JSON (the fields of
/// `ddmlip validate --json`).
#[pyfunction]
#[pyo3(signature = (model, systems, ranks=4, spec_json=None, autofix=true, atol=1e-8, rtol=1e-10, max_attempts=8, dtype="float64", timeout=120.0))]
#[allow(clippy::too_many_arguments)]
fn validate(
    py: Python<'_>,
    model: &str,
    systems: Vec<SystemArrays<'_>>,
    ranks: usize,
    spec_json: Option<&str>,
    autofix: bool,
    atol: f64,
    rtol: f64,
    max_attempts: usize,
    dtype: &str,
    timeout: f64,
) -> PyResult<String> {
    let dtype = parse_dtype(dtype)?;
    let options = ValidateOptions {
        ranks,
        atol,
        rtol,
        prior: parse_spec(spec_json)?,
        autofix,
        max_attempts,
        timeout: parse_timeout(timeout)?,
        dtype,
        device: None,
    };
    let batch = systems
        .into_iter()
        .map(|(p, z, c, pbc)| system(p, z, c, pbc))
        .collect::<PyResult<Vec<System>>>()?;
    let model = load_model(py, model)?;
    let report = py
        .detach(|| trace_and_validate(model.as_ref(), &batch, &options))
        // Every validate error is about the caller's input or options.
        .map_err(|e: ValidateError| value_error(e))?;
    Ok(report.to_json())
}

/// Neighbour list of one system: `(i, j, S, d, D)` as numpy arrays (int64
/// i, j (P); int64 S (P×3); float64 d (P) in Å; float64 D (P×3) =
/// `r_j + S·cell − r_i`), sorted by (i, j, S).
#[pyfunction]
#[pyo3(signature = (positions, cell, pbc, cutoff, full=true))]
#[allow(clippy::type_complexity)]
fn neighbor_list<'py>(
    py: Python<'py>,
    positions: PyReadonlyArray2<'py, f64>,
    cell: Option<PyReadonlyArray2<'py, f64>>,
    pbc: [bool; 3],
    cutoff: f64,
    full: bool,
) -> PyResult<(
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray2<f64>>,
)> {
    let positions = positions_of(positions)?;
    let cell = cell_of(cell)?;
    let opts = ddmlip_neighbors::NeighborOptions {
        cutoff,
        half: !full,
    };
    let nl = py
        .detach(|| ddmlip_neighbors::neighbor_list(&positions, cell.as_ref(), pbc, &opts))
        .map_err(value_error)?;
    let p = nl.len();
    let i = nl.centers.iter().map(|&x| i64::from(x)).collect();
    let j = nl.neighbors.iter().map(|&x| i64::from(x)).collect();
    let shifts = nl
        .shifts
        .iter()
        .flat_map(|s| s.map(i64::from))
        .collect::<Vec<i64>>();
    let vectors = nl.vectors.iter().flatten().copied().collect::<Vec<f64>>();
    let shifts = Array2::from_shape_vec((p, 3), shifts)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok((
        PyArray1::from_vec(py, i),
        PyArray1::from_vec(py, j),
        PyArray2::from_owned_array(py, shifts),
        PyArray1::from_vec(py, nl.distances),
        array2(py, vectors, p, 3)?,
    ))
}

/// The built-in models: `[(name, description)]` (what `ddmlip models` lists).
#[pyfunction]
fn models() -> Vec<(String, String)> {
    ddmlip::model_names()
}

#[pymodule]
fn _ddmlip(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(neighbor_list, m)?)?;
    m.add_function(wrap_pyfunction!(models, m)?)?;
    m.add_function(wrap_pyfunction!(md::md_run, m)?)?;
    m.add_function(wrap_pyfunction!(md::relax_run, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
