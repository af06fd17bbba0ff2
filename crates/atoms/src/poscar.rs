//! VASP POSCAR / CONTCAR: one periodic structure.
//!
//! Read: VASP 5 (element line) and VASP 4 (elements taken from the comment
//! line), a scale factor (negative: the cell volume in Å³) or three per-axis
//! factors, optional `Selective dynamics`, `Direct` or `Cartesian`
//! coordinates; element names may repeat (`Na Cl Na Cl`, as ASE writes
//! unsorted structures). Velocities and other trailing blocks are ignored.
//! Written: VASP 5 with Cartesian coordinates, which ASE and VASP read.

use crate::{elements, Cell, System};
use std::fmt::Write as _;
use thiserror::Error;

/// Why a POSCAR could not be read or written.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum PoscarError {
    /// A line is missing or malformed (1-based line number).
    #[error("line {line}: {what}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is missing or malformed.
        what: String,
    },
    /// The structure cannot be written as a POSCAR.
    #[error("cannot write a POSCAR: {0}")]
    Write(String),
}

fn parse_err(line: usize, what: impl Into<String>) -> PoscarError {
    PoscarError::Parse {
        line,
        what: what.into(),
    }
}

/// Reads the structure of a POSCAR / CONTCAR text.
pub fn read_str(text: &str) -> Result<System, PoscarError> {
    let lines: Vec<&str> = text.lines().collect();
    let line = |k: usize| -> Result<&str, PoscarError> {
        lines
            .get(k)
            .copied()
            .ok_or_else(|| parse_err(k + 1, "the file ends early"))
    };
    let numbers_of = |k: usize, n: usize| -> Result<Vec<f64>, PoscarError> {
        let words: Vec<&str> = line(k)?.split_whitespace().take(n).collect();
        if words.len() < n {
            return Err(parse_err(k + 1, format!("expected {n} numbers")));
        }
        words
            .iter()
            .map(|w| {
                w.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| parse_err(k + 1, format!("`{w}` is not a finite number")))
            })
            .collect()
    };
    let comment = line(0)?;
    let scale_words = line(1)?.split_whitespace().count();
    let scale = numbers_of(1, if scale_words >= 3 { 3 } else { 1 })?;
    let mut matrix = [[0.0; 3]; 3];
    for (k, row) in matrix.iter_mut().enumerate() {
        let v = numbers_of(2 + k, 3)?;
        row.copy_from_slice(&v);
    }
    let factors;
    if scale.len() == 3 {
        if scale.iter().any(|&s| s <= 0.0) {
            return Err(parse_err(2, "per-axis scale factors must be positive"));
        }
        factors = [scale[0], scale[1], scale[2]];
    } else if scale[0] < 0.0 {
        let volume = Cell::new(matrix).volume();
        if volume <= 0.0 {
            return Err(parse_err(3, "the lattice vectors are singular"));
        }
        factors = [(-scale[0] / volume).cbrt(); 3];
    } else if scale[0] > 0.0 {
        factors = [scale[0]; 3];
    } else {
        return Err(parse_err(2, "the scale factor is zero"));
    }
    for row in &mut matrix {
        for (x, f) in row.iter_mut().zip(factors) {
            *x *= f;
        }
    }

    // VASP 5 has an element line before the counts; VASP 4 does not.
    let mut k = 5;
    let is_counts = |l: &str| {
        let mut words = l.split_whitespace().peekable();
        words.peek().is_some() && words.all(|w| w.parse::<usize>().is_ok())
    };
    let names: Vec<String> = if is_counts(line(k)?) {
        comment.split_whitespace().map(str::to_string).collect()
    } else {
        k += 1;
        line(5)?.split_whitespace().map(str::to_string).collect()
    };
    let counts: Vec<usize> = line(k)?
        .split_whitespace()
        .map(|w| {
            w.parse::<usize>()
                .map_err(|_| parse_err(k + 1, format!("`{w}` is not an atom count")))
        })
        .collect::<Result<_, _>>()?;
    if counts.is_empty() || names.len() < counts.len() {
        return Err(parse_err(
            k + 1,
            format!(
                "{} atom counts but {} element names (VASP 4 files need the elements on the first line)",
                counts.len(),
                names.len()
            ),
        ));
    }
    let mut species = Vec::with_capacity(counts.len());
    for (name, _) in names.iter().zip(&counts) {
        // VASP and ASE may decorate names (`Fe_pv`, `Si/`); the element leads.
        let symbol: String = name
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .take(2)
            .collect();
        let z = elements::atomic_number(&symbol)
            .or_else(|| elements::atomic_number(&symbol[..symbol.len().min(1)]))
            .ok_or_else(|| parse_err(k, format!("`{name}` is not an element")))?;
        species.push(z);
    }
    let n_atoms = counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .filter(|&n| n <= lines.len())
        .ok_or_else(|| parse_err(k + 1, "more atoms than the file has lines"))?;
    k += 1;
    if line(k)?.trim_start().starts_with(['S', 's']) {
        k += 1; // Selective dynamics
    }
    let mode = line(k)?.trim_start();
    let cartesian = mode.starts_with(['C', 'c', 'K', 'k']);
    if !cartesian && !mode.starts_with(['D', 'd']) {
        return Err(parse_err(
            k + 1,
            format!("expected `Direct` or `Cartesian`, got `{mode}`"),
        ));
    }
    let cell = Cell::new(matrix);
    let mut positions = Vec::with_capacity(n_atoms);
    for a in 0..n_atoms {
        let v = numbers_of(k + 1 + a, 3)?;
        let p = if cartesian {
            [v[0] * factors[0], v[1] * factors[1], v[2] * factors[2]]
        } else {
            cell.to_cartesian([v[0], v[1], v[2]])
        };
        positions.push(p);
    }
    let numbers = species
        .iter()
        .zip(&counts)
        .flat_map(|(&z, &c)| std::iter::repeat_n(z, c))
        .collect();
    Ok(System::new(positions, numbers, Some(cell), [true; 3]))
}

/// The POSCAR text of `system` (VASP 5, Cartesian, consecutive atoms of one
/// element grouped on the element line). Needs a cell.
pub fn write_string(system: &System) -> Result<String, PoscarError> {
    let cell = system
        .cell
        .ok_or_else(|| PoscarError::Write("the system has no cell".into()))?;
    let mut runs: Vec<(u32, usize)> = Vec::new();
    for &z in &system.numbers {
        match runs.last_mut() {
            Some((last, n)) if *last == z => *n += 1,
            _ => runs.push((z, 1)),
        }
    }
    let names = runs
        .iter()
        .map(|&(z, _)| {
            elements::symbol(z).ok_or_else(|| PoscarError::Write(format!("no element has Z = {z}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = String::new();
    let _ = writeln!(out, "{}", names.join(" "));
    let _ = writeln!(out, "1.0");
    for row in cell.matrix {
        let _ = writeln!(out, " {:.17e} {:.17e} {:.17e}", row[0], row[1], row[2]);
    }
    let _ = writeln!(out, "{}", names.join(" "));
    let counts: Vec<String> = runs.iter().map(|(_, n)| n.to_string()).collect();
    let _ = writeln!(out, "{}", counts.join(" "));
    let _ = writeln!(out, "Cartesian");
    for p in &system.positions {
        let _ = writeln!(out, " {:.17e} {:.17e} {:.17e}", p[0], p[1], p[2]);
    }
    Ok(out)
}
