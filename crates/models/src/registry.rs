//! Model names and model files.

use crate::{BpDemo, EamDemo, LennardJones, QeqDemo, RebuildDemo, SchNetDemo};
use ddmlip_engine::Model;
use serde::Deserialize;
use std::path::Path;
use thiserror::Error;

/// Errors resolving a model name or reading a model file.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("unknown model `{name}`; built-in models are: {known}. A path to a .toml model file also works")]
    Unknown { name: String, known: String },
    #[error("cannot read model file {path}: {message}")]
    Io { path: String, message: String },
    #[error("model file {path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{0}")]
    Checkpoint(String),
}

/// Registry name of the pretrained SevenNet-0 potential.
pub const SEVENNET_NAME: &str = "sevennet-0";

/// Built-in model names with one-line descriptions, in display order.
pub fn model_names() -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> = builtin()
        .into_iter()
        .map(|m| (m.name(), m.description()))
        .collect();
    let status = match ddmlip_checkpoint::find_sevennet_checkpoint() {
        Ok(p) => format!("checkpoint at {}", p.display()),
        Err(_) => "checkpoint not installed: run `bash scripts/fetch-sevennet.sh`".to_string(),
    };
    names.push((
        SEVENNET_NAME.to_string(),
        format!("SevenNet-0 (11Jul2024) pretrained universal potential, 89 elements, cutoff 5 Å ({status})"),
    ));
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

/// Resolves a built-in name or a model file path (`.toml`).
pub fn load_model(name_or_path: &str) -> Result<Box<dyn Model>, ModelError> {
    if let Some(m) = builtin().into_iter().find(|m| m.name() == name_or_path) {
        return Ok(m);
    }
    if name_or_path == SEVENNET_NAME {
        let path = ddmlip_checkpoint::find_sevennet_checkpoint()
            .map_err(|e| ModelError::Checkpoint(e.to_string()))?;
        return crate::SevenNetModel::load(&path, SEVENNET_NAME)
            .map(|m| Box::new(m) as Box<dyn Model>)
            .map_err(ModelError::Checkpoint);
    }
    let path = Path::new(name_or_path);
    if path.extension().is_some_and(|e| e == "pth" || e == "pt") {
        if !path.exists() {
            return Err(ModelError::Io {
                path: name_or_path.to_string(),
                message: "no such file".into(),
            });
        }
        return crate::SevenNetModel::load(path, SEVENNET_NAME)
            .map(|m| Box::new(m) as Box<dyn Model>)
            .map_err(ModelError::Checkpoint);
    }
    if path.extension().is_some_and(|e| e == "toml") || path.exists() {
        return load_toml(path);
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

fn load_toml(path: &Path) -> Result<Box<dyn Model>, ModelError> {
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
            lj.check().map_err(invalid)?;
            Ok(Box::new(lj))
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
