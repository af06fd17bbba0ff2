//! Structure files by format: extended XYZ (plain XYZ included), VASP
//! POSCAR / CONTCAR and LAMMPS data files, each optionally gzip-compressed.
//!
//! What each format carries when written: extended XYZ everything (many
//! frames, pbc, `info` / `arrays`, energies, forces, stress); a POSCAR or a
//! LAMMPS data file one frame's structure only (cell, species, positions;
//! LAMMPS data also `initial_charges`), no energies or forces.
//!
//! The format is chosen from the name with any `.gz` removed (`POSCAR`,
//! `CONTCAR`, `*.vasp`, `*.poscar` are POSCAR), then from the content (an
//! extended XYZ file starts with an atom count, a POSCAR with a comment and
//! a scale factor); compression from the gzip magic bytes.

use crate::extxyz::{self, FrameReader, XyzError};
use crate::poscar::{self, PoscarError};
use crate::System;
use flate2::read::GzDecoder;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Why a structure file could not be read or written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StructureError {
    /// An extended XYZ problem (names the file and line).
    #[error(transparent)]
    Xyz(#[from] XyzError),
    /// A POSCAR problem.
    #[error("{}: {source}", .file.display())]
    Poscar {
        /// The file.
        file: PathBuf,
        /// What is wrong in it.
        #[source]
        source: PoscarError,
    },
    /// A LAMMPS data file problem.
    #[error("{}: {source}", .file.display())]
    Lammps {
        /// The file.
        file: PathBuf,
        /// What is wrong in it.
        #[source]
        source: crate::lammps::LammpsError,
    },
    /// The system cannot be written as a LAMMPS data file.
    #[error("{}: cannot write a LAMMPS data file: {source}", .file.display())]
    LammpsWrite {
        /// The file.
        file: PathBuf,
        /// Why the system does not fit the format.
        #[source]
        source: crate::lammps::LammpsWriteError,
    },
    /// Several frames for a format that holds one.
    #[error("{}: {frames} frames, but a {format} file holds one; write several frames as extended XYZ (`.xyz`)", .file.display())]
    OneFrameOnly {
        /// The file.
        file: PathBuf,
        /// Its format (chosen from the name).
        format: Format,
        /// Frames given.
        frames: usize,
    },
    /// Opening, decompressing or writing failed.
    #[error("{}: {source}", .file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// The OS or decompression error.
        #[source]
        source: std::io::Error,
    },
}

/// A structure file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Extended XYZ as ASE writes it (several frames = a batch).
    ExtendedXyz,
    /// VASP POSCAR / CONTCAR (one periodic frame).
    Poscar,
    /// LAMMPS data file (`*.data`, `*.lmp`, `data.*`; one frame).
    LammpsData,
}

impl Format {
    /// True when a file of this format can hold several frames.
    pub fn holds_many_frames(self) -> bool {
        self == Format::ExtendedXyz
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::ExtendedXyz => "extended XYZ",
            Format::Poscar => "POSCAR",
            Format::LammpsData => "LAMMPS data",
        })
    }
}

/// The format a file name implies, ignoring a `.gz` suffix; `None` when the
/// name does not say.
pub fn format_from_name(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    if name.contains("poscar") || name.contains("contcar") || name.ends_with(".vasp") {
        Some(Format::Poscar)
    } else if name.ends_with(".data") || name.ends_with(".lmp") || name.starts_with("data.") {
        Some(Format::LammpsData)
    } else if name.ends_with(".xyz") || name.ends_with(".extxyz") {
        Some(Format::ExtendedXyz)
    } else {
        None
    }
}

/// The format of a text from its first two lines.
fn format_from_content(head: &str) -> Format {
    let mut lines = head.lines();
    let first = lines.next().unwrap_or("").trim();
    let second_is_scale = lines.next().is_some_and(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        matches!(words.len(), 1 | 3) && words.iter().all(|w| w.parse::<f64>().is_ok())
    });
    if first.parse::<usize>().is_err() && second_is_scale {
        Format::Poscar
    } else {
        Format::ExtendedXyz
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> StructureError + '_ {
    move |source| StructureError::Io {
        file: path.to_path_buf(),
        source,
    }
}

/// Opens `path`, transparently decompressing gzip (by its magic bytes).
fn open(path: &Path) -> Result<Box<dyn BufRead>, StructureError> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let gz = reader
        .fill_buf()
        .map_err(io_err(path))?
        .starts_with(&[0x1f, 0x8b]);
    Ok(if gz {
        Box::new(BufReader::with_capacity(1 << 16, GzDecoder::new(reader)))
    } else {
        Box::new(reader)
    })
}

/// Reads every frame of a structure file (see the module docs for formats).
pub fn read_structure(path: impl AsRef<Path>) -> Result<Vec<System>, StructureError> {
    let path = path.as_ref();
    let mut input = open(path)?;
    let format = match format_from_name(path) {
        Some(f) => f,
        None => {
            let head = input.fill_buf().map_err(io_err(path))?;
            format_from_content(&String::from_utf8_lossy(head))
        }
    };
    match format {
        Format::ExtendedXyz => {
            Ok(FrameReader::with_file_name(input, path)
                .collect::<Result<Vec<System>, XyzError>>()?)
        }
        Format::Poscar => {
            let mut text = String::new();
            input.read_to_string(&mut text).map_err(io_err(path))?;
            let system = poscar::read_str(&text).map_err(|source| StructureError::Poscar {
                file: path.to_path_buf(),
                source,
            })?;
            Ok(vec![system])
        }
        Format::LammpsData => {
            let mut text = String::new();
            input.read_to_string(&mut text).map_err(io_err(path))?;
            let system =
                crate::lammps::read_str(&text).map_err(|source| StructureError::Lammps {
                    file: path.to_path_buf(),
                    source,
                })?;
            Ok(vec![system])
        }
    }
}

/// The frames of a structure file as a stream: extended XYZ (gzip too) is
/// parsed one frame at a time as the iterator advances; a POSCAR or LAMMPS
/// data file is read whole (it has one frame). Same formats as
/// [`read_structure`].
pub fn stream_structure(
    path: impl AsRef<Path>,
) -> Result<Box<dyn Iterator<Item = Result<System, StructureError>>>, StructureError> {
    let path = path.as_ref();
    let mut input = open(path)?;
    let format = match format_from_name(path) {
        Some(f) => f,
        None => {
            let head = input.fill_buf().map_err(io_err(path))?;
            format_from_content(&String::from_utf8_lossy(head))
        }
    };
    if format == Format::ExtendedXyz {
        Ok(Box::new(
            FrameReader::with_file_name(input, path).map(|f| f.map_err(StructureError::from)),
        ))
    } else {
        drop(input);
        Ok(Box::new(read_structure(path)?.into_iter().map(Ok)))
    }
}

/// Writes `frames` to `path` in the format its name implies (extended XYZ
/// unless it names a POSCAR or a LAMMPS data file, which hold exactly one
/// frame), gzip-compressed when the name ends in `.gz`.
pub fn write_structure(path: impl AsRef<Path>, frames: &[System]) -> Result<(), StructureError> {
    let path = path.as_ref();
    let format = format_from_name(path).unwrap_or(Format::ExtendedXyz);
    if !format.holds_many_frames() && frames.len() != 1 {
        return Err(StructureError::OneFrameOnly {
            file: path.to_path_buf(),
            format,
            frames: frames.len(),
        });
    }
    let mut writer = StructureWriter::create(path)?;
    for frame in frames {
        writer.write_frame(frame)?;
    }
    writer.finish()
}

/// Where a [`StructureWriter`] puts its bytes.
enum Sink {
    Plain(Box<dyn Write>),
    Gzip(flate2::write::GzEncoder<std::io::BufWriter<std::fs::File>>),
}

impl Sink {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Sink::Plain(w) => w,
            Sink::Gzip(w) => w,
        }
    }
}

/// Writes frames one at a time, as they are computed: extended XYZ streams
/// every frame; a POSCAR or LAMMPS data file takes one frame and refuses a
/// second ([`StructureError::OneFrameOnly`]). Call [`StructureWriter::finish`]
/// to flush (and end the gzip stream); a writer dropped without it may
/// leave a truncated file.
pub struct StructureWriter {
    file: PathBuf,
    format: Format,
    sink: Sink,
    frames: usize,
}

impl StructureWriter {
    /// Creates (truncates) `path`; the format comes from the name (extended
    /// XYZ when it does not say), gzip compression from a `.gz` suffix.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, StructureError> {
        let path = path.as_ref();
        let file = std::fs::File::create(path).map_err(io_err(path))?;
        let file = std::io::BufWriter::with_capacity(1 << 16, file);
        let gz = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
        let sink = if gz {
            Sink::Gzip(flate2::write::GzEncoder::new(
                file,
                flate2::Compression::default(),
            ))
        } else {
            Sink::Plain(Box::new(file))
        };
        Ok(Self {
            file: path.to_path_buf(),
            format: format_from_name(path).unwrap_or(Format::ExtendedXyz),
            sink,
            frames: 0,
        })
    }

    /// A writer of `format` into `output` (stdout, a buffer); `name` is
    /// what errors call it.
    pub fn from_writer(output: Box<dyn Write>, format: Format, name: impl AsRef<Path>) -> Self {
        Self {
            file: name.as_ref().to_path_buf(),
            format,
            sink: Sink::Plain(output),
            frames: 0,
        }
    }

    /// The format being written.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Writes one more frame.
    pub fn write_frame(&mut self, system: &System) -> Result<(), StructureError> {
        let path = self.file.as_path();
        if !self.format.holds_many_frames() && self.frames >= 1 {
            return Err(StructureError::OneFrameOnly {
                file: path.to_path_buf(),
                format: self.format,
                frames: self.frames + 1,
            });
        }
        let out = self.sink.writer();
        match self.format {
            Format::ExtendedXyz => extxyz::write_frames(out, std::slice::from_ref(system))
                .map_err(|e| e.with_file(path))?,
            Format::Poscar => {
                let text =
                    poscar::write_string(system).map_err(|source| StructureError::Poscar {
                        file: path.to_path_buf(),
                        source,
                    })?;
                out.write_all(text.as_bytes()).map_err(io_err(path))?;
            }
            Format::LammpsData => {
                let text = crate::lammps::write_string(system).map_err(|source| {
                    StructureError::LammpsWrite {
                        file: path.to_path_buf(),
                        source,
                    }
                })?;
                out.write_all(text.as_bytes()).map_err(io_err(path))?;
            }
        }
        self.frames += 1;
        Ok(())
    }

    /// Flushes everything written and ends a gzip stream.
    pub fn finish(self) -> Result<(), StructureError> {
        let path = self.file.as_path();
        match self.sink {
            Sink::Plain(mut w) => w.flush().map_err(io_err(path)),
            Sink::Gzip(w) => w
                .finish()
                .and_then(|mut inner| inner.flush())
                .map_err(io_err(path)),
        }
    }
}
