//! Structures and deliberately broken models for the diagnostic corpus.
#![allow(dead_code)]

use ddmlip_atoms::{build, System};
use ddmlip_engine::ops::opaque::Shape;
use ddmlip_engine::{
    EngineError, Graph, ModelForward, ModelInfo, ModelInputs, ModelOutputs, OpaqueKernel,
    RowDomain, Scalar, SpeciesSupport,
};
use ddmlip_models::{LennardJones, RebuildDemo};
use ddmlip_spec::{MLIPSpec, ScatterMode};
use std::sync::Arc;

/// FCC copper, `n³` conventional cells, rattled by up to ±0.05 Å.
pub fn fcc_cu(n: usize) -> System {
    let mut sys = build::fcc(29, 3.615, n);
    build::rattle_uniform(&mut sys, 0.05, 12345);
    sys
}

/// A short-range Lennard-Jones for copper spacing (cutoff 5 Å).
pub fn short_lj() -> LennardJones {
    LennardJones {
        epsilon: 0.1,
        sigma: 2.3,
        cutoff: 5.0,
        shift: true,
    }
}

/// Sums all rows of an Atom×1 input into one System row (single-system
/// batches). With `backward == false` it has no backward pass.
pub struct SystemSumKernel {
    pub backward: bool,
}

impl<T: Scalar> OpaqueKernel<T> for SystemSumKernel {
    fn name(&self) -> &str {
        if self.backward {
            "system_sum"
        } else {
            "system_sum_nograd"
        }
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, ddmlip_engine::KernelError> {
        match inputs {
            [(RowDomain::Atom, _, 1)] => Ok((RowDomain::System, 1, 1)),
            _ => Err(ddmlip_engine::KernelError::Inputs {
                expected: "one Atom×1 input".into(),
            }),
        }
    }
    fn forward(
        &self,
        inputs: &[&[T]],
        _: &[Shape],
        out: &mut [T],
    ) -> Result<(), ddmlip_engine::KernelError> {
        let mut acc = T::zero();
        for &x in inputs[0] {
            acc += x;
        }
        out[0] = acc;
        Ok(())
    }
    fn backward(
        &self,
        _inputs: &[&[T]],
        _shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
    ) -> Option<Result<(), ddmlip_engine::KernelError>> {
        if !self.backward {
            return None;
        }
        for g in grads[0].iter_mut() {
            *g += grad_out[0];
        }
        Some(Ok(()))
    }
}

/// Pair energies per atom, summed to the system energy by an opaque kernel.
/// Declares the standard spec, which has no adapter for the kernel.
pub struct OpaqueSumModel {
    pub lj: LennardJones,
    pub backward: bool,
}

impl ModelInfo for OpaqueSumModel {
    fn name(&self) -> String {
        "opaque-sum-test".into()
    }
    fn description(&self) -> String {
        "pair model whose energy comes from an opaque system-sum kernel".into()
    }
    fn cutoff(&self) -> f64 {
        self.lj.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(118)
    }
    fn declared_spec(&self) -> Option<MLIPSpec> {
        Some(MLIPSpec::standard_energy_model())
    }
}

impl ModelForward for OpaqueSumModel {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let out = self.lj.forward(g, inputs)?;
        let atomic = out
            .atomic_energies
            .ok_or_else(|| EngineError::Input("no atomic energies".into()))?;
        let kernel: Arc<dyn OpaqueKernel<T>> = Arc::new(SystemSumKernel {
            backward: self.backward,
        });
        let energy = g.opaque(kernel, &[atomic])?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: vec![],
        })
    }
}

/// A pair model with a bug that only shows on rank 1.
pub struct RankOnePanics {
    pub lj: LennardJones,
}

impl ModelInfo for RankOnePanics {
    fn name(&self) -> String {
        "rank-one-panics".into()
    }
    fn description(&self) -> String {
        "pair model that panics on rank 1".into()
    }
    fn cutoff(&self) -> f64 {
        self.lj.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(118)
    }
    fn declared_spec(&self) -> Option<MLIPSpec> {
        Some(MLIPSpec::standard_energy_model())
    }
}

impl ModelForward for RankOnePanics {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        if g.distributor().map(|d| d.rank()) == Some(1) {
            panic!("species table lookup out of range on this domain");
        }
        self.lj.forward(g, inputs)
    }
}

/// Builds its own neighbour list with radius `true_cutoff` but reports
/// `declared_cutoff` from `cutoff()`; declares scatter local, halo depth 1.
pub struct HiddenCutoffModel {
    pub declared_cutoff: f64,
    pub true_cutoff: f64,
}

impl ModelInfo for HiddenCutoffModel {
    fn name(&self) -> String {
        "hidden-cutoff-test".into()
    }
    fn description(&self) -> String {
        "own-graph pair model whose true cutoff exceeds cutoff()".into()
    }
    fn cutoff(&self) -> f64 {
        self.declared_cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(94)
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

impl ModelForward for HiddenCutoffModel {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        RebuildDemo {
            cutoff: self.true_cutoff,
        }
        .forward(g, inputs)
    }
}

/// [`short_lj`] without a declared spec: validation infers everything from
/// its trace, where the pair potential is one `pair_sum` op.
pub struct UndeclaredLj;

impl ModelInfo for UndeclaredLj {
    fn name(&self) -> String {
        "undeclared-lj-test".into()
    }
    fn description(&self) -> String {
        "Lennard-Jones with no declared spec".into()
    }
    fn cutoff(&self) -> f64 {
        short_lj().cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(118)
    }
}

impl ModelForward for UndeclaredLj {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        short_lj().forward(g, inputs)
    }
}

/// `out[i] = Σ_{e: center[e] = i} w[e] · x[neighbor[e]]²`: a fused
/// gather → message → scatter kernel on one-column node and edge inputs.
pub struct SquareMessage;

impl<T: Scalar> ddmlip_engine::MessageKernel<T> for SquareMessage {
    fn name(&self) -> &str {
        "square_message"
    }
    fn out_cols(&self) -> usize {
        1
    }
    fn forward(
        &self,
        x: &ddmlip_engine::MessageInputs<'_, T>,
        out: &mut [T],
    ) -> Result<(), ddmlip_engine::KernelError> {
        for (e, (&i, &j)) in x.center.iter().zip(x.neighbor).enumerate() {
            let xj = x.nodes[0][j as usize];
            out[i as usize] += x.edges[0][e] * xj * xj;
        }
        Ok(())
    }
    fn backward(
        &self,
        x: &ddmlip_engine::MessageInputs<'_, T>,
        g: &[T],
        grad_nodes: &mut [Vec<T>],
        grad_edges: &mut [Vec<T>],
    ) -> Result<(), ddmlip_engine::KernelError> {
        for (e, (&i, &j)) in x.center.iter().zip(x.neighbor).enumerate() {
            let (i, j) = (i as usize, j as usize);
            let xj = x.nodes[0][j];
            let w = x.edges[0][e];
            grad_nodes[0][j] += g[i] * w * (xj + xj);
            grad_edges[0][e] += g[i] * xj * xj;
        }
        Ok(())
    }
}

/// A message-passing model on the runtime graph whose every layer is one
/// fused `message_passing` op (as SevenNet-0's convolutions are), with no
/// plain scatter-add at all: the coordination `x₀ = Σ_j fc(r_ij)·1²`, then
/// `layers` times `x ← x + Σ_j 0.1·fc(r_ij)·x_j²`. Declares no spec. Its
/// receptive field is `layers + 1` cutoffs, with `layers + 1` Edge → Atom
/// scatters.
pub struct FusedMessageChain {
    pub cutoff: f64,
    pub layers: usize,
}

impl ModelInfo for FusedMessageChain {
    fn name(&self) -> String {
        "fused-message-chain".into()
    }
    fn description(&self) -> String {
        "message passing through fused message_passing ops".into()
    }
    fn cutoff(&self) -> f64 {
        self.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(118)
    }
}

impl ModelForward for FusedMessageChain {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let edges = inputs
            .edges
            .ok_or_else(|| EngineError::Input("no runtime graph".into()))?;
        let lengths = edges.lengths(g)?;
        let fc = g.radial(
            lengths,
            ddmlip_engine::ops::Radial::CosineCutoff {
                cutoff: self.cutoff,
            },
        )?;
        let weight = g.scale(fc, 0.1)?;
        let kernel: Arc<dyn ddmlip_engine::MessageKernel<T>> = Arc::new(SquareMessage);
        let n_local = inputs.numbers.len();
        let ones = g.constant(vec![T::one(); n_local], n_local, 1, RowDomain::Atom);
        let mut x =
            g.message_passing(kernel.clone(), &[ones], &[fc], edges.center, edges.neighbor)?;
        for layer in 0..self.layers {
            g.push_scope(format!("interaction_{layer}"));
            let m = g.message_passing(
                kernel.clone(),
                &[x],
                &[weight],
                edges.center,
                edges.neighbor,
            )?;
            x = g.add(x, m)?;
            g.pop_scope();
        }
        let energy = g.segment_sum(x, inputs.atom_system)?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(x),
            extra: vec![],
        })
    }
}
