//! Integer index tensors on the tape ([`IndexNode`]) and their inverse
//! maps ([`Csr`], target row → source rows) that scatters walk.

use crate::device::{DeviceBackend, DeviceCsr, DeviceMem};
use crate::{EngineError, RowDomain, Scalar};
use std::sync::{Arc, OnceLock};

/// An index tensor: one target row per source row (edge centres,
/// neighbours, atom → system), kept beside the float nodes.
pub(crate) struct IndexNode {
    pub values: Arc<Vec<u32>>,
    /// The largest value (0 when empty).
    pub largest: u32,
    pub domain: RowDomain,
    pub target: RowDomain,
    pub target_rows: usize,
    pub role: String,
    /// Inverse map (target row → source rows), built on first scatter.
    pub csr: OnceLock<Arc<Csr>>,
    /// `values` on the graph's device, uploaded on first use there.
    pub device: OnceLock<DeviceMem>,
    /// The inverse map on the graph's device, uploaded on first use there.
    pub device_csr: OnceLock<DeviceCsr>,
}

/// For each target row, the source rows that point at it, in ascending order.
pub(crate) struct Csr {
    pub offsets: Vec<usize>,
    /// `None` when the index is non-decreasing (e.g. edge centres): the
    /// source rows of target t are then `offsets[t]..offsets[t + 1]`
    /// themselves, and no permutation is built.
    pub sources: Option<Vec<u32>>,
}

impl Csr {
    /// Calls `f` with every source row of target row `t`, in ascending order.
    #[inline]
    pub fn for_each_source(&self, t: usize, mut f: impl FnMut(usize)) {
        let span = self.offsets[t]..self.offsets[t + 1];
        match &self.sources {
            Some(s) => s[span].iter().for_each(|&e| f(e as usize)),
            None => span.for_each(f),
        }
    }

    /// The source rows of target row `t`, in ascending order.
    #[inline]
    pub fn sources(&self, t: usize) -> impl Iterator<Item = usize> + '_ {
        let span = self.offsets[t]..self.offsets[t + 1];
        let (listed, counted) = match &self.sources {
            Some(s) => (Some(s[span].iter().map(|&e| e as usize)), None),
            None => (None, Some(span)),
        };
        listed
            .into_iter()
            .flatten()
            .chain(counted.into_iter().flatten())
    }
}

impl IndexNode {
    /// A new index node (no inverse map, nothing on a device yet).
    pub(crate) fn new(
        values: Arc<Vec<u32>>,
        largest: u32,
        (domain, target, target_rows): (RowDomain, RowDomain, usize),
        role: &str,
    ) -> Self {
        Self {
            values,
            largest,
            domain,
            target,
            target_rows,
            role: role.to_string(),
            csr: OnceLock::new(),
            device: OnceLock::new(),
            device_csr: OnceLock::new(),
        }
    }

    /// The values on `backend`'s device (uploaded on first call).
    pub(crate) fn device_values<T: Scalar>(
        &self,
        backend: &dyn DeviceBackend<T>,
    ) -> Result<&DeviceMem, EngineError> {
        if let Some(m) = self.device.get() {
            return Ok(m);
        }
        let m = backend
            .upload_indices(&self.values)
            .map_err(|e| EngineError::device(&self.role, e))?;
        Ok(self.device.get_or_init(|| m))
    }

    /// The inverse map on `backend`'s device (built and uploaded on first
    /// call; `spare` as for [`IndexNode::csr`]).
    pub(crate) fn device_csr<T: Scalar>(
        &self,
        backend: &dyn DeviceBackend<T>,
        spare: impl FnOnce() -> Vec<u32>,
    ) -> Result<&DeviceCsr, EngineError> {
        if let Some(m) = self.device_csr.get() {
            return Ok(m);
        }
        let csr = self.csr(spare);
        let offsets: Vec<u32> = csr
            .offsets
            .iter()
            .map(|&o| u32::try_from(o))
            .collect::<Result<_, _>>()
            .map_err(|_| EngineError::Device {
                op: self.role.clone(),
                message: "more than 2³² index entries".into(),
            })?;
        let upload = |v: &[u32]| {
            backend
                .upload_indices(v)
                .map_err(|e| EngineError::device(&self.role, e))
        };
        let m = DeviceCsr {
            offsets: upload(&offsets)?,
            sources: csr.sources.as_deref().map(upload).transpose()?,
            targets: self.target_rows,
        };
        Ok(self.device_csr.get_or_init(|| m))
    }

    /// The inverse map, built on first use; `spare` supplies recycled
    /// memory for its permutation (called at most once, and only when one
    /// is needed).
    pub(crate) fn csr(&self, spare: impl FnOnce() -> Vec<u32>) -> Arc<Csr> {
        self.csr
            .get_or_init(|| {
                let mut counts = vec![0usize; self.target_rows + 1];
                for &v in self.values.iter() {
                    counts[v as usize + 1] += 1;
                }
                for i in 0..self.target_rows {
                    counts[i + 1] += counts[i];
                }
                let sorted = self.values.windows(2).all(|w| w[0] <= w[1]);
                let sources = (!sorted).then(|| {
                    let mut fill = counts.clone();
                    let mut sources = spare();
                    // Every slot is written below; reuse skips the zeroing.
                    sources.clear();
                    sources.resize(self.values.len(), 0);
                    for (s, &v) in self.values.iter().enumerate() {
                        sources[fill[v as usize]] = s as u32;
                        fill[v as usize] += 1;
                    }
                    sources
                });
                Arc::new(Csr {
                    offsets: counts,
                    sources,
                })
            })
            .clone()
    }
}
