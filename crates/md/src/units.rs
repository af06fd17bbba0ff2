//! ASE's unit system (CODATA 2014, ASE's default): lengths in Å, energies in
//! eV, masses in u, so that time is in Å·√(u/eV) ≈ 10.18 fs and momenta are in
//! u·Å/(Å·√(u/eV)) — the units of `ase.io.write`'s `momenta` column.

/// Elementary charge (C), CODATA 2014.
const ELEMENTARY_CHARGE: f64 = 1.6021766208e-19;
/// Atomic mass unit (kg), CODATA 2014.
const ATOMIC_MASS_UNIT: f64 = 1.660539040e-27;
/// Boltzmann constant (J/K), CODATA 2014.
const BOLTZMANN_SI: f64 = 1.38064852e-23;

/// One femtosecond in ASE time units (`ase.units.fs`).
pub fn fs() -> f64 {
    1e-15 * 1e10 * (ELEMENTARY_CHARGE / ATOMIC_MASS_UNIT).sqrt()
}

/// Boltzmann constant in eV/K (`ase.units.kB`).
pub fn boltzmann() -> f64 {
    BOLTZMANN_SI / ELEMENTARY_CHARGE
}

/// One GPa in eV/Å³ (`ase.units.GPa`).
pub fn gpa() -> f64 {
    // ASE's order of operations: Pascal = (1/e)/1e30, GPa = 1e9·Pascal.
    1e9 * ((1.0 / ELEMENTARY_CHARGE) / 1e30)
}
