//! A model of your own, written against the engine's ops, then validated.
//!
//! A many-body "embedded density" potential: every atom sits in the density
//! its neighbours make, `ρ_i = Σ_j exp(−β (r_ij − r₀))`, and its energy is
//! `E_i = −A √ρ_i`. The model is written once for f32 and f64
//! ([`ModelForward`]), declares no spec, and gets one inferred by
//! [`trace_and_validate`], which runs it split over ranks and compares every
//! output with the single-process run. The forces are then checked against
//! central finite differences of the energy.
//!
//! ```sh
//! cargo run --release -p ddmlip --example custom_model
//! ```

use ddmlip::engine::ops::{Pointwise, Unary};
use ddmlip::engine::{EngineError, Graph, ModelInputs, ModelOutputs, Scalar, SpeciesSupport};
use ddmlip::{build, evaluate, trace_and_validate, EvalOptions, ModelForward, ModelInfo};
use ddmlip::{System, ValidateOptions};

/// `E_i = −A √(Σ_j exp(−β (r_ij − r₀)))` over neighbours within `cutoff`.
struct EmbeddedDensity {
    /// Embedding strength A (eV).
    a: f64,
    /// Density decay β (1/Å).
    beta: f64,
    /// Reference distance r₀ (Å).
    r0: f64,
    /// Cutoff (Å).
    cutoff: f64,
}

impl ModelInfo for EmbeddedDensity {
    fn name(&self) -> String {
        "embedded-density".into()
    }
    fn description(&self) -> String {
        "a toy many-body potential written in an example".into()
    }
    fn cutoff(&self) -> f64 {
        self.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(118)
    }
}

impl ModelForward for EmbeddedDensity {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let edges = inputs
            .edges
            .ok_or_else(|| EngineError::Input("needs the runtime neighbour graph".into()))?;
        let r = edges.lengths(g)?;
        // One fused element-wise op per edge: exp(−β (r − r₀)).
        let mut density = Pointwise::new("pair_density", 1);
        let x = density.input(0);
        let x = density.unary(x, Unary::AddScalar(-self.r0));
        let x = density.unary(x, Unary::Scale(-self.beta));
        density.unary(x, Unary::Exp);
        let pair = g.pointwise(&[r], &density)?;
        // Each edge's density lands on its centre atom.
        let rho = g.scatter_add(pair, edges.center)?;
        let embedding = g.unary(rho, Unary::Sqrt)?;
        let atomic = g.scale(embedding, -self.a)?;
        let energy = g.segment_sum(atomic, inputs.atom_system)?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: vec![],
        })
    }
}

/// Largest |F − (−∂E/∂x)| over a few coordinates, by central differences.
fn finite_difference_error(
    model: &EmbeddedDensity,
    sys: &System,
) -> Result<f64, Box<dyn std::error::Error>> {
    let opts = EvalOptions::default();
    let forces = evaluate(model, std::slice::from_ref(sys), &opts)?
        .forces()
        .ok_or("the run has no forces")?;
    let h = 1e-5;
    let mut worst: f64 = 0.0;
    for (atom, axis) in [(0, 0), (5, 1), (17, 2), (30, 0)] {
        let energy_at = |dx: f64| -> Result<f64, Box<dyn std::error::Error>> {
            let mut moved = sys.clone();
            moved.positions[atom][axis] += dx;
            let result = evaluate(model, &[moved], &opts)?;
            Ok(result.energy().ok_or("the run has no energy")?[0])
        };
        let numeric = -(energy_at(h)? - energy_at(-h)?) / (2.0 * h);
        worst = worst.max((numeric - forces[atom][axis]).abs());
    }
    Ok(worst)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = EmbeddedDensity {
        a: 1.0,
        beta: 1.5,
        r0: 2.55,
        // Between the second (3.6 Å) and third (4.4 Å) neighbour shells of Cu.
        cutoff: 4.0,
    };
    let crystal = build::demo_copper(6);
    let report = trace_and_validate(
        &model,
        std::slice::from_ref(&crystal),
        &ValidateOptions {
            ranks: 2,
            ..Default::default()
        },
    )?;
    println!("{}", report.render());
    // A pass on a split where every rank sees the whole system proves
    // nothing; 6×6×6 cells on 2 ranks leave each rank remote atoms.
    if report
        .diagnostics
        .partition_health
        .iter()
        .any(|h| !h.degenerate.is_empty())
    {
        return Err("the split is degenerate: use a larger crystal".into());
    }
    if !report.ok {
        return Err("the custom model does not validate".into());
    }
    let fd = finite_difference_error(&model, &crystal)?;
    println!("forces vs central finite differences: largest difference {fd:.2e} eV/Å");
    if fd > 1e-6 {
        return Err(format!("forces disagree with finite differences by {fd:e} eV/Å").into());
    }
    Ok(())
}

#[test]
fn custom_model_example_runs() {
    main().unwrap();
}
