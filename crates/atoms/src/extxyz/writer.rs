//! Extended XYZ writer whose output ASE (and this crate's reader) read back
//! bit-exactly: floats use Rust's shortest round-trip representation.

use super::comment::{classify_value, is_valid_json, json_string, quote};
use super::XyzError;
use crate::elements;
use crate::{Column, InfoValue, System};
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Comment keys the writer produces itself from the system's fields.
const RESERVED_INFO_KEYS: [&str; 3] = ["Lattice", "Properties", "pbc"];
/// Column names the writer produces itself from numbers and positions.
const RESERVED_COLUMNS: [&str; 3] = ["species", "pos", "Z"];
/// Bytes buffered before handing them to the underlying writer.
const FLUSH_BYTES: usize = 1 << 20;

/// Writes `frames` as extended XYZ: per frame the atom count, a comment line
/// (`Lattice` when there is a cell, `Properties`, every `info` key, `pbc`),
/// then `species pos` and the `arrays` columns in name order.
///
/// `stress` given as 6 Voigt numbers is written as the 9 numbers of the full
/// 3×3 matrix, as ASE does. Errors (before anything of the offending frame is
/// written) when a system cannot be read back: lengths that disagree,
/// non-finite positions, unknown atomic numbers, reserved or malformed names,
/// string column values that are empty or contain whitespace, integer column
/// values outside the 32-bit range (ASE parses `I` columns as `int32`).
pub fn write_frames<W: Write>(mut writer: W, frames: &[System]) -> Result<(), XyzError> {
    let io_error = |source| XyzError::Io { file: None, source };
    let mut buf: Vec<u8> = Vec::with_capacity(FLUSH_BYTES + 4096);
    for (frame, system) in frames.iter().enumerate() {
        let comment = comment_line(system).map_err(|reason| XyzError::Write {
            file: None,
            frame,
            reason,
        })?;
        let columns = checked_columns(system).map_err(|reason| XyzError::Write {
            file: None,
            frame,
            reason,
        })?;
        let symbols = symbols(system).map_err(|reason| XyzError::Write {
            file: None,
            frame,
            reason,
        })?;

        // Writing into a Vec cannot fail; the results are io::Result only by signature.
        let _ = writeln!(buf, "{}", system.len());
        let _ = writeln!(buf, "{comment}");
        for (atom, (symbol, p)) in symbols.iter().zip(&system.positions).enumerate() {
            let _ = write!(buf, "{symbol} {:?} {:?} {:?}", p[0], p[1], p[2]);
            for (_, column) in &columns {
                write_row(&mut buf, column, atom);
            }
            buf.push(b'\n');
            if buf.len() >= FLUSH_BYTES {
                writer.write_all(&buf).map_err(io_error)?;
                buf.clear();
            }
        }
    }
    writer.write_all(&buf).map_err(io_error)?;
    writer.flush().map_err(io_error)
}

/// Writes `frames` to a new file at `path` (see [`write_frames`]); errors name the file.
pub fn write_file(path: impl AsRef<Path>, frames: &[System]) -> Result<(), XyzError> {
    let path = path.as_ref();
    let file = File::create(path).map_err(|source| XyzError::Io {
        file: Some(path.to_path_buf()),
        source,
    })?;
    write_frames(file, frames).map_err(|e| e.with_file(path))
}

/// `frames` as extended XYZ text (see [`write_frames`]).
pub fn write_string(frames: &[System]) -> Result<String, XyzError> {
    let mut bytes = Vec::new();
    write_frames(&mut bytes, frames)?;
    // Everything written is built from `str`s, so it is valid UTF-8.
    String::from_utf8(bytes).map_err(|e| XyzError::Io {
        file: None,
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

fn symbols(system: &System) -> Result<Vec<&'static str>, String> {
    if system.positions.len() != system.numbers.len() {
        return Err(format!(
            "{} positions but {} atomic numbers",
            system.positions.len(),
            system.numbers.len()
        ));
    }
    if let Some((atom, p)) = system
        .positions
        .iter()
        .enumerate()
        .find(|(_, p)| p.iter().any(|x| !x.is_finite()))
    {
        return Err(format!("atom index {atom} has a non-finite position {p:?}"));
    }
    system
        .numbers
        .iter()
        .enumerate()
        .map(|(atom, &z)| {
            elements::symbol(z).ok_or_else(|| {
                format!("atom index {atom} has atomic number {z}, not in the element table")
            })
        })
        .collect()
}

fn checked_columns(system: &System) -> Result<Vec<(&str, &Column)>, String> {
    let n = system.len();
    let mut out = Vec::with_capacity(system.properties.arrays.len());
    for (name, column) in &system.properties.arrays {
        check_column_name(name)?;
        let (len, width) = column_shape(column);
        if width == 0 {
            return Err(format!("column `{name}` has width 0"));
        }
        if Some(len) != n.checked_mul(width) {
            return Err(format!(
                "column `{name}` has {len} values, expected {n} atoms × width {width}"
            ));
        }
        if let Column::Int(values, _) = column {
            if let Some(bad) = values.iter().find(|&&i| i32::try_from(i).is_err()) {
                return Err(format!(
                    "column `{name}` has the value {bad}; ASE reads I columns as 32-bit integers"
                ));
            }
        }
        if let Column::Str(values, _) = column {
            if let Some(bad) = values
                .iter()
                .find(|s| s.is_empty() || s.chars().any(char::is_whitespace))
            {
                return Err(format!(
                    "column `{name}` has the value {bad:?}; string column values must be non-empty without whitespace"
                ));
            }
        }
        out.push((name.as_str(), column));
    }
    Ok(out)
}

fn check_column_name(name: &str) -> Result<(), String> {
    if RESERVED_COLUMNS.contains(&name) {
        return Err(format!(
            "column name `{name}` is reserved (species, positions and Z are written from the system itself)"
        ));
    }
    let bad_char = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(
                c,
                ':' | '"' | '\'' | '{' | '}' | '[' | ']' | '=' | '\\' | ','
            )
    };
    if name.is_empty() || name.chars().any(bad_char) {
        return Err(format!(
            "column name {name:?} cannot appear in Properties (no whitespace, quotes, brackets, `:`, `=`, `,` or `\\`)"
        ));
    }
    Ok(())
}

fn column_shape(column: &Column) -> (usize, usize) {
    match column {
        Column::Str(v, w) => (v.len(), *w),
        Column::Int(v, w) => (v.len(), *w),
        Column::Float(v, w) => (v.len(), *w),
        Column::Bool(v, w) => (v.len(), *w),
    }
}

fn column_type(column: &Column) -> char {
    match column {
        Column::Str(..) => 'S',
        Column::Int(..) => 'I',
        Column::Float(..) => 'R',
        Column::Bool(..) => 'L',
    }
}

fn write_row(buf: &mut Vec<u8>, column: &Column, atom: usize) {
    match column {
        Column::Float(v, w) => v[atom * w..(atom + 1) * w].iter().for_each(|x| {
            let _ = write!(buf, " {x:?}");
        }),
        Column::Int(v, w) => v[atom * w..(atom + 1) * w].iter().for_each(|i| {
            let _ = write!(buf, " {i}");
        }),
        Column::Bool(v, w) => v[atom * w..(atom + 1) * w]
            .iter()
            .for_each(|&b| buf.extend_from_slice(if b { b" T" } else { b" F" })),
        Column::Str(v, w) => v[atom * w..(atom + 1) * w].iter().for_each(|s| {
            buf.push(b' ');
            buf.extend_from_slice(s.as_bytes());
        }),
    }
}

fn comment_line(system: &System) -> Result<String, String> {
    let mut line = String::new();
    if let Some(cell) = &system.cell {
        let values: Vec<String> = cell
            .matrix
            .iter()
            .flatten()
            .map(|x| format!("{x:?}"))
            .collect();
        let _ = write!(line, "Lattice=\"{}\" ", values.join(" "));
    }
    line.push_str("Properties=species:S:1:pos:R:3");
    for (name, column) in &system.properties.arrays {
        let _ = write!(
            line,
            ":{name}:{}:{}",
            column_type(column),
            column_shape(column).1
        );
    }
    for (key, value) in &system.properties.info {
        if RESERVED_INFO_KEYS.contains(&key.as_str()) {
            return Err(format!("info key `{key}` is reserved (it is written from the system's cell / columns / pbc)"));
        }
        if key.is_empty() || key.chars().any(char::is_control) {
            return Err(format!(
                "info key {key:?} is empty or contains control characters"
            ));
        }
        let value = special_matrix(key, value)?;
        let _ = write!(line, " {}={}", quote(key), format_info_value(key, &value));
    }
    let flag = |p: bool| if p { 'T' } else { 'F' };
    let _ = write!(
        line,
        " pbc=\"{} {} {}\"",
        flag(system.pbc[0]),
        flag(system.pbc[1]),
        flag(system.pbc[2])
    );
    Ok(line)
}

/// ASE insists that `stress` and `virial` are 9 numbers (a 3×3 matrix in
/// Fortran order); a 6-number Voigt stress is expanded like ASE's
/// `voigt_6_to_full_3x3_stress`.
fn special_matrix(key: &str, value: &InfoValue) -> Result<InfoValue, String> {
    if key != "stress" && key != "virial" {
        return Ok(value.clone());
    }
    let len = match value {
        InfoValue::FloatArray(v) => v.len(),
        InfoValue::IntArray(v) => v.len(),
        _ => 0,
    };
    match (value, len) {
        (_, 9) => Ok(value.clone()),
        (InfoValue::FloatArray(v), 6) if key == "stress" => {
            let (xx, yy, zz, yz, xz, xy) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            Ok(InfoValue::FloatArray(vec![
                xx, xy, xz, xy, yy, yz, xz, yz, zz,
            ]))
        }
        (InfoValue::IntArray(v), 6) if key == "stress" => {
            let (xx, yy, zz, yz, xz, xy) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            Ok(InfoValue::IntArray(vec![
                xx, xy, xz, xy, yy, yz, xz, yz, zz,
            ]))
        }
        _ => Err(format!(
            "info `{key}` must be 9 numbers (3×3 matrix){}; ASE cannot read anything else",
            if key == "stress" {
                " or 6 Voigt numbers"
            } else {
                ""
            }
        )),
    }
}

/// One info value as comment-line text that ASE's and this crate's parser
/// type back to the same value. Scalars and arrays of two or more use the
/// plain forms; forms the plain syntax cannot distinguish (one-element or
/// empty arrays, strings that look like numbers or booleans, strings with
/// control characters) use ASE's `_JSON ` form.
fn format_info_value(key: &str, value: &InfoValue) -> String {
    match value {
        InfoValue::Int(i) => i.to_string(),
        InfoValue::Float(x) => format!("{x:?}"),
        InfoValue::Bool(b) => (if *b { "T" } else { "F" }).to_string(),
        InfoValue::IntArray(v) => match v.len() {
            // A quoted blank: ASE's tokeniser would join an empty `""` with
            // the next pair, but a blank value has zero tokens, an empty int array.
            0 => "\" \"".to_string(),
            1 => quote(&format!("_JSON [{}]", v[0])),
            _ => quote(&join(v.iter().map(|i| i.to_string()))),
        },
        InfoValue::FloatArray(v) => match v.len() {
            0 | 1 => quote(&format!(
                "_JSON [{}]",
                join_with(v.iter().map(|&x| json_float(x)), ", ")
            )),
            _ => quote(&join(v.iter().map(|x| format!("{x:?}")))),
        },
        InfoValue::BoolArray(v) => match v.len() {
            // An empty list reads back as an empty float array, in ASE too.
            0 | 1 => quote(&format!(
                "_JSON [{}]",
                join_with(v.iter().map(|b| b.to_string()), ", ")
            )),
            _ => quote(&join(v.iter().map(|&b| {
                if b {
                    "T".to_string()
                } else {
                    "F".to_string()
                }
            }))),
        },
        InfoValue::Str(s) => {
            // A `_JSON ` string left undecoded by the reader (an object, a
            // nested list) goes back verbatim so ASE decodes it again; one that
            // is not JSON at all would make ASE fail, so it is wrapped instead.
            let json_ok = match s.strip_prefix("_JSON ") {
                Some(json) => is_valid_json(json),
                None => true,
            };
            let plain = json_ok
                && !s.chars().any(char::is_control)
                && classify_value(key, s) == InfoValue::Str(s.clone());
            if plain {
                quote(s)
            } else {
                quote(&format!("_JSON {}", json_string(s)))
            }
        }
    }
}

/// Shortest round-trip float in the spelling Python's `json` module reads.
fn json_float(x: f64) -> String {
    if x.is_nan() {
        "NaN".to_string()
    } else if x.is_infinite() {
        (if x > 0.0 { "Infinity" } else { "-Infinity" }).to_string()
    } else {
        format!("{x:?}")
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    join_with(items, " ")
}

fn join_with(items: impl Iterator<Item = String>, sep: &str) -> String {
    items.collect::<Vec<_>>().join(sep)
}
