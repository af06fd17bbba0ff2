//! Integer index tensors on the tape ([`IndexNode`]) and their inverse
//! maps ([`Csr`], target row → source rows) that scatters walk.

use crate::RowDomain;
use std::sync::Arc;

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
    pub csr: std::sync::OnceLock<Arc<Csr>>,
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
