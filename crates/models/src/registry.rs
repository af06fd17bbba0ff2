//! Model names and model files.

use crate::{BpDemo, EamDemo, LennardJones, QeqDemo, RebuildDemo, SchNetDemo};
use ddmlip_engine::Model;
use serde::Deserialize;
use std::path::Path;
use thiserror::Error;

/// Errors resolving a model name or reading a model file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("unknown model `{name}`; built-in models are: {known}. A path to a .toml model file also works")]
    /// A name that is neither built in nor a model file.
    Unknown {
        /// The name asked for.
        name: String,
        /// Built-in names, comma-separated.
        known: String,
    },
    /// A model file that cannot be read (missing, unreadable).
    #[error("cannot read model file {path}: {message}")]
    Io {
        /// The file as given.
        path: String,
        /// The I/O error, in words.
        message: String,
    },
    /// A model file whose content is wrong (unknown kind, bad field, bad value).
    #[error("model file {path}: {message}")]
    Invalid {
        /// The file as given.
        path: String,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The SevenNet-0 checkpoint could not be located (see
    /// `ddmlip_checkpoint::find_sevennet_checkpoint`).
    #[error("{0}")]
    Checkpoint(#[source] ddmlip_checkpoint::CheckpointError),
    /// A SevenNet checkpoint that cannot be used: unsupported architecture
    /// (naming the config key), tensors that do not match, a missing or
    /// unknown modality (listing the valid ones), a damaged file.
    #[error("{path}: {source}")]
    SevenNet {
        /// The checkpoint file.
        path: String,
        /// What is wrong with it.
        #[source]
        source: ddmlip_e3nn::E3nnError,
    },
    /// A built-in SevenNet name whose checkpoint is not in the cache.
    #[error("model `{name}`: checkpoint not found at {path}; fetch it with `bash scripts/fetch-sevennet.sh`")]
    NotInstalled {
        /// The registry name.
        name: String,
        /// Where the checkpoint was looked for.
        path: String,
    },
    /// A `torch.export` archive (`.pt2`) that cannot be imported: unsupported
    /// ops (all listed with counts), static sizes, a damaged archive, an
    /// unsupported version, a graph off the input contract.
    #[error("{path}: {source}")]
    Pt2 {
        /// The archive as given.
        path: String,
        /// What is wrong with it.
        #[source]
        source: ddmlip_pt2::Pt2Error,
    },
    /// `--modal` given for a model that is not a SevenNet checkpoint.
    #[error("--modal {modal}: model `{model}` has no modals (--modal applies to multi-fidelity SevenNet checkpoints such as sevennet-mf-0)")]
    ModalNotApplicable {
        /// The model named.
        model: String,
        /// The modal given.
        modal: String,
    },
}

/// Registry name of the pretrained SevenNet-0 (11Jul2024) potential.
pub const SEVENNET_NAME: &str = "sevennet-0";

/// A pretrained SevenNet checkpoint of the sevenn 0.13.0 wheel, by the name
/// ddmlip gives it and where `scripts/fetch-sevennet.sh` stores it under the
/// cache directory (`<cache>/<dir>/<file>`).
#[derive(Clone, Copy, Debug)]
pub struct PretrainedSevenNet {
    /// Registry name (`--model NAME`).
    pub name: &'static str,
    /// Folder under the cache directory.
    pub dir: &'static str,
    /// File name.
    pub file: &'static str,
    /// One line for `ddmlip models`.
    pub description: &'static str,
}

/// The wheel's four checkpoints.
pub const PRETRAINED_SEVENNETS: [PretrainedSevenNet; 4] = [
    PretrainedSevenNet {
        name: SEVENNET_NAME,
        dir: "sevennet-0",
        file: "checkpoint_sevennet_0.pth",
        description: "SevenNet-0 (11Jul2024) pretrained universal potential, 5 layers, l_max 2, 89 elements, cutoff 5 Å",
    },
    PretrainedSevenNet {
        name: "sevennet-0-22may2024",
        dir: "sevennet-0-22may2024",
        file: "checkpoint_sevennet_0.pth",
        description: "SevenNet-0 (22May2024), the earlier release of SevenNet-0, 5 layers, l_max 2, 89 elements, cutoff 5 Å",
    },
    PretrainedSevenNet {
        name: "sevennet-l3i5",
        dir: "sevennet-l3i5",
        file: "checkpoint_l3i5.pth",
        description: "SevenNet-l3i5, 5 layers, l_max 3, 89 elements, cutoff 5 Å",
    },
    PretrainedSevenNet {
        name: "sevennet-mf-0",
        dir: "sevennet-mf-0",
        file: "checkpoint_sevennet_mf_0.pth",
        description: "SevenNet-MF-0 multi-fidelity (--modal PBE or R2SCAN), 5 layers, l_max 2, 89 elements, cutoff 5 Å",
    },
];

/// Where a pretrained checkpoint is looked up: SevenNet-0 (11Jul2024) also
/// honours `$DDMLIP_SEVENNET_CHECKPOINT`; all live under the cache directory.
/// `Err` is [`ModelError::Checkpoint`] for SevenNet-0 (naming the paths
/// searched) and [`ModelError::NotInstalled`] for the others.
pub fn pretrained_sevennet_path(p: &PretrainedSevenNet) -> Result<std::path::PathBuf, ModelError> {
    if p.name == SEVENNET_NAME {
        return ddmlip_checkpoint::find_sevennet_checkpoint().map_err(ModelError::Checkpoint);
    }
    let default = ddmlip_checkpoint::default_sevennet_checkpoint_path();
    let cache = default
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let path = cache.join(p.dir).join(p.file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ModelError::NotInstalled {
            name: p.name.to_string(),
            path: path.display().to_string(),
        })
    }
}

/// Built-in model names with one-line descriptions, in display order.
pub fn model_names() -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> = builtin()
        .into_iter()
        .map(|m| (m.name(), m.description()))
        .collect();
    for p in &PRETRAINED_SEVENNETS {
        let status = match pretrained_sevennet_path(p) {
            Ok(path) => format!("checkpoint at {}", path.display()),
            Err(_) => "checkpoint not installed: run `bash scripts/fetch-sevennet.sh`".to_string(),
        };
        names.push((p.name.to_string(), format!("{} ({status})", p.description)));
    }
    names
}

fn builtin() -> Vec<Box<dyn Model>> {
    vec![
        Box::new(LennardJones::argon()),
        Box::new(EamDemo::default()),
        Box::new(BpDemo::default()),
        Box::new(SchNetDemo::default()),
        Box::new(QeqDemo::default()),
        Box::new(RebuildDemo::default()),
    ]
}

#[derive(Deserialize)]
struct KindOnly {
    kind: String,
}

/// Resolves a built-in name or a model file path (`.toml`, a SevenNet
/// `.pth` / `.pt` checkpoint, or a `torch.export` archive `.pt2`).
pub fn load_model(name_or_path: &str) -> Result<Box<dyn Model>, ModelError> {
    load_model_with_modal(name_or_path, None)
}

/// [`load_model`] with the modality (fidelity) of a multi-fidelity SevenNet
/// checkpoint (`--modal`). A multi-fidelity checkpoint without one, an
/// unknown name, or a name for a model without modalities is an error that
/// lists the valid names.
pub fn load_model_with_modal(
    name_or_path: &str,
    modal: Option<&str>,
) -> Result<Box<dyn Model>, ModelError> {
    let not_applicable = |model: &str| -> Result<(), ModelError> {
        match modal {
            Some(m) => Err(ModelError::ModalNotApplicable {
                model: model.to_string(),
                modal: m.to_string(),
            }),
            None => Ok(()),
        }
    };
    match resolve(name_or_path)? {
        Resolved::Builtin(m) => {
            not_applicable(name_or_path)?;
            Ok(m)
        }
        Resolved::Pretrained(p, path) => {
            crate::SevenNetModel::load(&path, p.name, modal).map(|m| Box::new(m) as Box<dyn Model>)
        }
        Resolved::Archive(path) => {
            not_applicable(name_or_path)?;
            ddmlip_pt2::ImportedModel::load(path)
                .map(|m| Box::new(m) as Box<dyn Model>)
                .map_err(|source| ModelError::Pt2 {
                    path: name_or_path.to_string(),
                    source,
                })
        }
        Resolved::Checkpoint(path) => {
            let stem = path.file_stem().map_or_else(
                || "sevennet".to_string(),
                |s| s.to_string_lossy().into_owned(),
            );
            crate::SevenNetModel::load(path, &stem, modal).map(|m| Box::new(m) as Box<dyn Model>)
        }
        Resolved::LennardJonesFile(lj) => {
            not_applicable(name_or_path)?;
            Ok(Box::new(lj))
        }
    }
}

/// What a model name or path names, in the order [`load_model`] and
/// [`model_source`] both try: a built-in model, a pretrained SevenNet (its
/// checkpoint installed), a `.pt2` archive, a SevenNet checkpoint file (it
/// exists), a model file.
enum Resolved<'a> {
    Builtin(Box<dyn Model>),
    Pretrained(&'static PretrainedSevenNet, std::path::PathBuf),
    Archive(&'a Path),
    Checkpoint(&'a Path),
    LennardJonesFile(LennardJones),
}

fn resolve(name_or_path: &str) -> Result<Resolved<'_>, ModelError> {
    if let Some(m) = builtin().into_iter().find(|m| m.name() == name_or_path) {
        return Ok(Resolved::Builtin(m));
    }
    if let Some(p) = PRETRAINED_SEVENNETS.iter().find(|p| p.name == name_or_path) {
        return Ok(Resolved::Pretrained(p, pretrained_sevennet_path(p)?));
    }
    let path = Path::new(name_or_path);
    if path.extension().is_some_and(|e| e == "pt2") {
        return Ok(Resolved::Archive(path));
    }
    if path.extension().is_some_and(|e| e == "pth" || e == "pt") {
        if !path.exists() {
            return Err(ModelError::Io {
                path: name_or_path.to_string(),
                message: "no such file".into(),
            });
        }
        return Ok(Resolved::Checkpoint(path));
    }
    if path.extension().is_some_and(|e| e == "toml") || path.exists() {
        return lennard_jones_file(path).map(Resolved::LennardJonesFile);
    }
    Err(ModelError::Unknown {
        name: name_or_path.to_string(),
        known: model_names()
            .into_iter()
            .map(|(n, _)| n)
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// A model's parameters in the form a backend with its own kernels (the
/// GPU) takes them.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// Lennard-Jones parameters (`lj`, or a model file of kind
    /// `lennard-jones`).
    LennardJones(LennardJones),
    /// A SevenNet checkpoint file (a pretrained name resolved, or a `.pth`).
    SevenNetCheckpoint(std::path::PathBuf),
    /// The parameters of the built-in `schnet-demo`.
    SchNet(crate::SchNetWeights),
}

/// The parameters of the model `name_or_path` names (resolved as
/// [`load_model`] does) when it has a [`ModelSource`] form; `Ok(None)` for
/// the other models (the other demo models, `.pt2` archives). Errors as
/// [`load_model`]'s: an unknown name, a missing or invalid file.
pub fn model_source(name_or_path: &str) -> Result<Option<ModelSource>, ModelError> {
    if name_or_path == "lj" {
        return Ok(Some(ModelSource::LennardJones(LennardJones::argon())));
    }
    if name_or_path == "schnet-demo" {
        return Ok(Some(ModelSource::SchNet(SchNetDemo::default().weights())));
    }
    Ok(match resolve(name_or_path)? {
        Resolved::Builtin(_) | Resolved::Archive(_) => None,
        Resolved::Pretrained(_, path) => Some(ModelSource::SevenNetCheckpoint(path)),
        Resolved::Checkpoint(path) => Some(ModelSource::SevenNetCheckpoint(path.to_path_buf())),
        Resolved::LennardJonesFile(lj) => Some(ModelSource::LennardJones(lj)),
    })
}

/// The Lennard-Jones parameters of a model file (the only kind of model
/// file there is).
fn lennard_jones_file(path: &Path) -> Result<LennardJones, ModelError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
        path: shown.clone(),
        message: e.to_string(),
    })?;
    let invalid = |message: String| ModelError::Invalid {
        path: shown.clone(),
        message,
    };
    let kind: KindOnly = toml::from_str(&text)
        .map_err(|e| invalid(format!("missing or invalid `kind`: {}", e.message())))?;
    match kind.kind.as_str() {
        "lennard-jones" => {
            // `flatten` and `deny_unknown_fields` do not combine in serde, so
            // parse the table and strip `kind` first.
            let mut table: toml::Table =
                toml::from_str(&text).map_err(|e| invalid(e.message().to_string()))?;
            table.remove("kind");
            check_lj_field_types(&table).map_err(invalid)?;
            let lj: LennardJones = table
                .try_into()
                .map_err(|e: toml::de::Error| invalid(e.message().to_string()))?;
            lj.check().map_err(|e| invalid(e.to_string()))?;
            Ok(lj)
        }
        other => Err(invalid(format!(
            "unknown kind `{other}`; supported kinds: lennard-jones"
        ))),
    }
}

/// Checks the type of every Lennard-Jones field before deserializing, because
/// the deserializer's own type-mismatch message does not say which field.
fn check_lj_field_types(table: &toml::Table) -> Result<(), String> {
    for (key, value) in table {
        let ok = match key.as_str() {
            "epsilon" | "sigma" | "cutoff" => {
                matches!(value, toml::Value::Float(_) | toml::Value::Integer(_))
            }
            "shift" => value.is_bool(),
            // Unknown keys are reported by the deserializer, with the known ones.
            _ => true,
        };
        if !ok {
            let expected = if key == "shift" {
                "true or false"
            } else {
                "a number"
            };
            return Err(format!(
                "`{key}` must be {expected}, got {} `{value}`",
                value.type_str()
            ));
        }
    }
    Ok(())
}
