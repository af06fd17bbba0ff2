//! Reading PyTorch zip checkpoints (the `torch.save` format since 1.6),
//! without Python or libtorch, and locating the pretrained SevenNet-0 file.
//!
//! - [`load`] opens a checkpoint: the zip container (see the `zip` module
//!   notes), the pickled top-level object as a [`PyValue`] tree, and lazy
//!   access to the tensor storages.
//! - [`Checkpoint::state_dict`] / [`Checkpoint::tensor`] materialise tensors
//!   as dense row-major float32, applying stored strides and offsets.
//! - [`find_sevennet_checkpoint`] finds the SevenNet-0 weights fetched by
//!   `scripts/fetch-sevennet.sh`.
//!
//! The unpickler never executes anything: only a whitelist of PyTorch and
//! numpy reconstruction functions is interpreted, every other object
//! becomes [`PyValue::Opaque`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod members;
mod paths;
pub mod pickle;
mod value;
mod zip;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use error::CheckpointError;
pub use members::{zip_members, ZipMember, ZipMembersError};
pub use paths::{
    cache_dir_from, default_sevennet_checkpoint_path, find_sevennet_checkpoint, CHECKPOINT_ENV,
    SEVENNET_FILE_NAME,
};
pub use value::{NdArray, PyValue, StorageDtype, StorageRef, Tensor, TensorRef};

/// A loaded PyTorch zip checkpoint. Holds the whole file in memory; tensors
/// are decoded on request.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    bytes: Vec<u8>,
    /// Archive directory holding `data.pkl`, with its trailing `/` (e.g. `"archive/"`).
    root: String,
    entries: Vec<zip::ZipEntry>,
    /// Storage key → index into `entries`.
    storages: HashMap<String, usize>,
    object: PyValue,
}

/// Reads the PyTorch zip checkpoint at `path` and unpickles its top-level
/// object. Tensor data is validated and decoded lazily.
///
/// Errors: [`CheckpointError::Io`] when the file cannot be read,
/// [`CheckpointError::NotTorchZip`] for non-zip, legacy-format, truncated or
/// `data.pkl`-less files, [`CheckpointError::Zip`] for a corrupt container,
/// [`CheckpointError::Malformed`] / [`CheckpointError::Unsupported`] for the
/// pickle.
pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint, CheckpointError> {
    let path = path.as_ref().to_path_buf();
    let bytes = std::fs::read(&path).map_err(|source| CheckpointError::Io {
        path: path.clone(),
        source,
    })?;
    Checkpoint::from_bytes(path, bytes)
}

impl Checkpoint {
    /// Parses an in-memory checkpoint; `path` is only used in messages.
    /// Same contract and errors as [`load`].
    pub fn from_bytes(path: PathBuf, bytes: Vec<u8>) -> Result<Self, CheckpointError> {
        let not_torch = |reason: String| CheckpointError::NotTorchZip {
            path: path.clone(),
            reason,
        };
        let entries = match zip::read_entries(&bytes) {
            Ok(e) => e,
            Err(zip::ZipOpenError::NotZip(reason)) => return Err(not_torch(reason)),
            Err(zip::ZipOpenError::Corrupt(e)) => return Err(e),
        };
        // The root directory is named after the file at save time (often
        // `archive/`, `tmp/` for SevenNet-0): take the shallowest data.pkl.
        let pkl = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.name == "data.pkl" || e.name.ends_with("/data.pkl"))
            .min_by_key(|(_, e)| e.name.matches('/').count())
            .map(|(i, _)| i)
            .ok_or_else(|| not_torch("the zip archive has no data.pkl".into()))?;
        let root = entries[pkl].name[..entries[pkl].name.len() - "data.pkl".len()].to_string();

        let byteorder = format!("{root}byteorder");
        if let Some(e) = entries.iter().find(|e| e.name == byteorder) {
            if e.method == 0 && bytes[e.data_offset..e.data_offset + e.size].trim_ascii() == b"big"
            {
                return Err(CheckpointError::Unsupported(
                    "big-endian checkpoint (byteorder = big)".into(),
                ));
            }
        }

        let data_dir = format!("{root}data/");
        let storages = entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.name.strip_prefix(&data_dir).map(|k| (k.to_string(), i)))
            .collect();

        let mut checkpoint = Checkpoint {
            path,
            bytes,
            root,
            entries,
            storages,
            object: PyValue::None,
        };
        let pickle = checkpoint.entry_bytes(pkl)?;
        checkpoint.object = pickle::unpickle(pickle)?;
        Ok(checkpoint)
    }

    fn entry_bytes(&self, index: usize) -> Result<&[u8], CheckpointError> {
        let e = &self.entries[index];
        if e.method != 0 {
            return Err(CheckpointError::Unsupported(format!(
                "zip entry `{}` is compressed (method {}); PyTorch writes stored entries",
                e.name, e.method
            )));
        }
        // Bounds were checked against the file length when the directory was read.
        self.bytes
            .get(e.data_offset..e.data_offset + e.size)
            .ok_or_else(|| CheckpointError::Zip {
                offset: e.data_offset as u64,
                what: format!("payload of `{}` out of bounds", e.name),
            })
    }

    /// The file this checkpoint was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The archive's root directory with its trailing slash (e.g. `"tmp/"`).
    pub fn root_dir(&self) -> &str {
        &self.root
    }

    /// Names of all zip entries, in central-directory order.
    pub fn entry_names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    /// Number of storage files (entries under `<root>/data/`).
    pub fn num_storages(&self) -> usize {
        self.storages.len()
    }

    /// The unpickled top-level object.
    pub fn object(&self) -> &PyValue {
        &self.object
    }

    /// Decodes a tensor view as dense row-major float32, applying its
    /// offset and strides.
    ///
    /// Errors: [`CheckpointError::Unsupported`] for storages other than
    /// `torch.FloatStorage` or views addressing more elements than their
    /// storage holds (broadcast views); [`CheckpointError::InvalidTensor`]
    /// when the storage file is missing or shorter than declared.
    pub fn tensor(&self, view: &TensorRef) -> Result<Tensor, CheckpointError> {
        let storage = &view.storage;
        let invalid = |what: String| CheckpointError::InvalidTensor {
            storage: storage.key.clone(),
            what,
        };
        if storage.dtype != StorageDtype::F32 {
            return Err(CheckpointError::Unsupported(format!(
                "storage class {} (only torch.FloatStorage is decoded)",
                storage.dtype.class_name()
            )));
        }
        let &index = self
            .storages
            .get(&storage.key)
            .ok_or_else(|| invalid(format!("no entry {}data/{}", self.root, storage.key)))?;
        let raw = self.entry_bytes(index)?;
        let needed = storage.numel.checked_mul(4);
        if !matches!(needed, Some(n) if n <= raw.len() as u64) {
            return Err(invalid(format!(
                "declares {} float32 elements but the entry has {} bytes",
                storage.numel,
                raw.len()
            )));
        }
        // Views normally come from the unpickler, which validated them; the
        // fields are public, so re-check rank and extent before indexing.
        let last =
            view.shape
                .iter()
                .zip(&view.stride)
                .try_fold(view.offset, |acc, (&size, &stride)| {
                    (size as u64)
                        .saturating_sub(1)
                        .checked_mul(stride)
                        .and_then(|d| acc.checked_add(d))
                });
        let in_bounds = matches!(last, Some(l) if l < storage.numel);
        let numel = view.numel();
        if view.shape.len() != view.stride.len() || (numel > 0 && !in_bounds) {
            return Err(invalid(format!(
                "view (offset {}, shape {:?}, stride {:?}) does not fit its storage of {} elements",
                view.offset, view.shape, view.stride, storage.numel
            )));
        }
        // Bounds memory by the storage (itself bounded by the file size).
        if numel as u64 > storage.numel.max(1) {
            return Err(CheckpointError::Unsupported(format!(
                "tensor view with {numel} elements over a storage of {} (broadcast views)",
                storage.numel
            )));
        }
        let read = |i: u64| -> Result<f32, CheckpointError> {
            let at = usize::try_from(i)
                .ok()
                .and_then(|i| i.checked_mul(4))
                .and_then(|a| raw.get(a..a + 4))
                .ok_or_else(|| invalid(format!("element {i} is outside the storage")))?;
            Ok(f32::from_le_bytes([at[0], at[1], at[2], at[3]]))
        };
        let mut data = Vec::with_capacity(numel);
        if numel > 0 {
            // Odometer over the multi-index, row-major; the storage index is
            // updated incrementally (one add per element, carries subtract).
            let rank = view.shape.len();
            let mut idx = vec![0usize; rank];
            let mut at = view.offset;
            for _ in 0..numel {
                data.push(read(at)?);
                for d in (0..rank).rev() {
                    idx[d] += 1;
                    if idx[d] < view.shape[d] {
                        at += view.stride[d];
                        break;
                    }
                    // Carry: back to index 0 in this dimension (no overflow:
                    // (shape-1)·stride was bounded above).
                    at -= view.stride[d] * (view.shape[d] as u64 - 1);
                    idx[d] = 0;
                }
            }
        }
        Ok(Tensor {
            shape: view.shape.clone(),
            data,
        })
    }

    fn top_dict_value(&self, key: &str) -> Result<&PyValue, CheckpointError> {
        if self.object.as_dict().is_none() {
            return Err(CheckpointError::WrongType {
                key: "<top level>".into(),
                expected: "dict",
                found: self.object.type_name(),
            });
        }
        self.object
            .get(key)
            .ok_or_else(|| CheckpointError::MissingKey(key.into()))
    }

    /// The `model_state_dict` entries as (name, tensor view), in file order,
    /// without reading tensor data.
    pub fn state_dict_refs(&self) -> Result<Vec<(String, &TensorRef)>, CheckpointError> {
        let sd = self.top_dict_value("model_state_dict")?;
        let items = sd.as_dict().ok_or_else(|| CheckpointError::WrongType {
            key: "model_state_dict".into(),
            expected: "dict",
            found: sd.type_name(),
        })?;
        items
            .iter()
            .map(|(k, v)| {
                let name = k.as_str().ok_or_else(|| CheckpointError::WrongType {
                    key: "model_state_dict key".into(),
                    expected: "str",
                    found: k.type_name(),
                })?;
                match v {
                    PyValue::Tensor(t) => Ok((name.to_string(), t)),
                    other => Err(CheckpointError::WrongType {
                        key: format!("model_state_dict[{name}]"),
                        expected: "tensor",
                        found: other.type_name(),
                    }),
                }
            })
            .collect()
    }

    /// The `model_state_dict` as (name, dense row-major f32 tensor), in file
    /// order, with strides applied. Every value is finite: a NaN or infinite
    /// weight (a diverged training run, a corrupted file) would make every
    /// result NaN, so it is an error naming the tensor.
    pub fn state_dict(&self) -> Result<Vec<(String, Tensor)>, CheckpointError> {
        self.state_dict_refs()?
            .into_iter()
            .map(|(name, view)| {
                let t = self.tensor(view)?;
                if let Some((index, &value)) =
                    t.data.iter().enumerate().find(|(_, v)| !v.is_finite())
                {
                    return Err(CheckpointError::NonFinite {
                        tensor: name,
                        index,
                        value,
                    });
                }
                Ok((name, t))
            })
            .collect()
    }

    /// The `config` dict of the checkpoint (SevenNet's training config).
    pub fn config(&self) -> Result<&PyValue, CheckpointError> {
        self.top_dict_value("config")
    }

    /// One config value by key.
    pub fn config_value(&self, key: &str) -> Result<&PyValue, CheckpointError> {
        self.config()?
            .get(key)
            .ok_or_else(|| CheckpointError::MissingKey(format!("config.{key}")))
    }

    fn config_as<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        f: impl FnOnce(&'a PyValue) -> Option<T>,
    ) -> Result<T, CheckpointError> {
        let v = self.config_value(key)?;
        f(v).ok_or_else(|| CheckpointError::WrongType {
            key: format!("config.{key}"),
            expected,
            found: v.type_name(),
        })
    }

    /// A numeric config value (float or int) as f64, e.g. `cutoff` (Å).
    pub fn config_f64(&self, key: &str) -> Result<f64, CheckpointError> {
        self.config_as(key, "number", PyValue::as_f64)
    }

    /// An integer config value, e.g. `num_convolution_layer`.
    pub fn config_i64(&self, key: &str) -> Result<i64, CheckpointError> {
        self.config_as(key, "int", PyValue::as_i64)
    }

    /// A boolean config value, e.g. `is_parity`.
    pub fn config_bool(&self, key: &str) -> Result<bool, CheckpointError> {
        self.config_as(key, "bool", PyValue::as_bool)
    }

    /// A string config value, e.g. `version`.
    pub fn config_str(&self, key: &str) -> Result<&str, CheckpointError> {
        self.config_as(key, "str", PyValue::as_str)
    }

    /// A list/tuple of strings, e.g. `chemical_species`, `irreps_manual`.
    pub fn config_str_list(&self, key: &str) -> Result<Vec<String>, CheckpointError> {
        self.config_as(key, "list of str", |v| {
            v.as_seq()?
                .iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect()
        })
    }

    /// A numeric sequence as f64: a list/tuple of numbers or a numpy array
    /// (e.g. `shift`, `scale`).
    pub fn config_f64_list(&self, key: &str) -> Result<Vec<f64>, CheckpointError> {
        match self.config_value(key)? {
            PyValue::NdArray(a) => a.to_f64_vec(),
            _ => self.config_as(key, "list of numbers or ndarray", |v| {
                v.as_seq()?.iter().map(PyValue::as_f64).collect()
            }),
        }
    }

    /// An int → int dict in file order, e.g. `_type_map` (Z → type index).
    pub fn config_int_map(&self, key: &str) -> Result<Vec<(i64, i64)>, CheckpointError> {
        self.config_as(key, "dict of int to int", |v| {
            v.as_dict()?
                .iter()
                .map(|(k, v)| Some((k.as_i64()?, v.as_i64()?)))
                .collect()
        })
    }
}
