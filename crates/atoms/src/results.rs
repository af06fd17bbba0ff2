//! Calculator results as ASE stores them with a structure, replaced as one
//! set: a file written after a new evaluation must not keep results of an
//! earlier calculation that ASE would read back as current.

use crate::{Column, InfoValue, System};

/// Per-system calculator results ASE reads from `info`
/// (`ase.io.extxyz.per_config_properties`).
pub const ASE_PER_SYSTEM_RESULTS: [&str; 7] = [
    "energy",
    "free_energy",
    "stress",
    "dipole",
    "magmom",
    "polarization",
    "dielectric_tensor",
];

/// Per-atom calculator results ASE reads from `arrays`
/// (`ase.io.extxyz.per_atom_properties`).
pub const ASE_PER_ATOM_RESULTS: [&str; 6] = [
    "energies",
    "forces",
    "stresses",
    "charges",
    "magmoms",
    "born_effective_charges",
];

/// One system's results of one evaluation.
#[derive(Debug, Clone, Copy)]
pub struct Results<'a> {
    /// Total energy (eV).
    pub energy: f64,
    /// Forces (eV/Å), one row per atom.
    pub forces: &'a [[f64; 3]],
    /// Stress (eV/Å³, ASE sign, Voigt xx yy zz yz xz xy); periodic systems.
    pub stress: Option<[f64; 6]>,
    /// Per-atom energies (eV), when the model has them.
    pub energies: Option<&'a [f64]>,
}

impl System {
    /// Removes every calculator result ASE would read back from this
    /// structure ([`ASE_PER_SYSTEM_RESULTS`] from `info`,
    /// [`ASE_PER_ATOM_RESULTS`] from `arrays`); inputs such as
    /// `initial_charges`, `momenta` or `masses` stay.
    pub fn clear_results(&mut self) {
        for key in ASE_PER_SYSTEM_RESULTS {
            self.properties.info.remove(key);
        }
        for key in ASE_PER_ATOM_RESULTS {
            self.properties.arrays.remove(key);
        }
    }

    /// Replaces all calculator results by `r`: `energy` and `free_energy`
    /// (equal: no electronic entropy), `forces`, `stress` when given and
    /// per-atom `energies` when given; every other result the structure
    /// carried is dropped ([`System::clear_results`]). Panics in debug builds
    /// when `forces` or `energies` do not have one row per atom.
    pub fn set_results(&mut self, r: &Results<'_>) {
        debug_assert_eq!(r.forces.len(), self.len());
        self.clear_results();
        self.set_energy(r.energy);
        self.properties
            .info
            .insert("free_energy".to_string(), InfoValue::Float(r.energy));
        self.set_forces(r.forces);
        if let Some(stress) = r.stress {
            self.set_stress_voigt(stress);
        }
        if let Some(e) = r.energies {
            debug_assert_eq!(e.len(), self.len());
            self.properties
                .arrays
                .insert("energies".to_string(), Column::Float(e.to_vec(), 1));
        }
    }
}
