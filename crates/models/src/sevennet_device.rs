//! SevenNet's own kernels on a device, through the op engine: the contract
//! a device backend fulfils to run the edge features, the gates and the
//! tensor-product convolutions of a SevenNet checkpoint itself (the CUDA
//! backend does), found through
//! [`DeviceBackend::extension`].
//! The irreps linears need none of it: they run as GEMMs of their matrices
//! on any device ([`ddmlip_engine::device::RowAffine`]).

use ddmlip_e3nn::sevennet::SevenNetWeights;
use ddmlip_e3nn::BlockLayout;
use ddmlip_engine::device::{DeviceBackend, DeviceError, DeviceKernel, DeviceMessageKernel};
use ddmlip_engine::{MessageEdges, Scalar};
use std::any::TypeId;
use std::sync::Arc;

/// The checkpoint (and modality) a SevenNet model was read from: what a
/// device side builds its tables from, once per model and device.
#[derive(Debug, Clone)]
pub struct SevenNetSource {
    /// Every weight of the checkpoint, in f64.
    pub weights: Arc<SevenNetWeights>,
    /// The modality of a multi-fidelity checkpoint.
    pub modal: Option<String>,
}

/// A device's implementation of SevenNet's kernels in precision `T`. Each
/// method returns `None` where this device cannot run that piece of this
/// checkpoint (an architecture its kernels do not cover): the op then runs
/// on the host. Kernels match the host ones' layouts and meaning:
pub trait SevenNetDevice<T: Scalar>: Send + Sync {
    /// Edge vectors (edges × 3, Å) → rows `[radial embedding (n_basis) |
    /// spherical harmonics ((l_max+1)²)]`, and the vectors' gradient.
    fn edge_features(
        &self,
        model: &SevenNetSource,
    ) -> Result<Option<Arc<dyn DeviceKernel<T>>>, DeviceError>;
    /// Layer `layer`'s gate (gate input rows → block output rows).
    fn gate(
        &self,
        model: &SevenNetSource,
        layer: usize,
    ) -> Result<Option<Arc<dyn DeviceKernel<T>>>, DeviceError>;
    /// Layer `layer`'s radial MLP + tensor-product convolution on `edges`:
    /// node input `h`, edge inputs the radial embedding and the SH; the
    /// message rows written in `layout`.
    fn convolution(
        &self,
        model: &SevenNetSource,
        layer: usize,
        layout: BlockLayout,
        edges: &MessageEdges<'_>,
    ) -> Result<Option<Arc<dyn DeviceMessageKernel<T>>>, DeviceError>;
}

/// What a backend with SevenNet kernels returns from
/// `extension(TypeId::of::<SevenNetDeviceHandle<T>>())`.
pub struct SevenNetDeviceHandle<T>(pub Arc<dyn SevenNetDevice<T>>);

/// `backend`'s SevenNet kernels, when it has them.
pub fn sevennet_device<T: Scalar>(
    backend: &dyn DeviceBackend<T>,
) -> Option<&Arc<dyn SevenNetDevice<T>>> {
    backend
        .extension(TypeId::of::<SevenNetDeviceHandle<T>>())
        .and_then(|a| a.downcast_ref::<SevenNetDeviceHandle<T>>())
        .map(|h| &h.0)
}
