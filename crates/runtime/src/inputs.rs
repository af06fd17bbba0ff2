//! Checks of a batch before any work, and the graph inputs both the
//! single-process run and every rank build: position and strain leaves,
//! strained positions and cells, the runtime graph; and the stress from the
//! strain gradient.

use crate::{EvalError, MIN_DISTANCE};
use ddmlip_atoms::{Cell, System};
use ddmlip_engine::ops::PeriodicShifts;
use ddmlip_engine::{DType, EngineError, Graph, Model, ModelInputs, RowDomain, Scalar, Tensor};
use std::sync::Arc;
use std::time::Instant;

/// Checks the batch against the model before any work.
pub fn check_batch(model: &dyn Model, batch: &[System]) -> Result<(), EvalError> {
    if batch.is_empty() {
        return Err(EvalError::Input(
            "the structure file holds no frames".into(),
        ));
    }
    let support = model.species();
    for (s, sys) in batch.iter().enumerate() {
        if sys.is_empty() {
            return Err(EvalError::Input(format!("frame {s} has no atoms")));
        }
        sys.validate()
            .map_err(|e| EvalError::Input(format!("frame {s}: {e}")))?;
        let mut bad: Vec<u32> = sys
            .numbers
            .iter()
            .copied()
            .filter(|&z| !support.contains(z))
            .collect();
        bad.sort_unstable();
        bad.dedup();
        if !bad.is_empty() {
            let names: Vec<String> = bad
                .iter()
                .map(|&z| match ddmlip_atoms::elements::symbol(z) {
                    Some(sym) => format!("{sym} (Z={z})"),
                    None => format!("Z={z}"),
                })
                .collect();
            return Err(EvalError::Input(format!(
                "frame {s}: model `{}` has no parameters for {}",
                model.name(),
                names.join(", ")
            )));
        }
    }
    Ok(())
}

pub(crate) fn has_stress(sys: &System) -> bool {
    sys.is_periodic() && sys.cell.is_some_and(|c| c.volume() > 1e-12)
}

pub(crate) fn close_atoms_error(sys: usize, i: usize, j: usize, d: f64) -> EvalError {
    EvalError::Input(format!(
        "frame {sys}: atoms {i} and {j} are {d:.2e} Å apart (less than {MIN_DISTANCE:e} Å); the model cannot be evaluated there"
    ))
}

pub(crate) fn check_energy_shape<T: Scalar>(
    g: &Graph<T>,
    energy: Tensor,
    n_sys: usize,
) -> Result<(), EvalError> {
    if g.shape(energy) != (n_sys, 1) {
        return Err(EvalError::Engine(EngineError::Shape {
            op: "model output".into(),
            message: format!(
                "energy must be {n_sys}×1 (one row per system), got {:?}",
                g.shape(energy)
            ),
        }));
    }
    Ok(())
}

/// What one process evaluates, as plain arrays: its atom rows, the cells, and
/// the runtime graph (edge endpoints are row numbers).
pub(crate) struct LocalProblem {
    /// rows × 3 (Å), in f64 whatever the graph's type: f32 graphs round them
    /// once and compute edge geometry from these (see
    /// [`Graph::set_exact_values`]).
    pub(crate) positions: Vec<f64>,
    pub(crate) numbers: Vec<u32>,
    /// Row → system.
    pub(crate) atom_system: Vec<u32>,
    /// n_systems × 9, rows of each cell are lattice vectors (f64, as the
    /// positions).
    pub(crate) cells: Vec<f64>,
    pub(crate) pbc: Vec<[bool; 3]>,
    pub(crate) centers: Vec<u32>,
    pub(crate) neighbors: Vec<u32>,
    pub(crate) edge_system: Vec<u32>,
    /// Integer image shifts per edge, or `None` when images are explicit atoms.
    pub(crate) shifts: Option<Vec<[i32; 3]>>,
}

/// The differentiable leaves and what the model receives.
pub(crate) struct BuiltInputs {
    pub(crate) positions: Tensor,
    pub(crate) strain: Tensor,
    pub(crate) inputs: ModelInputs,
}

/// Puts a problem on the graph: position and strain leaves, strained
/// positions and cells, and (when the model wants it) the runtime graph
/// with edge vectors and lengths.
pub(crate) fn build_inputs<T: Scalar>(
    g: &mut Graph<T>,
    p: LocalProblem,
    with_graph: bool,
) -> Result<BuiltInputs, EvalError> {
    let n_rows = p.numbers.len();
    let n_sys = p.pbc.len();
    let rounded = |v: &[f64]| -> Vec<T> { v.iter().map(|&x| T::from_f64(x)).collect() };
    let positions = g.leaf(rounded(&p.positions), n_rows, 3, RowDomain::Atom);
    let strain = g.leaf(vec![T::zero(); 9 * n_sys], n_sys, 9, RowDomain::System);
    let cell = g.constant(rounded(&p.cells), 3 * n_sys, 3, RowDomain::System);
    if T::DTYPE != DType::F64 {
        g.set_exact_values(positions, p.positions)?;
        g.set_exact_values(cell, p.cells)?;
    }
    let atom_system = g.index(
        Arc::new(p.atom_system),
        RowDomain::Atom,
        RowDomain::System,
        n_sys,
        "atom_system",
    )?;
    let cell_rows: Vec<u32> = (0..3 * n_sys as u32).map(|r| r / 3).collect();
    let cell_system = g.index(
        Arc::new(cell_rows),
        RowDomain::System,
        RowDomain::System,
        n_sys,
        "cell_system",
    )?;
    let pos_s = g.apply_strain(positions, strain, atom_system)?;
    let cell_s = g.apply_strain(cell, strain, cell_system)?;
    let edges = if with_graph {
        let c = g.index(
            Arc::new(p.centers),
            RowDomain::Edge,
            RowDomain::Atom,
            n_rows,
            "edge_center",
        )?;
        let n = g.index(
            Arc::new(p.neighbors),
            RowDomain::Edge,
            RowDomain::Atom,
            n_rows,
            "edge_neighbor",
        )?;
        let es = g.index(
            Arc::new(p.edge_system),
            RowDomain::Edge,
            RowDomain::System,
            n_sys,
            "edge_system",
        )?;
        let periodic = p.shifts.map(|shifts| PeriodicShifts {
            cell: cell_s,
            shifts: Arc::new(shifts),
            edge_system: es,
        });
        Some(g.edges(pos_s, c, n, es, periodic)?)
    } else {
        None
    };
    let inputs = ModelInputs {
        positions: pos_s,
        cell: cell_s,
        numbers: Arc::new(p.numbers),
        atom_system,
        n_systems: n_sys,
        pbc: p.pbc,
        edges,
    };
    Ok(BuiltInputs {
        positions,
        strain,
        inputs,
    })
}

/// σ = (1/V)·sym(∂E/∂ε) in ASE Voigt order (xx yy zz yz xz xy); NaN rows for
/// systems without a stress.
pub(crate) fn stress_from_strain_grad(geps: &[f64], batch: &[System]) -> Vec<f64> {
    let mut out = Vec::with_capacity(6 * batch.len());
    for (s, sys) in batch.iter().enumerate() {
        if !has_stress(sys) {
            out.extend([f64::NAN; 6]);
            continue;
        }
        let v = sys.cell.map(|c: Cell| c.volume()).unwrap_or(1.0);
        let e = &geps[s * 9..s * 9 + 9];
        let sym = |a: usize, b: usize| 0.5 * (e[a * 3 + b] + e[b * 3 + a]) / v;
        out.extend([
            sym(0, 0),
            sym(1, 1),
            sym(2, 2),
            sym(1, 2),
            sym(0, 2),
            sym(0, 1),
        ]);
    }
    out
}

/// Puts the graph's device-eligible ops on `opts.device`, when set (a
/// backend of its own for this graph).
pub(crate) fn place_on_device<T: Scalar>(
    g: &mut Graph<T>,
    opts: &crate::EvalOptions,
) -> Result<(), EvalError> {
    if let Some(device) = &opts.device {
        let backend = ddmlip_engine::device::open_backend::<T>(device.0.as_ref()).map_err(|e| {
            EvalError::Engine(EngineError::Device {
                op: format!("opening {}", device.0.name()),
                message: e.0,
            })
        })?;
        g.set_device(backend);
    }
    Ok(())
}

/// Host copies of the model's outputs (energy, atomic energies, extras):
/// what the runtime reads after the backward pass.
pub(crate) fn outputs_to_host<T: Scalar>(
    g: &mut Graph<T>,
    out: &ddmlip_engine::ModelOutputs,
) -> Result<(), EvalError> {
    let mut ts = vec![out.energy];
    ts.extend(out.atomic_energies);
    ts.extend(out.extra.iter().map(|(_, t)| *t));
    g.ensure_host(&ts)?;
    Ok(())
}

/// Seconds since `clock`, restarting it.
pub(crate) fn lap(clock: &mut Instant) -> f64 {
    let now = Instant::now();
    let s = (now - *clock).as_secs_f64();
    *clock = now;
    s
}
