//! The generic value tree produced by the unpickler, and the tensor types.

use crate::CheckpointError;

/// Element type of a PyTorch storage, from the storage class named in the
/// persistent id (`torch.FloatStorage` → [`StorageDtype::F32`], ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageDtype {
    /// `torch.FloatStorage`: little-endian IEEE float32.
    F32,
    /// `torch.DoubleStorage`: little-endian IEEE float64.
    F64,
    /// `torch.LongStorage`: little-endian i64.
    I64,
    /// `torch.IntStorage`: little-endian i32.
    I32,
    /// Any other storage class, by its full dotted name; it can be described
    /// but not materialised.
    Other(String),
}

impl StorageDtype {
    /// Maps a pickled storage class (`module`, `name`) to a dtype.
    pub fn from_class(module: &str, name: &str) -> Self {
        match (module, name) {
            ("torch", "FloatStorage") => Self::F32,
            ("torch", "DoubleStorage") => Self::F64,
            ("torch", "LongStorage") => Self::I64,
            ("torch", "IntStorage") => Self::I32,
            _ => Self::Other(format!("{module}.{name}")),
        }
    }

    /// Bytes per element, `None` for unknown classes.
    pub fn item_size(&self) -> Option<usize> {
        match self {
            Self::F32 | Self::I32 => Some(4),
            Self::F64 | Self::I64 => Some(8),
            Self::Other(_) => None,
        }
    }

    /// The storage class name as PyTorch spells it.
    pub fn class_name(&self) -> String {
        match self {
            Self::F32 => "torch.FloatStorage".into(),
            Self::F64 => "torch.DoubleStorage".into(),
            Self::I64 => "torch.LongStorage".into(),
            Self::I32 => "torch.IntStorage".into(),
            Self::Other(s) => s.clone(),
        }
    }
}

/// A storage named by a persistent id: the raw bytes live in the zip entry
/// `<root>/data/<key>`.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageRef {
    /// File name of the storage under `<root>/data/`.
    pub key: String,
    /// Element type, from the storage class.
    pub dtype: StorageDtype,
    /// Device the storage was saved from (`"cpu"`, `"cuda:0"`); informational.
    pub location: String,
    /// Number of elements in the storage (not bytes).
    pub numel: u64,
}

/// A strided view into a storage, as described by `_rebuild_tensor_v2`.
/// Element `(i0, i1, ...)` is `storage[offset + Σ i_k · stride[k]]`.
/// The constructor validated that every addressed element lies inside the
/// storage.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    /// The storage the view reads.
    pub storage: StorageRef,
    /// Offset of element `(0, ..., 0)`, in elements.
    pub offset: u64,
    /// Size of each dimension; empty for a 0-d tensor.
    pub shape: Vec<usize>,
    /// Stride of each dimension, in elements; same length as `shape`.
    pub stride: Vec<u64>,
}

impl TensorRef {
    /// Number of elements (product of `shape`; 1 for a 0-d tensor),
    /// saturating at `usize::MAX` for absurd shapes.
    pub fn numel(&self) -> usize {
        self.shape
            .iter()
            .try_fold(1usize, |acc, &s| acc.checked_mul(s))
            .unwrap_or(usize::MAX)
    }

    /// Whether the view is row-major contiguous (so the bytes can be read
    /// in order).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1u64;
        for (&size, &stride) in self.shape.iter().zip(&self.stride).rev() {
            if size > 1 && stride != expected {
                return false;
            }
            expected = expected.saturating_mul(size as u64);
        }
        true
    }
}

/// A dense float32 tensor in row-major (C) order: element `(i0, ..., in)`
/// is `data[((i0 · shape[1] + i1) · shape[2] + ...)]`.
/// Invariant: `data.len() == shape.iter().product()`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Size of each dimension; empty for a 0-d (scalar) tensor.
    pub shape: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<f32>,
}

impl Tensor {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

/// A numpy array rebuilt from `numpy.core.multiarray._reconstruct` + `BUILD`.
#[derive(Debug, Clone, PartialEq)]
pub struct NdArray {
    /// Array shape.
    pub shape: Vec<usize>,
    /// Numpy type code without byte order, e.g. `"f4"`, `"f8"`, `"i8"`.
    pub descr: String,
    /// Byte order character: `'<'`, `'>'`, `'|'` or `'='`.
    pub byteorder: char,
    /// Whether `data` is in Fortran (column-major) order.
    pub fortran_order: bool,
    /// Raw element bytes.
    pub data: Vec<u8>,
}

impl NdArray {
    /// Decodes the elements as f64 in memory order (row-major unless
    /// `fortran_order`). Supports `f4`, `f8`, `i4`, `i8`; the byte count must
    /// equal `numel × itemsize`.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>, CheckpointError> {
        let item = match self.descr.as_str() {
            "f4" | "i4" => 4,
            "f8" | "i8" => 8,
            other => {
                return Err(CheckpointError::Unsupported(format!(
                    "numpy dtype `{other}` (only f4, f8, i4, i8 are decoded)"
                )))
            }
        };
        let numel = self
            .shape
            .iter()
            .try_fold(1usize, |acc, &s| acc.checked_mul(s));
        if numel.and_then(|n| n.checked_mul(item)) != Some(self.data.len()) {
            return Err(CheckpointError::WrongType {
                key: "ndarray".into(),
                expected: "data length equal to numel × itemsize",
                found: format!("{} bytes for shape {:?}", self.data.len(), self.shape),
            });
        }
        let big = self.byteorder == '>';
        let out = self
            .data
            .chunks_exact(item)
            .map(|c| {
                let mut b8 = [0u8; 8];
                b8[..item].copy_from_slice(c);
                if big {
                    b8[..item].reverse();
                }
                match self.descr.as_str() {
                    "f4" => f64::from(f32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]])),
                    "i4" => f64::from(i32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]])),
                    "f8" => f64::from_le_bytes(b8),
                    // i8 values beyond 2^53 lose precision, as documented by the f64 return type.
                    _ => i64::from_le_bytes(b8) as f64,
                }
            })
            .collect();
        Ok(out)
    }
}

/// An unpickled Python value. Containers own their children (shared
/// references of the pickle memo are expanded into copies taken after the
/// whole stream was executed, so they show the final, mutated state).
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An int that fits in i64.
    Int(i64),
    /// A larger int: little-endian two's-complement bytes (from LONG1/LONG4).
    BigInt(Vec<u8>),
    /// A float.
    Float(f64),
    /// A str.
    Str(String),
    /// A bytes / bytearray object.
    Bytes(Vec<u8>),
    /// A list.
    List(Vec<PyValue>),
    /// A tuple.
    Tuple(Vec<PyValue>),
    /// A set or frozenset, in insertion order.
    Set(Vec<PyValue>),
    /// A dict or `collections.OrderedDict`, in insertion order. A later
    /// assignment to an existing (hashable scalar) key replaces the value in
    /// place, as Python does.
    Dict(Vec<(PyValue, PyValue)>),
    /// A tensor view (`torch._utils._rebuild_tensor_v2`); the data stays in
    /// the archive until [`crate::Checkpoint::tensor`] reads it.
    Tensor(TensorRef),
    /// A bare storage (a persistent id not wrapped in a tensor).
    Storage(StorageRef),
    /// A numpy array.
    NdArray(NdArray),
    /// A class or function reference that was never called.
    Global {
        /// Module, e.g. `"torch"`.
        module: String,
        /// Attribute name, e.g. `"FloatStorage"`.
        name: String,
    },
    /// An object of a class this reader does not model (e.g. `torch.device`).
    /// Nothing is executed: the call arguments and the `BUILD` state are kept.
    Opaque {
        /// Full dotted class or callable name.
        class: String,
        /// The argument tuple of the call.
        args: Box<PyValue>,
        /// State passed by `BUILD`, if any.
        state: Option<Box<PyValue>>,
    },
}

impl PyValue {
    /// Short type description used in error messages (`"dict"`, `"str"`, ...).
    pub fn type_name(&self) -> String {
        match self {
            Self::None => "None".into(),
            Self::Bool(_) => "bool".into(),
            Self::Int(_) | Self::BigInt(_) => "int".into(),
            Self::Float(_) => "float".into(),
            Self::Str(_) => "str".into(),
            Self::Bytes(_) => "bytes".into(),
            Self::List(_) => "list".into(),
            Self::Tuple(_) => "tuple".into(),
            Self::Set(_) => "set".into(),
            Self::Dict(_) => "dict".into(),
            Self::Tensor(_) => "tensor".into(),
            Self::Storage(_) => "storage".into(),
            Self::NdArray(_) => "ndarray".into(),
            Self::Global { module, name } => format!("global {module}.{name}"),
            Self::Opaque { class, .. } => format!("opaque {class}"),
        }
    }

    /// Looks up a string key in a dict; `None` for missing keys or non-dicts.
    pub fn get(&self, key: &str) -> Option<&PyValue> {
        match self {
            Self::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, Self::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value as f64: floats, ints (rounded above 2^53) and bools.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::Float(x) => Some(x),
            Self::Int(i) => Some(i as f64),
            Self::Bool(b) => Some(f64::from(u8::from(b))),
            _ => None,
        }
    }

    /// The value as i64: ints and bools only.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::Int(i) => Some(i),
            Self::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    /// The value as a bool: only `True` / `False`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as a string slice: only `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items of a list or tuple.
    pub fn as_seq(&self) -> Option<&[PyValue]> {
        match self {
            Self::List(v) | Self::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The entries of a dict, in insertion order.
    pub fn as_dict(&self) -> Option<&[(PyValue, PyValue)]> {
        match self {
            Self::Dict(items) => Some(items),
            _ => None,
        }
    }
}
