//! Reading a `.pt2` archive: the zip members, format and version checks,
//! the graph, the weights and the ddmlip metadata.

use crate::ir::{dtype, parse_sizes, InputKind, Program, RawTensorMeta};
use crate::{Pt2Error, SUPPORTED_VERSIONS};
use ddmlip_checkpoint::{zip_members, ZipMember, ZipMembersError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A weight (parameter, buffer or constant) as dense row-major values.
#[derive(Debug, Clone, PartialEq)]
pub struct Weight {
    /// Sizes per dimension (empty for a scalar).
    pub shape: Vec<usize>,
    /// The schema's dtype code (see [`crate::ir::dtype`]).
    pub dtype: i64,
    /// Values in row-major order; integers and booleans converted exactly.
    pub values: Vec<f64>,
}

/// `extra/ddmlip.json`: what the exporter records about the model.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Metadata {
    /// The model's name.
    pub model: String,
    /// Interaction cutoff (Å): the edge list the graph receives holds every
    /// pair closer than this.
    pub cutoff: f64,
    /// Atomic numbers; `species[k]` is the element the graph's species index
    /// `k` stands for.
    pub species: Vec<u32>,
    /// Units (`energy`: eV, `length`: Angstrom).
    #[serde(default)]
    pub units: BTreeMap<String, String>,
    /// The input contract's version (`ddmlip-pt2-v1`).
    #[serde(default)]
    pub contract: Option<String>,
}

/// Which size symbol counts atoms and which counts edges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeSymbols {
    /// The symbol of `positions.shape[0]`.
    pub atoms: String,
    /// The symbol of `edge_index.shape[1]`.
    pub edges: String,
}

/// A read and checked archive.
#[derive(Debug, Clone)]
pub struct Pt2Archive {
    /// Where it was read from (for messages).
    pub path: PathBuf,
    /// The archive's `archive_version`.
    pub archive_version: String,
    /// The program.
    pub program: Program,
    /// Parameters, buffers and constants by graph input name (`p_emb`, …).
    pub weights: BTreeMap<String, Weight>,
    /// The exporter's metadata.
    pub metadata: Metadata,
    /// The atom and edge size symbols.
    pub symbols: SizeSymbols,
}

/// The archive versions this importer reads (`archive_version` member).
const SUPPORTED_ARCHIVE_VERSIONS: &[&str] = &["0"];

struct Members<'a> {
    bytes: &'a [u8],
    root: String,
    list: Vec<ZipMember>,
}

impl<'a> Members<'a> {
    fn find(&self, rel: &str) -> Option<&ZipMember> {
        let full = format!("{}{rel}", self.root);
        self.list.iter().find(|m| m.name == full)
    }

    fn read(&self, rel: &str) -> Result<&'a [u8], Pt2Error> {
        let m = self.find(rel).ok_or_else(|| Pt2Error::MissingMember {
            member: rel.to_string(),
        })?;
        if !m.stored {
            return Err(Pt2Error::Compressed {
                member: rel.to_string(),
            });
        }
        // The zip reader checked the range against the file length.
        self.bytes
            .get(m.payload.clone())
            .ok_or_else(|| Pt2Error::MissingMember {
                member: rel.to_string(),
            })
    }

    fn text(&self, rel: &str) -> Result<String, Pt2Error> {
        let b = self.read(rel)?;
        Ok(String::from_utf8_lossy(b).trim().to_string())
    }
}

#[derive(Deserialize)]
struct WeightsConfig {
    config: BTreeMap<String, WeightEntry>,
}

#[derive(Deserialize)]
struct WeightEntry {
    path_name: String,
    #[serde(default)]
    use_pickle: bool,
    tensor_meta: RawTensorMeta,
}

impl Pt2Archive {
    /// Reads and checks the archive at `path`.
    pub fn read(path: impl AsRef<Path>) -> Result<Pt2Archive, Pt2Error> {
        let path = path.as_ref().to_path_buf();
        let bytes = std::fs::read(&path).map_err(|source| Pt2Error::Io {
            path: path.clone(),
            source,
        })?;
        Pt2Archive::from_bytes(path, &bytes)
    }

    /// Reads an in-memory archive; `path` is only used in messages.
    pub fn from_bytes(path: PathBuf, bytes: &[u8]) -> Result<Pt2Archive, Pt2Error> {
        let list = zip_members(bytes).map_err(|e| match e {
            ZipMembersError::NotZip(reason) => Pt2Error::NotZip {
                path: path.clone(),
                reason,
            },
            ZipMembersError::Corrupt(source) => Pt2Error::Corrupt {
                path: path.clone(),
                source,
            },
        })?;
        if list.iter().any(|m| {
            m.name.contains("/data/aotinductor/") || m.name.starts_with("data/aotinductor/")
        }) {
            return Err(Pt2Error::AotInductor { path });
        }
        let format_member = list
            .iter()
            .filter(|m| m.name == "archive_format" || m.name.ends_with("/archive_format"))
            .min_by_key(|m| m.name.matches('/').count())
            .ok_or_else(|| Pt2Error::NotZip {
                path: path.clone(),
                reason: "a zip without `archive_format` (a torch.save checkpoint? export with torch.export.save)".into(),
            })?;
        let root =
            format_member.name[..format_member.name.len() - "archive_format".len()].to_string();
        let members = Members { bytes, root, list };

        let format = members.text("archive_format")?;
        if format != "pt2" {
            return Err(Pt2Error::UnsupportedVersion {
                found: format!("archive_format `{format}`"),
                supported: SUPPORTED_VERSIONS,
            });
        }
        let archive_version = members.text("archive_version")?;
        if !SUPPORTED_ARCHIVE_VERSIONS.contains(&archive_version.as_str()) {
            return Err(Pt2Error::UnsupportedVersion {
                found: format!("archive_version `{archive_version}`"),
                supported: SUPPORTED_VERSIONS,
            });
        }
        if members.find("byteorder").is_some() && members.text("byteorder")? != "little" {
            return Err(Pt2Error::UnsupportedVersion {
                found: "a big-endian archive".into(),
                supported: SUPPORTED_VERSIONS,
            });
        }
        let model_member = pick_model(&members)?;
        let program = Program::from_json(members.read(&model_member)?, &model_member)?;

        let mut by_state_name: BTreeMap<String, Weight> = BTreeMap::new();
        for (dir, config) in [
            ("data/weights/", "model_weights_config.json"),
            ("data/constants/", "model_constants_config.json"),
        ] {
            let rel = format!("{dir}{config}");
            if members.find(&rel).is_none() {
                continue;
            }
            let cfg: WeightsConfig =
                serde_json::from_slice(members.read(&rel)?).map_err(|e| Pt2Error::Json {
                    member: rel.clone(),
                    message: e.to_string(),
                })?;
            for (name, entry) in cfg.config {
                if entry.use_pickle {
                    return Err(Pt2Error::Weight {
                        name,
                        message: "stored as a pickle (a non-tensor constant); ddmlip reads raw tensor files".into(),
                    });
                }
                let raw = members.read(&format!("{dir}{}", entry.path_name))?;
                let w = decode_weight(&name, &entry.tensor_meta, raw)?;
                by_state_name.insert(name, w);
            }
        }
        let mut weights = BTreeMap::new();
        for input in &program.inputs {
            let state_name = match &input.kind {
                InputKind::Parameter(n) | InputKind::Buffer(n) | InputKind::Constant(n) => n,
                InputKind::User => continue,
            };
            let w = by_state_name
                .get(state_name)
                .ok_or_else(|| Pt2Error::Weight {
                    name: state_name.clone(),
                    message: "named by the graph but absent from the archive's weights".into(),
                })?;
            weights.insert(input.name.clone(), w.clone());
        }

        let meta_bytes = members.read("extra/ddmlip.json").map_err(|_| {
            Pt2Error::Metadata(
                "absent; export with scripts/fixtures/make_pt2_fixtures.py's `export` (extra_files={'ddmlip.json': ...}) to record cutoff and species".into(),
            )
        })?;
        let metadata: Metadata =
            serde_json::from_slice(meta_bytes).map_err(|e| Pt2Error::Metadata(e.to_string()))?;
        check_metadata(&metadata)?;
        let symbols = check_contract(&program)?;
        Ok(Pt2Archive {
            path,
            archive_version,
            program,
            weights,
            metadata,
            symbols,
        })
    }

    /// Ops the engine does not map, with their counts, sorted by name.
    pub fn unsupported_ops(&self) -> Vec<(String, usize)> {
        self.program
            .op_counts()
            .into_iter()
            .filter(|(op, _)| !crate::ops::is_supported(op))
            .collect()
    }
}

fn pick_model(members: &Members<'_>) -> Result<String, Pt2Error> {
    if members.find("models/model.json").is_some() {
        return Ok("models/model.json".into());
    }
    let prefix = format!("{}models/", members.root);
    let jsons: Vec<&str> = members
        .list
        .iter()
        .filter_map(|m| m.name.strip_prefix(&prefix))
        .filter(|n| n.ends_with(".json") && !n.contains('/'))
        .collect();
    match jsons.as_slice() {
        [one] => Ok(format!("models/{one}")),
        [] => {
            let old_layout = members.find("serialized_exported_program.json").is_some()
                || members
                    .list
                    .iter()
                    .any(|m| m.name.ends_with("serialized_exported_program.json"));
            if old_layout {
                Err(Pt2Error::UnsupportedVersion {
                    found: "the pre-2.9 layout (serialized_exported_program.json)".into(),
                    supported: SUPPORTED_VERSIONS,
                })
            } else {
                Err(Pt2Error::MissingMember {
                    member: "models/<name>.json".into(),
                })
            }
        }
        many => Err(Pt2Error::Contract {
            message: format!(
                "the archive holds {} programs ({}); ddmlip imports one",
                many.len(),
                many.join(", ")
            ),
        }),
    }
}

fn decode_weight(name: &str, meta: &RawTensorMeta, raw: &[u8]) -> Result<Weight, Pt2Error> {
    let err = |message: String| Pt2Error::Weight {
        name: name.to_string(),
        message,
    };
    let fixed = |v: &[crate::ir::RawSymInt], what: &str| -> Result<Vec<i64>, Pt2Error> {
        parse_sizes(v, name)?
            .iter()
            .map(|s| {
                s.as_constant()
                    .ok_or_else(|| err(format!("symbolic {what}")))
            })
            .collect()
    };
    let sizes = fixed(&meta.sizes, "size")?;
    let strides = fixed(&meta.strides, "stride")?;
    let offset = match &meta.storage_offset {
        Some(o) => fixed(std::slice::from_ref(o), "storage offset")?[0],
        None => 0,
    };
    if sizes.iter().any(|&s| s < 0) || strides.iter().any(|&s| s < 0) || offset < 0 {
        return Err(err(format!(
            "negative size, stride or offset ({sizes:?}, {strides:?}, {offset})"
        )));
    }
    let strides = if strides.is_empty() {
        // Contiguous when no strides are recorded.
        let mut st = vec![1i64; sizes.len()];
        for d in (0..sizes.len().saturating_sub(1)).rev() {
            st[d] = st[d + 1].saturating_mul(sizes[d + 1]);
        }
        st
    } else if strides.len() == sizes.len() {
        strides
    } else {
        return Err(err(format!(
            "{} strides for {} sizes",
            strides.len(),
            sizes.len()
        )));
    };
    let width = match meta.dtype {
        dtype::FLOAT64 | dtype::INT64 => 8,
        dtype::FLOAT32 | dtype::INT32 => 4,
        dtype::BOOL => 1,
        other => {
            return Err(err(format!(
                "unsupported dtype code {other} (f64, f32, int64, int32 and bool are read)"
            )))
        }
    };
    let count = sizes
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s as usize));
    let count = count.filter(|&c| c <= raw.len()).ok_or_else(|| {
        err(format!(
            "shape {sizes:?} does not fit the {}-byte file",
            raw.len()
        ))
    })?;
    let mut values = Vec::with_capacity(count);
    let mut index = vec![0i64; sizes.len()];
    for _ in 0..count {
        let element = offset + index.iter().zip(&strides).map(|(i, s)| i * s).sum::<i64>();
        let at = (element as usize).checked_mul(width);
        let bytes = at.and_then(|a| raw.get(a..a + width)).ok_or_else(|| {
            err(format!(
                "element {element} lies past the end of the {}-byte file",
                raw.len()
            ))
        })?;
        let v = match meta.dtype {
            dtype::FLOAT64 => f64::from_le_bytes(bytes.try_into().unwrap_or([0; 8])),
            dtype::INT64 => i64::from_le_bytes(bytes.try_into().unwrap_or([0; 8])) as f64,
            dtype::FLOAT32 => f32::from_le_bytes(bytes.try_into().unwrap_or([0; 4])) as f64,
            dtype::INT32 => i32::from_le_bytes(bytes.try_into().unwrap_or([0; 4])) as f64,
            _ => f64::from(bytes[0] != 0),
        };
        if !v.is_finite() {
            return Err(err(format!(
                "non-finite value {v} at element {}",
                values.len()
            )));
        }
        values.push(v);
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < sizes[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(Weight {
        shape: sizes.iter().map(|&s| s as usize).collect(),
        dtype: meta.dtype,
        values,
    })
}

fn check_metadata(m: &Metadata) -> Result<(), Pt2Error> {
    if !(m.cutoff.is_finite() && m.cutoff > 0.0) {
        return Err(Pt2Error::Metadata(format!(
            "cutoff must be a positive number of Å, found {}",
            m.cutoff
        )));
    }
    if m.species.is_empty() {
        return Err(Pt2Error::Metadata("species is empty".into()));
    }
    for (k, &z) in m.species.iter().enumerate() {
        if !(1..=118).contains(&z) {
            return Err(Pt2Error::Metadata(format!(
                "species[{k}] = {z} is not an atomic number"
            )));
        }
        if m.species[..k].contains(&z) {
            return Err(Pt2Error::Metadata(format!("species lists Z = {z} twice")));
        }
    }
    for (key, want) in [("energy", "eV"), ("length", "Angstrom")] {
        if let Some(unit) = m.units.get(key) {
            if unit != want {
                return Err(Pt2Error::Metadata(format!(
                    "units.{key} is `{unit}`; ddmlip works in {want}"
                )));
            }
        }
    }
    Ok(())
}

/// Checks the user inputs and outputs against the contract and returns the
/// atom and edge symbols.
fn check_contract(p: &Program) -> Result<SizeSymbols, Pt2Error> {
    let users = p.user_inputs();
    let names = ["positions", "species", "edge_index", "edge_shift", "cell"];
    if users.len() != names.len() {
        return Err(Pt2Error::Contract {
            message: format!(
                "expected 5 inputs ({}), found {} ({})",
                names.join(", "),
                users.len(),
                users.join(", ")
            ),
        });
    }
    let meta = |k: usize| {
        p.tensors.get(users[k]).ok_or_else(|| Pt2Error::Contract {
            message: format!("input `{}` has no tensor metadata", users[k]),
        })
    };
    let want = |k: usize,
                rank: usize,
                dtypes: &[i64],
                what: &str|
     -> Result<Vec<crate::SizeExpr>, Pt2Error> {
        let m = meta(k)?;
        if m.sizes.len() != rank || !dtypes.contains(&m.dtype) {
            return Err(Pt2Error::Contract {
                message: format!(
                    "input {} `{}` should be {what}, found rank {} with dtype code {}",
                    k + 1,
                    users[k],
                    m.sizes.len(),
                    m.dtype
                ),
            });
        }
        Ok(m.sizes.clone())
    };
    let pos = want(0, 2, &[dtype::FLOAT64], "positions [N,3] float64")?;
    let species = want(1, 1, &[dtype::INT64, dtype::INT32], "species [N] int64")?;
    let edge_index = want(
        2,
        2,
        &[dtype::INT64, dtype::INT32],
        "edge_index [2,E] int64",
    )?;
    let shift = want(3, 2, &[dtype::FLOAT64], "edge_shift [E,3] float64")?;
    let cell = want(4, 2, &[dtype::FLOAT64], "cell [3,3] float64")?;
    if let Some(n) = pos[0].as_constant() {
        return Err(Pt2Error::StaticSizes {
            what: "atom",
            size: n,
        });
    }
    if let Some(n) = edge_index[1].as_constant() {
        return Err(Pt2Error::StaticSizes {
            what: "edge",
            size: n,
        });
    }
    let single = |e: &crate::SizeExpr, what: &str| -> Result<String, Pt2Error> {
        if e.factor == 1 && e.symbols.len() == 1 {
            Ok(e.symbols[0].clone())
        } else {
            Err(Pt2Error::Contract {
                message: format!("the {what} count should be one size symbol, found `{e}`"),
            })
        }
    };
    let atoms = single(&pos[0], "atom")?;
    let edges = single(&edge_index[1], "edge")?;
    if atoms == edges {
        return Err(Pt2Error::Contract {
            message: format!(
                "atoms and edges share the size symbol `{atoms}`; export them as separate dims"
            ),
        });
    }
    let three = crate::SizeExpr::constant(3);
    let checks = [
        (pos[1] == three, "positions.shape[1] = 3"),
        (
            species[0] == pos[0],
            "species.shape[0] = positions.shape[0]",
        ),
        (
            edge_index[0] == crate::SizeExpr::constant(2),
            "edge_index.shape[0] = 2",
        ),
        (
            shift[0] == edge_index[1] && shift[1] == three,
            "edge_shift [E,3] with E = edge_index.shape[1]",
        ),
        (cell[0] == three && cell[1] == three, "cell [3,3]"),
    ];
    for (ok, what) in checks {
        if !ok {
            return Err(Pt2Error::Contract {
                message: format!("expected {what}"),
            });
        }
    }
    if p.outputs.len() != 2 {
        return Err(Pt2Error::Contract {
            message: format!(
                "expected 2 outputs (energy [], atomic_energies [N]), found {}",
                p.outputs.len()
            ),
        });
    }
    let out = |k: usize| p.tensors.get(&p.outputs[k]).map(|m| m.sizes.clone());
    if out(0).is_none_or(|s| !s.is_empty()) {
        return Err(Pt2Error::Contract {
            message: "the first output (energy) should be a scalar []".into(),
        });
    }
    if out(1).is_none_or(|s| s.len() != 1 || s[0] != pos[0]) {
        return Err(Pt2Error::Contract {
            message: "the second output (atomic_energies) should be [N]".into(),
        });
    }
    Ok(SizeSymbols { atoms, edges })
}
