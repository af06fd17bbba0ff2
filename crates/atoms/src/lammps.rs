//! LAMMPS data files (read): `atom_style atomic` (`id type x y z`) and
//! `charge` (`id type q x y z`), orthogonal and triclinic boxes, optional
//! image flags. Elements come from the `Masses` section (the element whose
//! standard mass is within 0.05 u of each type's mass), so the file must
//! have one, as `ase.io.write(..., format="lammps-data", masses=True)`
//! writes. Atoms are returned in order of their ids; charges go to the
//! `initial_charges` column. The box is periodic on all axes.

use crate::properties::Column;
use crate::{elements, Cell, System};
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
        let z = (1..=118u32)
            .filter_map(|z| elements::mass(z).map(|mz| (z, (mz - m).abs())))
            .filter(|&(_, d)| d < 0.05)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(z, _)| z)
            .ok_or_else(|| {
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
