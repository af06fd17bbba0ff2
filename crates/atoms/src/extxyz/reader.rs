//! Streaming extended XYZ reader.

use super::comment::{classify_value, split_pairs};
use super::{ParseErrorKind, XyzError};
use crate::elements;
use crate::{Cell, Column, InfoValue, Properties, System};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// `Properties` when the comment line has none (plain XYZ), as in ASE.
const DEFAULT_PROPERTIES: &str = "species:S:1:pos:R:3";

/// Upper bound on rows reserved up front from a frame's declared atom count,
/// so that a corrupt count cannot trigger a huge allocation before any atom
/// line is read; vectors still grow past it as lines arrive.
const MAX_RESERVED_ROWS: usize = 1 << 20;

/// Reads frames one at a time from a buffered stream, so that large
/// multi-frame files need memory for one frame only.
///
/// Yields `Ok(System)` per frame. Yields one `Err` and then stops at the
/// first malformed frame; an input without any frame yields
/// [`XyzError::Empty`]. Blank lines between frames are skipped.
pub struct FrameReader<R: BufRead> {
    input: R,
    file: Option<PathBuf>,
    /// Lines consumed so far (the 1-based number of the line in `line`).
    line_number: usize,
    /// The current line, without its line terminator.
    line: Vec<u8>,
    frames_read: usize,
    finished: bool,
    species_cache: SpeciesCache,
}

impl FrameReader<BufReader<File>> {
    /// Opens `path` for streaming; errors name the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, XyzError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| XyzError::Io {
            file: Some(path.to_path_buf()),
            source,
        })?;
        Ok(Self::with_file_name(
            BufReader::with_capacity(1 << 16, file),
            path,
        ))
    }
}

impl<R: BufRead> FrameReader<R> {
    /// A reader over an anonymous stream (errors carry line numbers only).
    pub fn new(input: R) -> Self {
        Self {
            input,
            file: None,
            line_number: 0,
            line: Vec::new(),
            frames_read: 0,
            finished: false,
            species_cache: SpeciesCache::default(),
        }
    }

    /// A reader whose errors name `file`.
    pub fn with_file_name(input: R, file: impl AsRef<Path>) -> Self {
        let mut reader = Self::new(input);
        reader.file = Some(file.as_ref().to_path_buf());
        reader
    }

    /// Number of lines consumed so far.
    pub fn line_number(&self) -> usize {
        self.line_number
    }

    fn error(&self, line: usize, kind: ParseErrorKind) -> XyzError {
        XyzError::Parse {
            file: self.file.clone(),
            line,
            kind,
        }
    }

    /// Reads the next line into `self.line`; false at end of input.
    fn next_line(&mut self) -> Result<bool, XyzError> {
        self.line.clear();
        let n = self
            .input
            .read_until(b'\n', &mut self.line)
            .map_err(|source| XyzError::Io {
                file: self.file.clone(),
                source,
            })?;
        if n == 0 {
            return Ok(false);
        }
        self.line_number += 1;
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
        }
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        Ok(true)
    }

    fn line_str(&self) -> Result<&str, XyzError> {
        std::str::from_utf8(&self.line)
            .map_err(|_| self.error(self.line_number, ParseErrorKind::InvalidUtf8))
    }

    fn read_frame(&mut self) -> Result<Option<System>, XyzError> {
        loop {
            if !self.next_line()? {
                return Ok(None);
            }
            if !self.line.iter().all(u8::is_ascii_whitespace) {
                break;
            }
        }
        let count_line = self.line_number;
        let count_text = self.line_str()?.trim();
        let n_atoms: usize = count_text.parse().map_err(|_| {
            self.error(
                count_line,
                ParseErrorKind::BadAtomCount {
                    found: abbreviate(count_text),
                },
            )
        })?;

        if !self.next_line()? {
            return Err(self.error(
                count_line,
                ParseErrorKind::MissingComment { expected: n_atoms },
            ));
        }
        let comment_line = self.line_number;
        let header =
            parse_header(self.line_str()?).map_err(|kind| self.error(comment_line, kind))?;

        let mut frame = FrameBuilder::new(&header.columns, n_atoms);
        for atom in 0..n_atoms {
            if !self.next_line()? {
                let kind = ParseErrorKind::Truncated {
                    expected: n_atoms,
                    found: atom,
                };
                return Err(self.error(self.line_number + 1, kind));
            }
            frame
                .push_line(&self.line, atom, &mut self.species_cache)
                .map_err(|kind| self.error(self.line_number, kind))?;
        }
        Ok(Some(frame.finish(header)))
    }
}

impl<R: BufRead> Iterator for FrameReader<R> {
    type Item = Result<System, XyzError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        match self.read_frame() {
            Ok(Some(system)) => {
                self.frames_read += 1;
                Some(Ok(system))
            }
            Ok(None) => {
                self.finished = true;
                (self.frames_read == 0).then(|| {
                    Err(XyzError::Empty {
                        file: self.file.clone(),
                    })
                })
            }
            Err(e) => {
                self.finished = true;
                Some(Err(e))
            }
        }
    }
}

/// Reads every frame of an extended XYZ file (a batch). Errors name the file
/// and the 1-based line; a file without frames is [`XyzError::Empty`].
pub fn read_file(path: impl AsRef<Path>) -> Result<Vec<System>, XyzError> {
    FrameReader::open(path)?.collect()
}

/// Reads every frame of extended XYZ text.
pub fn read_str(text: &str) -> Result<Vec<System>, XyzError> {
    FrameReader::new(text.as_bytes()).collect()
}

/// Keeps messages short when a whole atom line lands where a count was expected.
fn abbreviate(text: &str) -> String {
    const MAX: usize = 60;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ColumnType {
    Str,
    Real,
    Int,
    Bool,
}

impl ColumnType {
    fn describe(self) -> &'static str {
        match self {
            ColumnType::Str => "a string",
            ColumnType::Real => "a real number",
            ColumnType::Int => "an integer",
            ColumnType::Bool => "a logical (T, F, True or False)",
        }
    }
}

#[derive(Debug, Clone)]
struct ColumnSpec {
    name: String,
    ty: ColumnType,
    width: usize,
}

/// What the comment line says about a frame.
struct Header {
    cell: Option<Cell>,
    pbc: [bool; 3],
    columns: Vec<ColumnSpec>,
    info: BTreeMap<String, InfoValue>,
}

fn parse_header(comment: &str) -> Result<Header, ParseErrorKind> {
    let mut info = BTreeMap::new();
    let mut lattice = None;
    let mut properties = None;
    let mut pbc_value = None;
    for (key, raw) in split_pairs(comment) {
        match key.as_str() {
            "Lattice" => lattice = Some(raw),
            "Properties" => properties = Some(raw),
            "pbc" => pbc_value = Some(raw),
            _ => {
                let value = classify_value(&key, &raw);
                info.insert(key, value);
            }
        }
    }

    let cell = lattice.map(|raw| parse_lattice(&raw)).transpose()?;
    let pbc = match pbc_value {
        Some(raw) => parse_pbc(&raw)?,
        // ASE's defaults: periodic when a Lattice is given, else not.
        None => [cell.is_some(); 3],
    };
    let columns = parse_properties(properties.as_deref().unwrap_or(DEFAULT_PROPERTIES))?;
    Ok(Header {
        cell,
        pbc,
        columns,
        info,
    })
}

fn parse_lattice(raw: &str) -> Result<Cell, ParseErrorKind> {
    let values: Vec<f64> = match classify_value("Lattice", raw) {
        InfoValue::FloatArray(v) => v,
        InfoValue::IntArray(v) => v.into_iter().map(|i| i as f64).collect(),
        _ => Vec::new(),
    };
    if values.len() != 9 {
        return Err(ParseErrorKind::BadLattice {
            found: abbreviate(raw),
        });
    }
    // The nine numbers are the lattice vectors a, b, c one after another.
    let mut matrix = [[0.0; 3]; 3];
    for (i, row) in matrix.iter_mut().enumerate() {
        row.copy_from_slice(&values[3 * i..3 * i + 3]);
    }
    Ok(Cell::new(matrix))
}

fn parse_pbc(raw: &str) -> Result<[bool; 3], ParseErrorKind> {
    match classify_value("pbc", raw) {
        InfoValue::Bool(b) => Ok([b; 3]),
        InfoValue::BoolArray(v) if v.len() == 3 => Ok([v[0], v[1], v[2]]),
        _ => Err(ParseErrorKind::BadPbc {
            found: abbreviate(raw),
        }),
    }
}

fn parse_properties(spec: &str) -> Result<Vec<ColumnSpec>, ParseErrorKind> {
    let bad = |reason: String| ParseErrorKind::BadProperties {
        spec: abbreviate(spec),
        reason,
    };
    let fields: Vec<&str> = spec.split(':').collect();
    if !fields.chunks_exact(3).remainder().is_empty() {
        return Err(bad(format!(
            "expected name:type:width triples, found {} colon-separated fields",
            fields.len()
        )));
    }
    let mut columns: Vec<ColumnSpec> = Vec::with_capacity(fields.len() / 3);
    for triple in fields.chunks_exact(3) {
        let (name, ty, width) = (triple[0], triple[1], triple[2]);
        if name.is_empty() {
            return Err(bad("empty column name".into()));
        }
        let ty = match ty {
            "S" => ColumnType::Str,
            "R" => ColumnType::Real,
            "I" => ColumnType::Int,
            "L" => ColumnType::Bool,
            other => {
                return Err(bad(format!(
                    "column `{name}` has unknown type `{other}` (expected S, R, I or L)"
                )))
            }
        };
        let width: usize = match width.parse() {
            Ok(w) if w >= 1 => w,
            _ => {
                return Err(bad(format!(
                    "column `{name}` has width `{width}`, expected a positive integer"
                )))
            }
        };
        if columns.iter().any(|c| c.name == name) {
            return Err(bad(format!("column `{name}` appears twice")));
        }
        let required = match name {
            "species" => Some((ColumnType::Str, 1)),
            "pos" => Some((ColumnType::Real, 3)),
            "Z" => Some((ColumnType::Int, 1)),
            _ => None,
        };
        if let Some((req_ty, req_width)) = required {
            if (ty, width) != (req_ty, req_width) {
                return Err(bad(format!(
                    "column `{name}` must have type {:?} and width {req_width}",
                    req_ty
                )));
            }
        }
        columns.push(ColumnSpec {
            name: name.to_string(),
            ty,
            width,
        });
    }
    if !columns.iter().any(|c| c.name == "pos") {
        return Err(bad("no `pos` column (positions)".into()));
    }
    if !columns.iter().any(|c| c.name == "species" || c.name == "Z") {
        return Err(bad(
            "no `species` or `Z` column (element of each atom)".into()
        ));
    }
    Ok(columns)
}

/// Where the values of one column go.
enum Sink {
    Species,
    AtomicNumber,
    Position,
    /// `Z` when a species column exists: species defines the element.
    Ignore,
    Real(Vec<f64>),
    Int(Vec<i64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
}

struct FrameBuilder {
    names: Vec<String>,
    types: Vec<ColumnType>,
    widths: Vec<usize>,
    sinks: Vec<Sink>,
    total_width: usize,
    positions: Vec<[f64; 3]>,
    numbers: Vec<u32>,
}

impl FrameBuilder {
    fn new(columns: &[ColumnSpec], n_atoms: usize) -> Self {
        let rows = n_atoms.min(MAX_RESERVED_ROWS);
        // Widths come from the file, so the reservation is capped too.
        let reserve = |width: usize| rows.saturating_mul(width).min(MAX_RESERVED_ROWS * 3);
        let has_species = columns.iter().any(|c| c.name == "species");
        let sinks = columns
            .iter()
            .map(|c| match (c.name.as_str(), c.ty) {
                ("species", _) => Sink::Species,
                ("pos", _) => Sink::Position,
                ("Z", _) if has_species => Sink::Ignore,
                ("Z", _) => Sink::AtomicNumber,
                (_, ColumnType::Real) => Sink::Real(Vec::with_capacity(reserve(c.width))),
                (_, ColumnType::Int) => Sink::Int(Vec::with_capacity(reserve(c.width))),
                (_, ColumnType::Bool) => Sink::Bool(Vec::with_capacity(reserve(c.width))),
                (_, ColumnType::Str) => Sink::Str(Vec::with_capacity(reserve(c.width))),
            })
            .collect();
        Self {
            names: columns.iter().map(|c| c.name.clone()).collect(),
            types: columns.iter().map(|c| c.ty).collect(),
            widths: columns.iter().map(|c| c.width).collect(),
            sinks,
            total_width: columns
                .iter()
                .fold(0usize, |acc, c| acc.saturating_add(c.width)),
            positions: Vec::with_capacity(rows),
            numbers: Vec::with_capacity(rows),
        }
    }

    /// Parses one atom line. When the line is also too short, that is the
    /// error reported: it usually means the frame's atom count is wrong and
    /// a count or comment line was read as an atom line.
    fn push_line(
        &mut self,
        line: &[u8],
        atom: usize,
        species: &mut SpeciesCache,
    ) -> Result<(), ParseErrorKind> {
        self.parse_line(line, atom, species).map_err(|kind| {
            let found = line
                .split(u8::is_ascii_whitespace)
                .filter(|t| !t.is_empty())
                .count();
            if found < self.total_width {
                ParseErrorKind::TooFewColumns {
                    atom,
                    expected: self.total_width,
                    found,
                }
            } else {
                kind
            }
        })
    }

    /// Parses one atom line; tokens are borrowed slices of `line`, and
    /// numbers are parsed in place without allocating.
    fn parse_line(
        &mut self,
        line: &[u8],
        atom: usize,
        species: &mut SpeciesCache,
    ) -> Result<(), ParseErrorKind> {
        let mut tokens = line
            .split(u8::is_ascii_whitespace)
            .filter(|t| !t.is_empty());
        let too_few = || ParseErrorKind::TooFewColumns {
            atom,
            expected: self.total_width,
            found: line
                .split(u8::is_ascii_whitespace)
                .filter(|t| !t.is_empty())
                .count(),
        };
        for (col, sink) in self.sinks.iter_mut().enumerate() {
            let bad = |expected: &'static str, token: &[u8]| ParseErrorKind::BadValue {
                atom,
                column: self.names[col].clone(),
                expected,
                found: String::from_utf8_lossy(token).into_owned(),
            };
            let expected = self.types[col].describe();
            match sink {
                Sink::Species => {
                    let token = tokens.next().ok_or_else(too_few)?;
                    let z =
                        species
                            .lookup(token)
                            .ok_or_else(|| ParseErrorKind::UnknownElement {
                                atom,
                                symbol: String::from_utf8_lossy(token).into_owned(),
                            })?;
                    self.numbers.push(z);
                }
                Sink::AtomicNumber => {
                    let token = tokens.next().ok_or_else(too_few)?;
                    let z = parse_i64(token).ok_or_else(|| bad(expected, token))?;
                    if !(0..=i64::from(elements::MAX_ATOMIC_NUMBER)).contains(&z) {
                        return Err(ParseErrorKind::UnknownAtomicNumber { atom, z });
                    }
                    self.numbers.push(z as u32);
                }
                Sink::Position => {
                    let mut p = [0.0; 3];
                    for x in &mut p {
                        let token = tokens.next().ok_or_else(too_few)?;
                        *x = parse_f64(token).ok_or_else(|| bad(expected, token))?;
                    }
                    if p.iter().any(|x| !x.is_finite()) {
                        return Err(ParseErrorKind::NonFinitePosition {
                            atom,
                            found: format!("{} {} {}", p[0], p[1], p[2]),
                        });
                    }
                    self.positions.push(p);
                }
                Sink::Ignore => {
                    tokens.next().ok_or_else(too_few)?;
                }
                Sink::Real(values) => {
                    for _ in 0..self.widths[col] {
                        let token = tokens.next().ok_or_else(too_few)?;
                        values.push(parse_f64(token).ok_or_else(|| bad(expected, token))?);
                    }
                }
                Sink::Int(values) => {
                    for _ in 0..self.widths[col] {
                        let token = tokens.next().ok_or_else(too_few)?;
                        values.push(parse_i64(token).ok_or_else(|| bad(expected, token))?);
                    }
                }
                Sink::Bool(values) => {
                    for _ in 0..self.widths[col] {
                        let token = tokens.next().ok_or_else(too_few)?;
                        values.push(parse_column_bool(token).ok_or_else(|| bad(expected, token))?);
                    }
                }
                Sink::Str(values) => {
                    for _ in 0..self.widths[col] {
                        let token = tokens.next().ok_or_else(too_few)?;
                        let s =
                            std::str::from_utf8(token).map_err(|_| ParseErrorKind::InvalidUtf8)?;
                        values.push(s.to_string());
                    }
                }
            }
        }
        // Extra trailing values are ignored, as ASE does.
        Ok(())
    }

    fn finish(self, header: Header) -> System {
        let mut arrays = BTreeMap::new();
        for ((name, sink), width) in self.names.into_iter().zip(self.sinks).zip(self.widths) {
            let column = match sink {
                Sink::Real(v) => Column::Float(v, width),
                Sink::Int(v) => Column::Int(v, width),
                Sink::Bool(v) => Column::Bool(v, width),
                Sink::Str(v) => Column::Str(v, width),
                Sink::Species | Sink::AtomicNumber | Sink::Position | Sink::Ignore => continue,
            };
            arrays.insert(name, column);
        }
        System {
            positions: self.positions,
            numbers: self.numbers,
            cell: header.cell,
            pbc: header.pbc,
            properties: Properties {
                info: header.info,
                arrays,
            },
        }
    }
}

fn parse_f64(token: &[u8]) -> Option<f64> {
    std::str::from_utf8(token).ok()?.parse().ok()
}

fn parse_i64(token: &[u8]) -> Option<i64> {
    std::str::from_utf8(token).ok()?.parse().ok()
}

/// ASE's `L` column values.
fn parse_column_bool(token: &[u8]) -> Option<bool> {
    match token {
        b"T" | b"True" => Some(true),
        b"F" | b"False" => Some(false),
        _ => None,
    }
}

/// Remembers the last species token: atom lines usually repeat a few
/// elements, so most lookups are one short byte comparison.
#[derive(Default)]
struct SpeciesCache {
    token: [u8; 3],
    len: usize,
    z: u32,
}

impl SpeciesCache {
    fn lookup(&mut self, token: &[u8]) -> Option<u32> {
        if self.len > 0 && token == &self.token[..self.len] {
            return Some(self.z);
        }
        let z = elements::atomic_number_capitalized(token)?;
        if let Some(slot) = self.token.get_mut(..token.len()) {
            slot.copy_from_slice(token);
            self.len = token.len();
            self.z = z;
        }
        Some(z)
    }
}
