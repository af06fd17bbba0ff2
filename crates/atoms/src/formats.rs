//! Structure files by format: extended XYZ (plain XYZ included), VASP
//! POSCAR / CONTCAR and LAMMPS data files (read), each optionally
//! gzip-compressed.
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
pub enum StructureError {
    /// An extended XYZ problem (names the file and line).
    #[error(transparent)]
    Xyz(#[from] XyzError),
    /// A POSCAR problem.
    #[error("{}: {source}", .file.display())]
    Poscar {
        file: PathBuf,
        #[source]
        source: PoscarError,
    },
    /// A LAMMPS data file problem.
    #[error("{}: {source}", .file.display())]
    Lammps {
        file: PathBuf,
        #[source]
        source: crate::lammps::LammpsError,
    },
    /// A format that cannot be written.
    #[error("{}: {what}", .file.display())]
    Unsupported { file: PathBuf, what: String },
    /// Opening, decompressing or writing failed.
    #[error("{}: {source}", .file.display())]
    Io {
        file: PathBuf,
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
    /// LAMMPS data file (`*.data`, `*.lmp`, `data.*`; read only).
    LammpsData,
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

/// Writes `frames` to `path` in the format its name implies (extended XYZ
/// unless it names a POSCAR, which holds exactly one frame), gzip-compressed
/// when the name ends in `.gz`.
pub fn write_structure(path: impl AsRef<Path>, frames: &[System]) -> Result<(), StructureError> {
    let path = path.as_ref();
    let poscar_err = |what: String| StructureError::Poscar {
        file: path.to_path_buf(),
        source: PoscarError::Write(what),
    };
    let bytes = match format_from_name(path).unwrap_or(Format::ExtendedXyz) {
        Format::ExtendedXyz => extxyz::write_string(frames)
            .map_err(|e| e.with_file(path))?
            .into_bytes(),
        Format::Poscar => match frames {
            [one] => poscar::write_string(one)
                .map_err(|source| StructureError::Poscar {
                    file: path.to_path_buf(),
                    source,
                })?
                .into_bytes(),
            _ => {
                return Err(poscar_err(format!(
                    "{} frames; a POSCAR holds one",
                    frames.len()
                )))
            }
        },
        Format::LammpsData => {
            return Err(StructureError::Unsupported {
                file: path.to_path_buf(),
                what: "LAMMPS data files are read, not written".into(),
            })
        }
    };
    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let gz = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    if gz {
        let mut encoder = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        encoder.write_all(&bytes).map_err(io_err(path))?;
        encoder.finish().map_err(io_err(path))?;
    } else {
        let mut file = file;
        file.write_all(&bytes).map_err(io_err(path))?;
    }
    Ok(())
}
