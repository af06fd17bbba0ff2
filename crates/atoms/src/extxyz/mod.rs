//! Extended XYZ reading and writing, interoperable with ASE
//! (`ase.io.read` / `ase.io.write(format="extxyz")`).
//!
//! A frame is: a line with the atom count, a comment line of `key=value`
//! pairs (`Lattice`, `Properties`, `pbc`, and any per-system info such as
//! `energy` or `stress`), then one line per atom with the columns that
//! `Properties` declares (`species:S:1:pos:R:3:forces:R:3:...`). Multi-frame
//! files hold one frame after another and read as a batch.
//!
//! Everything except species, positions, `Z`, `Lattice`, `Properties` and
//! `pbc` is kept in [`crate::Properties`] (comment values in `info`, extra
//! columns in `arrays`, under their file names), so it round-trips.

mod comment;
mod reader;
mod writer;

use std::fmt;
use std::path::{Path, PathBuf};
use thiserror::Error;

pub use reader::{read_file, read_str, FrameReader};
pub use writer::{write_file, write_frames, write_string};

/// Why a line of an extended XYZ input could not be read.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// The first line of a frame is not a non-negative integer.
    #[error("expected the atom count of a frame, found `{found}` (if the previous frame has more atom lines than its count says, its count is wrong)")]
    BadAtomCount {
        /// The line as found.
        found: String,
    },
    /// The input ends inside a frame.
    #[error("truncated frame: the input ends after {found} of {expected} atom lines (is the atom count right?)")]
    Truncated {
        /// Atom lines the count announced.
        expected: usize,
        /// Atom lines present.
        found: usize,
    },
    /// The input ends right after an atom count, before the comment line.
    #[error(
        "truncated frame: the input ends before the comment line of a frame with {expected} atoms"
    )]
    MissingComment {
        /// The frame's atom count.
        expected: usize,
    },
    /// An atom line has fewer whitespace-separated values than `Properties` declares.
    #[error("atom index {atom}: too few columns, Properties declares {expected} but the line has {found} (is the atom count right?)")]
    TooFewColumns {
        /// 0-based atom index in the frame.
        atom: usize,
        /// Columns `Properties` declares.
        expected: usize,
        /// Columns on the line.
        found: usize,
    },
    /// A value does not parse as its column's type.
    #[error("atom index {atom}: column `{column}` expects {expected}, found `{found}`")]
    BadValue {
        /// 0-based atom index in the frame.
        atom: usize,
        /// The column's name in `Properties`.
        column: String,
        /// The column's type, in words.
        expected: &'static str,
        /// The token as found.
        found: String,
    },
    /// A species token that is not an element symbol.
    #[error("atom index {atom}: unknown element symbol `{symbol}`")]
    UnknownElement {
        /// 0-based atom index in the frame.
        atom: usize,
        /// The token as found.
        symbol: String,
    },
    /// A `Z` value outside 0..=118.
    #[error("atom index {atom}: atomic number {z} is not in the element table (0..=118)")]
    UnknownAtomicNumber {
        /// 0-based atom index in the frame.
        atom: usize,
        /// The number as found.
        z: i64,
    },
    /// A position component is NaN or infinite.
    #[error("atom index {atom}: position is not finite ({found})")]
    NonFinitePosition {
        /// 0-based atom index in the frame.
        atom: usize,
        /// The position tokens as found.
        found: String,
    },
    /// `Lattice` is not 9 numbers.
    #[error("bad Lattice: expected 9 numbers (three lattice vectors), found `{found}`")]
    BadLattice {
        /// The `Lattice` value as found.
        found: String,
    },
    /// `pbc` is not one or three booleans.
    #[error("bad pbc: expected three booleans such as \"T T F\", found `{found}`")]
    BadPbc {
        /// The `pbc` value as found.
        found: String,
    },
    /// The `Properties` specification is malformed or lacks a required column.
    #[error("bad Properties `{spec}`: {reason}")]
    BadProperties {
        /// The `Properties` value as found.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A line is not valid UTF-8.
    #[error("line is not valid UTF-8")]
    InvalidUtf8,
}

/// Errors of extended XYZ IO. Parse errors carry the file (when reading a
/// file) and the 1-based line number.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum XyzError {
    /// A line could not be parsed.
    #[error("{}line {line}: {kind}", file_prefix(.file))]
    Parse {
        /// The file, when reading one.
        file: Option<PathBuf>,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        kind: ParseErrorKind,
    },
    /// The input holds no frame at all.
    #[error("{}no frames: the input is empty (an extended XYZ file starts with an atom count line)", file_prefix(.file))]
    Empty {
        /// The file, when reading one.
        file: Option<PathBuf>,
    },
    /// Reading or writing failed at the OS level.
    #[error("{}{source}", file_prefix(.file))]
    Io {
        /// The file, when reading or writing one.
        file: Option<PathBuf>,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A system cannot be written so that ASE (and this reader) read it back.
    #[error("{}frame {frame} (0-based) cannot be written: {reason}", file_prefix(.file))]
    Write {
        /// The file being written, when there is one.
        file: Option<PathBuf>,
        /// 0-based index of the frame.
        frame: usize,
        /// Why, naming the offending property.
        reason: String,
    },
}

impl XyzError {
    /// The 1-based line number of a parse error.
    pub fn line(&self) -> Option<usize> {
        match self {
            XyzError::Parse { line, .. } => Some(*line),
            _ => None,
        }
    }

    /// What was wrong, for a parse error.
    pub fn kind(&self) -> Option<&ParseErrorKind> {
        match self {
            XyzError::Parse { kind, .. } => Some(kind),
            _ => None,
        }
    }

    /// Attaches a file name to an error produced on an anonymous stream.
    pub(crate) fn with_file(mut self, path: &Path) -> Self {
        let slot = match &mut self {
            XyzError::Parse { file, .. }
            | XyzError::Empty { file }
            | XyzError::Io { file, .. }
            | XyzError::Write { file, .. } => file,
        };
        *slot = Some(path.to_path_buf());
        self
    }
}

fn file_prefix(file: &Option<PathBuf>) -> FilePrefix<'_> {
    FilePrefix(file.as_deref())
}

struct FilePrefix<'a>(Option<&'a Path>);

impl fmt::Display for FilePrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(path) => write!(f, "{}: ", path.display()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Column, InfoValue};

    fn parse_error(text: &str) -> (usize, String) {
        let err = read_str(text).expect_err("input should be rejected");
        (err.line().unwrap_or(0), err.to_string())
    }

    fn assert_error(text: &str, line: usize, words: &[&str]) {
        let (got_line, msg) = parse_error(text);
        assert_eq!(got_line, line, "{msg}");
        assert!(msg.starts_with(&format!("line {line}: ")), "{msg}");
        for w in words {
            assert!(msg.contains(w), "`{w}` missing from: {msg}");
        }
    }

    #[test]
    fn plain_xyz_gets_ase_defaults() {
        let frames = read_str("2\nwater-ish molecule\nO 0 0 0\nH 0.5 -1.25 1e-3\n").unwrap();
        assert_eq!(frames.len(), 1);
        let s = &frames[0];
        assert_eq!(s.numbers, vec![8, 1]);
        assert_eq!(s.positions, vec![[0.0, 0.0, 0.0], [0.5, -1.25, 1e-3]]);
        assert_eq!(s.cell, None);
        assert_eq!(s.pbc, [false; 3]);
        // Free text becomes flags, as in ASE.
        assert_eq!(
            s.properties.info.get("molecule"),
            Some(&InfoValue::Bool(true))
        );
    }

    #[test]
    fn lattice_without_pbc_is_periodic_and_pbc_overrides() {
        let text = "1\nLattice=\"2 0 0 0 3 0 0 0 4.5\"\nAr 0 0 0\n1\nLattice=\"2 0 0 0 3 0 0 0 4\" pbc=\"T T F\"\nAr 0 0 0\n1\npbc=T\nAr 0 0 0\n";
        let frames = read_str(text).unwrap();
        assert_eq!(frames[0].pbc, [true; 3]);
        assert_eq!(
            frames[0].cell.unwrap().matrix,
            [[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 4.5]]
        );
        assert_eq!(frames[1].pbc, [true, true, false]);
        assert_eq!(frames[2].pbc, [true; 3]);
        assert_eq!(frames[2].cell, None);
    }

    #[test]
    fn lattice_rows_are_lattice_vectors() {
        let s = &read_str("1\nLattice=\"1 2 3 4 5 6 7 8 10\"\nC 0 0 0\n").unwrap()[0];
        assert_eq!(
            s.cell.unwrap().matrix,
            [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 10.0]]
        );
    }

    #[test]
    fn typed_columns_info_values_and_results() {
        let text = concat!(
            "2\r\n",
            "Properties=species:S:1:pos:R:3:tag:I:1:label:S:1:fixed:L:3:forces:R:3 energy=-3.5 ",
            "stress=\"1 4 6 4 2 5 6 5 3\" name=\"bulk Cu\" n=4 ok=F v={1.5 2} \r\n",
            "Cu 0 0 0 7 a T F True 0.1 0.2 0.3\r\n",
            "cu 1 1 1 -2 b False F T -0.1 -0.2 -0.3 extra ignored\r\n",
        );
        let s = &read_str(text).unwrap()[0];
        assert_eq!(s.numbers, vec![29, 29]);
        let a = &s.properties.arrays;
        assert_eq!(a.get("tag"), Some(&Column::Int(vec![7, -2], 1)));
        assert_eq!(
            a.get("label"),
            Some(&Column::Str(vec!["a".into(), "b".into()], 1))
        );
        assert_eq!(
            a.get("fixed"),
            Some(&Column::Bool(
                vec![true, false, true, false, false, true],
                3
            ))
        );
        assert_eq!(s.forces(), Some(vec![[0.1, 0.2, 0.3], [-0.1, -0.2, -0.3]]));
        assert_eq!(s.energy(), Some(-3.5));
        // Column-major 3x3: [0][1] = 4, [0][2] = 6, [1][2] = 5.
        assert_eq!(s.stress_voigt(), Some([1.0, 2.0, 3.0, 5.0, 6.0, 4.0]));
        let info = &s.properties.info;
        assert_eq!(info.get("name"), Some(&InfoValue::Str("bulk Cu".into())));
        assert_eq!(info.get("n"), Some(&InfoValue::Int(4)));
        assert_eq!(info.get("ok"), Some(&InfoValue::Bool(false)));
        assert_eq!(info.get("v"), Some(&InfoValue::FloatArray(vec![1.5, 2.0])));
        assert!(!info.contains_key("Properties") && !info.contains_key("pbc"));
    }

    #[test]
    fn z_column_alone_or_overridden_by_species() {
        let s = &read_str("2\nProperties=Z:I:1:pos:R:3\n6 0 0 0\n8 1 0 0\n").unwrap()[0];
        assert_eq!(s.numbers, vec![6, 8]);
        assert!(s.properties.arrays.is_empty());
        let s = &read_str("1\nProperties=species:S:1:pos:R:3:Z:I:1\nN 0 0 0 6\n").unwrap()[0];
        assert_eq!(s.numbers, vec![7]);
        assert!(s.properties.arrays.is_empty());
    }

    #[test]
    fn multi_frame_with_blank_lines_between_and_zero_atoms() {
        let text = "1\na=1\nH 0 0 0\n\n  \n0\na=2\n2\n\nHe 0 0 0\nHe 0 0 1\n\n";
        let frames = read_str(text).unwrap();
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[1].len(), 0);
        assert_eq!(frames[1].properties.info.get("a"), Some(&InfoValue::Int(2)));
        assert_eq!(frames[2].numbers, vec![2, 2]);
    }

    #[test]
    fn streaming_reader_stops_after_first_error() {
        let text = "1\n\nH 0 0 0\nbad\n\n";
        let mut reader = FrameReader::new(text.as_bytes());
        assert!(reader.next().unwrap().is_ok());
        let err = reader.next().unwrap().unwrap_err();
        assert_eq!(err.line(), Some(4));
        assert!(reader.next().is_none());
    }

    #[test]
    fn empty_input_is_an_error() {
        for text in ["", "\n\n  \n"] {
            let err = read_str(text).unwrap_err();
            assert!(matches!(err, XyzError::Empty { .. }));
            assert!(err.to_string().contains("no frames"), "{err}");
        }
    }

    #[test]
    fn bad_atom_count() {
        assert_error("two\n\nH 0 0 0\n", 1, &["atom count", "`two`"]);
        assert_error("-1\n\n", 1, &["atom count"]);
        // Count too small: the extra atom line is read as the next count.
        assert_error("1\n\nH 0 0 0\nH 1 0 0\n", 4, &["atom count", "`H 1 0 0`"]);
    }

    #[test]
    fn truncated_frames() {
        assert_error("3\n\nH 0 0 0\nH 1 0 0\n", 5, &["truncated", "2 of 3"]);
        assert_error("3\n", 1, &["truncated", "comment"]);
        // Count too large, followed by another frame: its lines are too short.
        assert_error(
            "2\n\nH 0 0 0\n1\n\nH 0 0 0\n",
            4,
            &["atom index 1", "too few columns", "declares 4", "has 1"],
        );
    }

    #[test]
    fn absurd_counts_and_widths_fail_cleanly() {
        assert_error(
            "99999999999999999\n\nH 0 0 0\n",
            4,
            &["truncated", "1 of 99999999999999999"],
        );
        let wide = "1\nProperties=species:S:1:pos:R:3:x:R:18446744073709551615\nH 0 0 0 1\n";
        assert_error(wide, 3, &["too few columns"]);
    }

    #[test]
    fn too_few_columns_and_non_numeric_values() {
        let props = "Properties=species:S:1:pos:R:3:q:I:1";
        assert_error(
            &format!("2\n{props}\nH 0 0 0 1\nH 0 0\n"),
            4,
            &["atom index 1", "too few columns", "5", "has 3"],
        );
        assert_error(
            &format!("1\n{props}\nH 0 x 0 1\n"),
            3,
            &["atom index 0", "`pos`", "real number", "`x`"],
        );
        assert_error(
            &format!("1\n{props}\nH 0 0 0 1.5\n"),
            3,
            &["`q`", "integer", "`1.5`"],
        );
        assert_error(
            "1\nProperties=species:S:1:pos:R:3:m:L:1\nH 0 0 0 yes\n",
            3,
            &["`m`", "logical", "`yes`"],
        );
    }

    #[test]
    fn unknown_elements() {
        assert_error(
            "2\n\nH 0 0 0\nQq 0 0 0\n",
            4,
            &["atom index 1", "unknown element", "`Qq`"],
        );
        assert_error(
            "1\nProperties=Z:I:1:pos:R:3\n119 0 0 0\n",
            3,
            &["atomic number 119"],
        );
    }

    #[test]
    fn non_finite_positions() {
        assert_error(
            "2\n\nH 0 0 0\nH 0 nan 0\n",
            4,
            &["atom index 1", "not finite"],
        );
        assert_error("1\n\nH inf 0 0\n", 3, &["atom index 0", "not finite"]);
    }

    #[test]
    fn bad_lattice_and_pbc() {
        assert_error(
            "1\nLattice=\"1 0 0 0 1 0 0 0\"\nH 0 0 0\n",
            2,
            &["Lattice", "9 numbers"],
        );
        assert_error(
            "1\nLattice=\"1 0 0 0 1 0 0 0 a\"\nH 0 0 0\n",
            2,
            &["Lattice", "9 numbers"],
        );
        assert_error("1\npbc=\"T T\"\nH 0 0 0\n", 2, &["pbc", "`T T`"]);
    }

    #[test]
    fn bad_properties() {
        let cases: [(&str, &[&str]); 6] = [
            ("species:S:1:pos:R", &["triples"]),
            ("species:S:1:pos:X:3", &["unknown type `X`"]),
            ("species:S:1:pos:R:0", &["width `0`"]),
            ("species:S:1:pos:R:2", &["`pos`", "width 3"]),
            ("species:S:1", &["no `pos`"]),
            ("pos:R:3", &["no `species` or `Z`"]),
        ];
        for (spec, words) in cases {
            let mut all = vec!["bad Properties"];
            all.extend_from_slice(words);
            assert_error(&format!("1\nProperties={spec}\nH 0 0 0\n"), 2, &all);
        }
        assert_error(
            "1\nProperties=species:S:1:pos:R:3:a:R:1:a:I:1\nH 0 0 0 1 1\n",
            2,
            &["twice"],
        );
    }

    #[test]
    fn file_errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("ddmlip-atoms-xyz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broken.xyz");
        std::fs::write(&path, "1\n\nH 0 0\n").unwrap();
        let msg = read_file(&path).unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!("{}: line 3: ", path.display())),
            "{msg}"
        );
        let empty = dir.join("empty.xyz");
        std::fs::write(&empty, "").unwrap();
        let msg = read_file(&empty).unwrap_err().to_string();
        assert!(
            msg.contains("empty.xyz") && msg.contains("no frames"),
            "{msg}"
        );
        let missing = dir.join("missing.xyz");
        let msg = read_file(&missing).unwrap_err().to_string();
        assert!(msg.contains("missing.xyz"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writer_rejects_what_cannot_be_read_back() {
        let ok = crate::System::new(vec![[0.0; 3]], vec![1], None, [false; 3]);
        let mut bad_len = ok.clone();
        bad_len.numbers.push(1);
        let mut nan = ok.clone();
        nan.positions[0][1] = f64::NAN;
        let mut bad_z = ok.clone();
        bad_z.numbers[0] = 200;
        let mut bad_col = ok.clone();
        bad_col
            .properties
            .arrays
            .insert("q".into(), Column::Float(vec![1.0, 2.0], 1));
        let mut spaced = ok.clone();
        spaced
            .properties
            .arrays
            .insert("s".into(), Column::Str(vec!["a b".into()], 1));
        let mut wide_int = ok.clone();
        wide_int
            .properties
            .arrays
            .insert("i".into(), Column::Int(vec![1 << 31], 1));
        let mut reserved = ok.clone();
        reserved
            .properties
            .info
            .insert("pbc".into(), InfoValue::Bool(true));
        let mut bad_stress = ok.clone();
        bad_stress
            .properties
            .info
            .insert("stress".into(), InfoValue::FloatArray(vec![1.0; 4]));
        let cases = [
            (bad_len, "atomic numbers"),
            (nan, "non-finite"),
            (bad_z, "atomic number 200"),
            (bad_col, "expected 1 atoms"),
            (spaced, "whitespace"),
            (wide_int, "32-bit"),
            (reserved, "reserved"),
            (bad_stress, "9 numbers"),
        ];
        for (system, words) in cases {
            let err = write_string(&[ok.clone(), system]).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("frame 1") && msg.contains(words), "{msg}");
        }
    }
}
