//! LAMMPS data files, read and written: `atom_style atomic`
//! (`id type x y z`) and `charge` (`id type q x y z`), orthogonal and
//! triclinic boxes, optional image flags (read). Lengths are in Å (LAMMPS
//! `units metal` / `real`).
//!
//! Read: elements come from the `Masses` section (the element whose
//! standard mass is within 0.05 u of each type's mass), so the file must
//! have one, as `ase.io.write(..., format="lammps-data", masses=True)`
//! writes. Atoms are returned in order of their ids; charges go to the
//! `initial_charges` column. The box is periodic on all axes.
//!
//! Written ([`write_string`]): LAMMPS's restricted triclinic form, so the
//! cell is turned into `a = (lx, 0, 0)`, `b = (xy, ly, 0)`, `c = (xz, yz, lz)`
//! with the same lengths and angles, and the positions keep their
//! fractional coordinates (a rotation, as ASE's writer does; a left-handed
//! cell also gets a reflection). A data file holds only positions, types,
//! charges and the box: pbc (LAMMPS's `boundary` command), energies, forces
//! and other properties are not written.

use crate::properties::Column;
use crate::{elements, Cell, System};
use std::fmt::Write as _;
use thiserror::Error;

/// Why a LAMMPS data file could not be read.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("line {line}: {what}")]
pub struct LammpsError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub what: String,
}

fn err(line: usize, what: impl Into<String>) -> LammpsError {
    LammpsError {
        line,
        what: what.into(),
    }
}

fn number(word: Option<&str>, line: usize) -> Result<f64, LammpsError> {
    let w = word.ok_or_else(|| err(line, "a number is missing"))?;
    w.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| err(line, format!("`{w}` is not a finite number")))
}

/// Reads a LAMMPS data file.
pub fn read_str(text: &str) -> Result<System, LammpsError> {
    let lines: Vec<&str> = text.lines().collect();
    let (mut n_atoms, mut n_types) = (None, None);
    let mut lo_hi = [[0.0, 0.0]; 3];
    let mut tilt = [0.0; 3]; // xy xz yz
    let mut k = 1; // the first line is a comment
                   // Header: until the first section keyword.
    while k < lines.len() {
        let l = lines[k].split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            k += 1;
            continue;
        }
        let words: Vec<&str> = l.split_whitespace().collect();
        let tail = words[1..].join(" ");
        if words.len() >= 2 && tail == "atoms" {
            n_atoms = Some(
                words[0]
                    .parse::<usize>()
                    .map_err(|_| err(k + 1, "bad atom count"))?,
            );
        } else if words.len() >= 3 && tail == "atom types" {
            n_types = Some(
                words[0]
                    .parse::<usize>()
                    .map_err(|_| err(k + 1, "bad type count"))?,
            );
        } else if words.len() == 4 && words[2].ends_with("lo") {
            let axis = match words[2] {
                "xlo" => 0,
                "ylo" => 1,
                "zlo" => 2,
                _ => return Err(err(k + 1, format!("unknown bounds `{l}`"))),
            };
            lo_hi[axis] = [
                number(words.first().copied(), k + 1)?,
                number(words.get(1).copied(), k + 1)?,
            ];
        } else if words.len() == 6 && words[3] == "xy" {
            for (t, w) in tilt.iter_mut().zip(&words[..3]) {
                *t = number(Some(w), k + 1)?;
            }
        } else if words[0]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
        {
            break; // a section
        }
        k += 1;
    }
    let n_atoms = n_atoms.ok_or_else(|| err(k, "no `N atoms` line in the header"))?;
    let n_types = n_types.ok_or_else(|| err(k, "no `N atom types` line in the header"))?;
    if n_atoms > lines.len() || n_types > lines.len() {
        return Err(err(k, "more atoms or types than the file has lines"));
    }
    let mut masses: Vec<Option<f64>> = vec![None; n_types];
    let mut atoms: Vec<(u64, usize, f64, [f64; 3])> = Vec::with_capacity(n_atoms);
    let mut charge_style = false;
    while k < lines.len() {
        let header = lines[k];
        let name = header.split('#').next().unwrap_or("").trim();
        let style = header.split('#').nth(1).map(str::trim).unwrap_or("");
        k += 1;
        if name.is_empty() {
            continue;
        }
        let count = match name {
            "Masses" => n_types,
            "Atoms" => n_atoms,
            _ => {
                // Skip another section: up to the next line starting with a letter.
                while k < lines.len()
                    && !lines[k]
                        .trim_start()
                        .starts_with(|c: char| c.is_ascii_alphabetic())
                {
                    k += 1;
                }
                continue;
            }
        };
        let mut rows = Vec::with_capacity(count);
        while rows.len() < count {
            let line = *lines
                .get(k)
                .ok_or_else(|| err(k + 1, format!("section {name} ends early")))?;
            let body = line.split('#').next().unwrap_or("").trim();
            k += 1;
            if !body.is_empty() {
                rows.push((k, body));
            }
        }
        if name == "Masses" {
            for (at, body) in rows {
                let mut w = body.split_whitespace();
                let t = w
                    .next()
                    .and_then(|t| t.parse::<usize>().ok())
                    .filter(|&t| t >= 1 && t <= n_types);
                let t = t.ok_or_else(|| err(at, "bad atom type"))?;
                masses[t - 1] = Some(number(w.next(), at)?);
            }
        } else {
            for (at, body) in rows {
                let w: Vec<&str> = body.split_whitespace().collect();
                charge_style = match style {
                    "charge" => true,
                    "atomic" => false,
                    // Unlabelled: 5 or 8 columns are atomic, 6 or 9 charge.
                    _ => matches!(w.len(), 6 | 9),
                };
                let first = if charge_style { 3 } else { 2 };
                if w.len() < first + 3 {
                    return Err(err(at, format!("expected {} columns", first + 3)));
                }
                let id = w[0].parse::<u64>().map_err(|_| err(at, "bad atom id"))?;
                let t = w[1]
                    .parse::<usize>()
                    .ok()
                    .filter(|&t| t >= 1 && t <= n_types);
                let t = t.ok_or_else(|| err(at, "bad atom type"))?;
                let q = if charge_style {
                    number(Some(w[2]), at)?
                } else {
                    0.0
                };
                let p = [
                    number(Some(w[first]), at)?,
                    number(Some(w[first + 1]), at)?,
                    number(Some(w[first + 2]), at)?,
                ];
                atoms.push((id, t, q, p));
            }
        }
    }
    if atoms.len() != n_atoms {
        return Err(err(
            lines.len(),
            format!("{n_atoms} atoms declared, {} found", atoms.len()),
        ));
    }
    let mut species = Vec::with_capacity(n_types);
    for (t, m) in masses.iter().enumerate() {
        let m = m.ok_or_else(|| {
            err(
                lines.len(),
                format!(
                    "atom type {} has no mass: a Masses section names the elements",
                    t + 1
                ),
            )
        })?;
        let z = element_of_mass(m).ok_or_else(|| {
            err(
                lines.len(),
                format!("no element has the mass {m} of type {}", t + 1),
            )
        })?;
        species.push(z);
    }
    atoms.sort_by_key(|a| a.0);
    let cell = Cell::new([
        [lo_hi[0][1] - lo_hi[0][0], 0.0, 0.0],
        [tilt[0], lo_hi[1][1] - lo_hi[1][0], 0.0],
        [tilt[1], tilt[2], lo_hi[2][1] - lo_hi[2][0]],
    ]);
    let positions = atoms.iter().map(|a| a.3).collect();
    let numbers = atoms.iter().map(|a| species[a.1 - 1]).collect();
    let mut system = System::new(positions, numbers, Some(cell), [true; 3]);
    if charge_style {
        system.properties.arrays.insert(
            "initial_charges".to_string(),
            Column::Float(atoms.iter().map(|a| a.2).collect(), 1),
        );
    }
    Ok(system)
}

/// The element whose standard mass is nearest `mass` (u), if within 0.05 u.
fn element_of_mass(mass: f64) -> Option<u32> {
    (1..=118u32)
        .filter_map(|z| elements::mass(z).map(|mz| (z, (mz - mass).abs())))
        .filter(|&(_, d)| d < 0.05)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(z, _)| z)
}

/// Why a system cannot be written as a LAMMPS data file.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum LammpsWriteError {
    /// LAMMPS needs a box.
    #[error("the system has no cell; a LAMMPS data file needs a box")]
    NoCell,
    /// The cell cannot be a LAMMPS box.
    #[error("the cell is singular or not finite: {0}")]
    BadCell(#[from] crate::CellError),
    /// A position is NaN or infinite.
    #[error("atom {0} has a non-finite position")]
    NonFinitePosition(usize),
    /// The `Masses` section could not name this element on reading.
    #[error("atomic number {0} has no element mass that identifies it")]
    UnknownElement(u32),
    /// `initial_charges` is not one finite float per atom.
    #[error("initial_charges must be one finite float per atom to write atom_style charge")]
    BadCharges,
}

/// LAMMPS's restricted triclinic form of `cell`: the lower-triangular
/// matrix with positive diagonal (`[[lx,0,0],[xy,ly,0],[xz,yz,lz]]`) whose
/// lattice vectors have the lengths and mutual angles of `cell`'s.
pub fn restricted_triclinic(cell: &Cell) -> Result<Cell, crate::CellError> {
    cell.validate([true; 3])?;
    let [a, b, c] = cell.matrix;
    let dot = |u: [f64; 3], v: [f64; 3]| u[0] * v[0] + u[1] * v[1] + u[2] * v[2];
    let lx = dot(a, a).sqrt();
    let xy = dot(a, b) / lx;
    let xz = dot(a, c) / lx;
    // |a × b| / |a| and the volume / area keep precision for nearly flat cells.
    let ab = [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ];
    let ly = dot(ab, ab).sqrt() / lx;
    let yz = (dot(b, c) - xy * xz) / ly;
    let lz = cell.volume() / (lx * ly);
    Ok(Cell::new([[lx, 0.0, 0.0], [xy, ly, 0.0], [xz, yz, lz]]))
}

/// The LAMMPS data file of `system` (see the module docs): `atom_style
/// charge` when it has an `initial_charges` column, else `atomic`; one atom
/// type per element in increasing atomic number, each with its standard
/// mass in `Masses`; the box from the origin, tilt factors only when the
/// cell is not orthogonal.
pub fn write_string(system: &System) -> Result<String, LammpsWriteError> {
    let cell = system.cell.ok_or(LammpsWriteError::NoCell)?;
    let lammps_cell = restricted_triclinic(&cell)?;
    let inverse = cell.inverse()?;
    let charges = match system.properties.arrays.get("initial_charges") {
        None => None,
        Some(Column::Float(q, 1))
            if q.len() == system.positions.len() && q.iter().all(|x| x.is_finite()) =>
        {
            Some(q)
        }
        Some(_) => return Err(LammpsWriteError::BadCharges),
    };
    let mut species: Vec<u32> = system.numbers.clone();
    species.sort_unstable();
    species.dedup();
    for &z in &species {
        let identified = elements::mass(z).and_then(element_of_mass);
        if identified != Some(z) {
            return Err(LammpsWriteError::UnknownElement(z));
        }
    }
    let m = lammps_cell.matrix;
    let mut out = String::new();
    let _ = writeln!(out, "LAMMPS data file written by ddmlip\n");
    let _ = writeln!(out, "{} atoms", system.positions.len());
    let _ = writeln!(out, "{} atom types\n", species.len());
    for (k, axis) in ["x", "y", "z"].iter().enumerate() {
        let _ = writeln!(out, "0.0 {:.17e} {axis}lo {axis}hi", m[k][k]);
    }
    let (xy, xz, yz) = (m[1][0], m[2][0], m[2][1]);
    if xy != 0.0 || xz != 0.0 || yz != 0.0 {
        let _ = writeln!(out, "{xy:.17e} {xz:.17e} {yz:.17e} xy xz yz");
    }
    let _ = writeln!(out, "\nMasses\n");
    for (t, &z) in species.iter().enumerate() {
        // Checked above: every written element has a mass and a symbol.
        let mass = elements::mass(z).unwrap_or_default();
        let symbol = elements::symbol(z).unwrap_or_default();
        let _ = writeln!(out, "{} {mass} # {symbol}", t + 1);
    }
    let style = if charges.is_some() {
        "charge"
    } else {
        "atomic"
    };
    let _ = writeln!(out, "\nAtoms # {style}\n");
    for (i, (p, z)) in system.positions.iter().zip(&system.numbers).enumerate() {
        if p.iter().any(|x| !x.is_finite()) {
            return Err(LammpsWriteError::NonFinitePosition(i));
        }
        let t = species.partition_point(|s| s < z) + 1;
        let frac = [0, 1, 2].map(|j| (0..3).map(|k| p[k] * inverse[k][j]).sum::<f64>());
        let q = [0, 1, 2].map(|j| (0..3).map(|k| frac[k] * m[k][j]).sum::<f64>());
        let _ = write!(out, "{} {t} ", i + 1);
        if let Some(charges) = charges {
            let _ = write!(out, "{:.17e} ", charges[i]);
        }
        let _ = writeln!(out, "{:.17e} {:.17e} {:.17e}", q[0], q[1], q[2]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_mass_names_its_element() {
        // The writer refuses elements that the reader could not name back;
        // this lists which those are, so the refusal stays rare.
        let unnamed: Vec<u32> = (1..=118)
            .filter(|&z| elements::mass(z).and_then(element_of_mass) != Some(z))
            .collect();
        assert!(unnamed.is_empty(), "{unnamed:?}");
    }
}
