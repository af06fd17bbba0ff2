use crate::dist::DataMut;

/// Floating-point element type of a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
        })
    }
}

/// The element types the engine computes in (f32 and f64): the workspace's
/// one float trait [`ddmlip_float::Real`] (arithmetic, conversions, GEMM
/// through [`ddmlip_float::gemm`]) plus what the engine needs to name and
/// communicate them.
pub trait Scalar: ddmlip_float::Real {
    /// The [`DType`] naming this element type.
    const DTYPE: DType;
    /// Erases the element type of a mutable slice for communication.
    fn data_mut(s: &mut [Self]) -> DataMut<'_>;
}

impl Scalar for f64 {
    const DTYPE: DType = DType::F64;
    fn data_mut(s: &mut [Self]) -> DataMut<'_> {
        DataMut::F64(s)
    }
}

impl Scalar for f32 {
    const DTYPE: DType = DType::F32;
    fn data_mut(s: &mut [Self]) -> DataMut<'_> {
        DataMut::F32(s)
    }
}
