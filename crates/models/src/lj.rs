use ddmlip_engine::ops::{Pointwise, Unary};
use ddmlip_engine::{
    EngineError, Graph, ModelForward, ModelInfo, ModelInputs, ModelOutputs, Scalar, SpeciesSupport,
};
use ddmlip_spec::{MLIPSpec, ScatterMode};
use serde::Deserialize;

/// Lennard-Jones pair potential `4ε[(σ/r)¹² − (σ/r)⁶]`, truncated at `cutoff`,
/// optionally shifted to zero there (as ASE's `LennardJones` does by default).
/// Each pair's energy is split half-and-half between its two atoms.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LennardJones {
    /// Well depth ε (eV).
    pub epsilon: f64,
    /// Zero-crossing distance σ (Å).
    pub sigma: f64,
    /// Cutoff (Å).
    pub cutoff: f64,
    /// Shift the pair energy to zero at the cutoff.
    #[serde(default = "default_shift")]
    pub shift: bool,
}

/// Why a set of Lennard-Jones parameters is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LennardJonesError {
    /// A parameter (`epsilon`, `sigma` or `cutoff`) is zero, negative, NaN or infinite.
    #[error("`{name}` must be a positive finite number, got {value}")]
    NotPositive {
        /// The parameter's field name.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// 4ε or the pair energy at the cutoff overflows f64.
    #[error(
        "`epsilon` = {epsilon:e} with `sigma` = {sigma:e} and `cutoff` = {cutoff:e} overflows: \
         4ε(σ/rc)¹² must be a finite number"
    )]
    Overflow {
        /// Well depth ε (eV).
        epsilon: f64,
        /// σ (Å).
        sigma: f64,
        /// Cutoff (Å).
        cutoff: f64,
    },
}

fn default_shift() -> bool {
    true
}

impl LennardJones {
    /// The built-in `lj`: argon-like ε = 0.0104 eV, σ = 3.4 Å, cutoff 3σ, shifted.
    pub fn argon() -> Self {
        Self {
            epsilon: 0.0104,
            sigma: 3.4,
            cutoff: 10.2,
            shift: true,
        }
    }

    /// Checks the parameters are usable: ε, σ and the cutoff positive and
    /// finite, and the pair energy at the cutoff representable.
    pub fn check(&self) -> Result<(), LennardJonesError> {
        for (name, value) in [
            ("epsilon", self.epsilon),
            ("sigma", self.sigma),
            ("cutoff", self.cutoff),
        ] {
            if !value.is_finite() || value <= 0.0 {
                return Err(LennardJonesError::NotPositive { name, value });
            }
        }
        // 4ε and the shift 4ε[(σ/rc)¹² − (σ/rc)⁶] must be numbers: an
        // overflow there turns every energy into inf − inf = NaN.
        let shift = self.pair_at_cutoff();
        if !(4.0 * self.epsilon).is_finite() || !shift.is_finite() {
            return Err(LennardJonesError::Overflow {
                epsilon: self.epsilon,
                sigma: self.sigma,
                cutoff: self.cutoff,
            });
        }
        Ok(())
    }

    fn pair_at_cutoff(&self) -> f64 {
        let s6 = (self.sigma / self.cutoff).powi(6);
        4.0 * self.epsilon * (s6 * s6 - s6)
    }
}

impl ModelInfo for LennardJones {
    fn name(&self) -> String {
        "lj".into()
    }
    fn description(&self) -> String {
        format!(
            "Lennard-Jones pair potential (ε = {} eV, σ = {} Å, cutoff {} Å{})",
            self.epsilon,
            self.sigma,
            self.cutoff,
            if self.shift { ", shifted" } else { "" }
        )
    }
    fn cutoff(&self) -> f64 {
        self.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::UpTo(118)
    }
    fn declared_spec(&self) -> Option<MLIPSpec> {
        // Pair energies land on owned centres and nothing reads the atomic
        // energies' ghost rows (the energy sums owned rows, forces come from
        // the gradient), so the scatter needs no exchange: the step keeps
        // only the force exchange and the sums at its end.
        let mut spec = MLIPSpec::standard_energy_model();
        spec.policy.scatter = ScatterMode::Local;
        Some(spec)
    }
}

impl ModelForward for LennardJones {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let edges = inputs
            .edges
            .ok_or_else(|| EngineError::Input("lj needs the runtime neighbour graph".into()))?;
        // r ↦ ½·(4ε[s¹² − s⁶] − shift), s = σ/r, summed onto each centre
        // by one op that keeps nothing per edge: the chain is memory-bound
        // when lengths, pair terms and their gradients each pass through
        // memory.
        let mut e = Pointwise::new("lj_pair", 1);
        let r = e.input(0);
        let inv = e.unary(r, Unary::Recip);
        let s = e.unary(inv, Unary::Scale(self.sigma));
        let s6 = e.unary(s, Unary::Powf(6.0));
        let s12 = e.unary(s6, Unary::Square);
        let diff = e.sub(s12, s6);
        let mut pair = e.unary(diff, Unary::Scale(4.0 * self.epsilon));
        if self.shift {
            pair = e.unary(pair, Unary::AddScalar(-self.pair_at_cutoff()));
        }
        e.unary(pair, Unary::Scale(0.5));
        let atomic = g.pair_sum(&edges, &e)?;
        let energy = g.segment_sum(atomic, inputs.atom_system)?;
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: vec![],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::LennardJones;

    #[test]
    fn overflowing_parameters_are_rejected() {
        let lj = |epsilon: f64, sigma: f64, cutoff: f64| LennardJones {
            epsilon,
            sigma,
            cutoff,
            shift: true,
        };
        assert!(LennardJones::argon().check().is_ok());
        assert!(lj(1e300, 3.4, 10.2).check().is_ok());
        for bad in [
            lj(1e308, 3.4, 10.2),
            lj(1.0, 1e30, 1.0),
            lj(f64::MAX, 1.0, 2.0),
        ] {
            let e = bad.check().unwrap_err();
            assert!(
                matches!(e, super::LennardJonesError::Overflow { .. }),
                "{bad:?}: {e}"
            );
            assert!(e.to_string().contains("overflows"), "{bad:?}: {e}");
        }
    }
}
