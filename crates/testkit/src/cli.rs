//! Running a workspace binary from its integration tests and reading back
//! what it wrote.

use ddmlip_atoms::{Cell, Column, System};
use std::path::Path;
use std::process::{Command, Output};

/// Runs `bin` (a test's `env!("CARGO_BIN_EXE_…")`) with `args` and returns
/// (exit code, stdout, stderr); the code is −1 when a signal ended it.
/// Output that is not UTF-8 is decoded lossily.
///
/// # Panics
/// When the binary cannot be started.
pub fn run_binary(bin: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A finished command's exit status, stdout and stderr as one text, for
/// assertion messages. Output that is not UTF-8 is decoded lossily.
pub fn output_text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Panics unless `mpirun --version` runs: for the tests that must not be
/// skipped where MPI is missing.
///
/// # Panics
/// When `mpirun` cannot be started or fails.
pub fn require_mpirun() {
    if Command::new("mpirun")
        .arg("--version")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        panic!("mpirun is required for the MPI tests (scripts/ci-setup.sh installs OpenMPI)");
    }
}

/// Writes a periodic structure replicated `reps` times along its cell
/// vectors (the rows of `cell`) to `path` as extended XYZ: each atom's
/// images in turn, the first cell vector's index running fastest.
///
/// # Panics
/// When the file cannot be written.
pub fn write_replicated_xyz(
    path: &Path,
    cell: &[[f64; 3]; 3],
    positions: &[[f64; 3]],
    symbols: &[&str],
    reps: [usize; 3],
) {
    let images = reps[0] * reps[1] * reps[2];
    let mut lines = Vec::new();
    for (p, symbol) in positions.iter().zip(symbols) {
        for i in 0..images {
            let (a, b, c) = (
                i % reps[0],
                (i / reps[0]) % reps[1],
                i / (reps[0] * reps[1]),
            );
            let shift = [0, 1, 2]
                .map(|d| a as f64 * cell[0][d] + b as f64 * cell[1][d] + c as f64 * cell[2][d]);
            lines.push(format!(
                "{} {} {} {}",
                symbol,
                p[0] + shift[0],
                p[1] + shift[1],
                p[2] + shift[2]
            ));
        }
    }
    let lattice: Vec<String> = cell
        .iter()
        .enumerate()
        .flat_map(|(k, row)| row.iter().map(move |x| (reps[k] as f64 * x).to_string()))
        .collect();
    let xyz = format!(
        "{}\nLattice=\"{}\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n{}\n",
        lines.len(),
        lattice.join(" "),
        lines.join("\n")
    );
    std::fs::write(path, xyz).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// A path as the `&str` a command line takes.
///
/// # Panics
/// When the path is not UTF-8 (test paths are).
pub fn path_str(p: &Path) -> &str {
    p.to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", p.display()))
}

/// Every frame of an extended XYZ file.
///
/// # Panics
/// When the file cannot be read or parsed.
pub fn read_xyz(p: &Path) -> Vec<System> {
    ddmlip_atoms::extxyz::read_file(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// The `momenta` column (3 per atom, flat, amu·Å/fs as ASE stores them).
///
/// # Panics
/// When the system has no `momenta` column of width 3.
pub fn momenta(sys: &System) -> Vec<f64> {
    match sys.properties.arrays.get("momenta") {
        Some(Column::Float(v, 3)) => v.clone(),
        other => panic!("no momenta column: {other:?}"),
    }
}

/// Periodic FCC argon (a = 5.3 Å), `cells`³ conventional cells (4·cells³
/// atoms), each coordinate displaced by up to `rattle` Å along a fixed
/// sine/cosine pattern (deterministic, no generator). With `with_momenta`
/// it carries a `momenta` column of the same kind (up to 0.3 per component).
pub fn argon_fcc(cells: usize, rattle: f64, with_momenta: bool) -> System {
    argon_fcc_in(cells, [5.3; 3], rattle, true, with_momenta)
}

/// [`argon_fcc`] with lattice constants `a` (Å, per axis: an orthorhombic
/// cell), and (`periodic` false) as a cluster without a cell.
pub fn argon_fcc_in(
    cells: usize,
    a: [f64; 3],
    rattle: f64,
    periodic: bool,
    with_momenta: bool,
) -> System {
    let basis = [
        [0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0],
        [0.5, 0.0, 0.5],
        [0.0, 0.5, 0.5],
    ];
    let mut pos = Vec::new();
    let mut mom = Vec::new();
    let mut k = 0.0f64;
    for i in 0..cells {
        for j in 0..cells {
            for l in 0..cells {
                for b in basis {
                    k += 1.0;
                    pos.push([
                        (i as f64 + b[0]) * a[0] + rattle * (k * 1.3).sin(),
                        (j as f64 + b[1]) * a[1] + rattle * (k * 2.1).cos(),
                        (l as f64 + b[2]) * a[2] + rattle * (k * 0.7).sin(),
                    ]);
                    mom.extend([
                        0.3 * (k * 0.9).sin(),
                        0.3 * (k * 1.7).cos(),
                        0.3 * (k * 2.9).sin(),
                    ]);
                }
            }
        }
    }
    let n = pos.len();
    let side = a.map(|x| cells as f64 * x);
    let (cell, pbc) = if periodic {
        (
            Some(Cell::orthorhombic(side[0], side[1], side[2])),
            [true; 3],
        )
    } else {
        (None, [false; 3])
    };
    let mut sys = System::new(pos, vec![18; n], cell, pbc);
    if with_momenta {
        sys.properties
            .arrays
            .insert("momenta".into(), Column::Float(mom, 3));
    }
    sys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argon_has_four_atoms_per_cell_inside_a_periodic_box() {
        let sys = argon_fcc(2, 0.05, true);
        assert_eq!(sys.len(), 32);
        assert_eq!(momenta(&sys).len(), 96);
        let cell = sys.cell.as_ref().expect("a cell");
        assert_eq!(cell.matrix[0][0], 10.6);
        // The rattle stays within its amplitude of the ideal sites.
        for p in &sys.positions {
            for x in p {
                let frac = (x / 2.65).round() * 2.65 - x;
                assert!(frac.abs() <= 0.05 + 1e-12, "{x}");
            }
        }
        assert!(!argon_fcc(1, 0.0, false)
            .properties
            .arrays
            .contains_key("momenta"));
    }

    #[test]
    fn run_binary_reports_the_exit_code_and_both_streams() {
        let (code, out, err) = run_binary("sh", &["-c", "echo out; echo err >&2; exit 3"]);
        assert_eq!((code, out.as_str(), err.as_str()), (3, "out\n", "err\n"));
    }
}
