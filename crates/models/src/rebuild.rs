//! A model that builds its own neighbour list inside `forward` from the
//! positions and cell it is given — the pattern of models that carry their
//! own graph construction. Its graph covers ghost-centred pairs too, so its
//! scatters must not be halo-corrected (`scatter: local`).

use crate::demo::DEMO_MAX_Z;
use crate::init::Weights;
use ddmlip_engine::ops::{PeriodicShifts, Radial, Unary};
use ddmlip_engine::{
    EngineError, Graph, ModelForward, ModelInfo, ModelInputs, ModelOutputs, RowDomain, Scalar,
    SpeciesSupport,
};
use ddmlip_neighbors::{neighbor_list, NeighborOptions};
use ddmlip_spec::{MLIPSpec, ScatterMode};
use std::sync::Arc;

/// Morse-like pair model `½ D_ij (e^{−2a(r−r₀)} − 2e^{−a(r−r₀)}) f_c(r)` on a
/// neighbour list built inside the model.
#[derive(Debug, Clone)]
pub struct RebuildDemo {
    /// Interaction cutoff (Å): atoms farther apart do not interact.
    pub cutoff: f64,
}

impl Default for RebuildDemo {
    fn default() -> Self {
        Self { cutoff: 4.5 }
    }
}

impl ModelInfo for RebuildDemo {
    fn name(&self) -> String {
        "rebuild-demo".into()
    }
    fn description(&self) -> String {
        "Morse-like pair model that builds its own neighbour list in forward, cutoff 4.5 Å".into()
    }
    fn cutoff(&self) -> f64 {
        self.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(DEMO_MAX_Z)
    }
    fn uses_runtime_graph(&self) -> bool {
        false
    }
    fn declared_spec(&self) -> Option<MLIPSpec> {
        let mut s = MLIPSpec::standard_energy_model();
        s.policy.scatter = ScatterMode::Local;
        Some(s)
    }
}

impl ModelForward for RebuildDemo {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let n_atoms = inputs.numbers.len();
        let n_sys = inputs.n_systems;
        // The neighbour search runs on the host (the values may be on a device).
        g.ensure_host(&[inputs.positions, inputs.cell])?;
        let pos: Vec<[f64; 3]> = g
            .value(inputs.positions)
            .chunks(3)
            .map(|c| {
                [
                    c[0].to_f64_lossless(),
                    c[1].to_f64_lossless(),
                    c[2].to_f64_lossless(),
                ]
            })
            .collect();
        let cellv: Vec<f64> = g
            .value(inputs.cell)
            .iter()
            .map(|x| x.to_f64_lossless())
            .collect();
        let sys_of = g.index_values(inputs.atom_system).clone();
        let (mut centers, mut neighbors, mut shifts, mut esys) = (vec![], vec![], vec![], vec![]);
        for s in 0..n_sys {
            let rows: Vec<usize> = (0..n_atoms).filter(|&r| sys_of[r] as usize == s).collect();
            let p: Vec<[f64; 3]> = rows.iter().map(|&r| pos[r]).collect();
            let pbc = inputs.pbc[s];
            let m = &cellv[s * 9..s * 9 + 9];
            let cell = ddmlip_atoms_cell(m);
            let nl = neighbor_list(
                &p,
                pbc.iter().any(|&b| b).then_some(&cell),
                pbc,
                &NeighborOptions {
                    cutoff: self.cutoff,
                    half: false,
                },
            )
            .map_err(|e| EngineError::Input(format!("rebuild-demo neighbour list: {e}")))?;
            for e in 0..nl.len() {
                centers.push(rows[nl.centers[e] as usize] as u32);
                neighbors.push(rows[nl.neighbors[e] as usize] as u32);
                shifts.push(nl.shifts[e]);
                esys.push(s as u32);
            }
        }
        let n_edges = centers.len();
        let c = g.index(
            Arc::new(centers),
            RowDomain::Edge,
            RowDomain::Atom,
            n_atoms,
            "model_edge_center",
        )?;
        let n = g.index(
            Arc::new(neighbors),
            RowDomain::Edge,
            RowDomain::Atom,
            n_atoms,
            "model_edge_neighbor",
        )?;
        let es = g.index(
            Arc::new(esys),
            RowDomain::Edge,
            RowDomain::System,
            n_sys,
            "model_edge_system",
        )?;
        g.record_index_op("neighbor_list", &[inputs.positions], &[c, n], n_edges);
        let vec = g.edge_vectors(
            inputs.positions,
            c,
            n,
            Some(PeriodicShifts {
                cell: inputs.cell,
                shifts: Arc::new(shifts),
                edge_system: es,
            }),
        )?;
        let r = g.row_norm(vec)?;
        let species = g.index(
            inputs.numbers.clone(),
            RowDomain::Atom,
            RowDomain::None,
            DEMO_MAX_Z as usize + 1,
            "species",
        )?;
        let mut w = Weights::new(51);
        let depth: Vec<f64> = (0..=DEMO_MAX_Z).map(|_| 0.3 + 0.1 * w.uniform()).collect();
        let d = g.param(&depth, DEMO_MAX_Z as usize + 1, 1)?;
        let d_atom = g.gather(d, species)?;
        let d_i = g.gather(d_atom, c)?;
        let d_j = g.gather(d_atom, n)?;
        let dd = g.mul(d_i, d_j)?;
        let (a, r0) = (1.6, 2.4);
        let x = g.unary(r, Unary::AddScalar(-r0))?;
        let e1 = g.scale(x, -2.0 * a)?;
        let e1 = g.unary(e1, Unary::Exp)?;
        let e2 = g.scale(x, -a)?;
        let e2 = g.unary(e2, Unary::Exp)?;
        let e2 = g.scale(e2, 2.0)?;
        let morse = g.sub(e1, e2)?;
        let fc = g.radial(
            r,
            Radial::CosineCutoff {
                cutoff: self.cutoff,
            },
        )?;
        let pair = g.mul(morse, fc)?;
        let pair = g.mul(pair, dd)?;
        let pair = g.scale(pair, 0.5)?;
        let atomic = g.scatter_add(pair, c)?;
        let energy = g.segment_sum(atomic, inputs.atom_system)?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: vec![],
        })
    }
}

fn ddmlip_atoms_cell(m: &[f64]) -> ddmlip_atoms::Cell {
    ddmlip_atoms::Cell::new([[m[0], m[1], m[2]], [m[3], m[4], m[5]], [m[6], m[7], m[8]]])
}
