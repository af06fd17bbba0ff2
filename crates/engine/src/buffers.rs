//! Tensor memory kept for reuse within and across evaluations.

use crate::ops::map_into;
use crate::Scalar;

/// Tensor buffers kept for reuse: gradients the backward pass has consumed,
/// and (via [`Graph::into_buffers`](crate::Graph::into_buffers) / [`Graph::with_buffers`](crate::Graph::with_buffers)) every value of
/// a finished evaluation for the next one. Large per-edge tensors then reuse
/// memory that is already mapped instead of faulting in fresh pages for
/// every op, which is what limits many ranks sharing one machine.
pub struct Buffers<T> {
    pub(crate) free: Vec<Vec<T>>,
    /// Requests (of at least `MIN_POOLED` elements) no kept buffer served.
    pub(crate) fresh: usize,
    /// Index arrays (edge centres, neighbours, inverse maps) of earlier graphs.
    pub(crate) free_indices: Vec<Vec<u32>>,
    /// The largest periodic shift array of an earlier graph.
    pub(crate) free_shifts: Vec<[i32; 3]>,
}

impl<T> Default for Buffers<T> {
    fn default() -> Self {
        Self {
            free: Vec::new(),
            fresh: 0,
            free_indices: Vec::new(),
            free_shifts: Vec::new(),
        }
    }
}

impl<T> Buffers<T> {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let values: usize = self.free.iter().map(|v| v.capacity()).sum();
        let indices: usize = self.free_indices.iter().map(|v| v.capacity()).sum();
        values * std::mem::size_of::<T>()
            + indices * std::mem::size_of::<u32>()
            + self.free_shifts.capacity() * std::mem::size_of::<[i32; 3]>()
    }

    /// An empty shift array with the kept capacity, for a caller that fills
    /// it and hands it to an op as [`crate::ops::PeriodicShifts`].
    pub fn take_shifts(&mut self) -> Vec<[i32; 3]> {
        let mut v = std::mem::take(&mut self.free_shifts);
        v.clear();
        v
    }

    pub(crate) fn give_shifts(&mut self, v: Vec<[i32; 3]>) {
        if v.capacity() > self.free_shifts.capacity() {
            self.free_shifts = v;
        }
    }

    /// How many large buffers (op outputs, gradients) had to be allocated
    /// because no kept one fitted, since these buffers were made: once a
    /// repeated evaluation has settled, a further identical one adds none.
    pub fn fresh_allocations(&self) -> usize {
        self.fresh
    }

    /// An empty index array with the largest kept capacity (a fresh one when
    /// none is kept), for a caller that fills it, e.g. with a pair list, and
    /// hands it to [`Graph::index`](crate::Graph::index).
    pub fn take_indices(&mut self) -> Vec<u32> {
        let largest = self
            .free_indices
            .iter()
            .enumerate()
            .max_by_key(|(_, v)| v.capacity())
            .map(|(k, _)| k);
        let mut v = largest.map_or_else(Vec::new, |k| self.free_indices.swap_remove(k));
        v.clear();
        v
    }

    /// Keeps an index array for reuse.
    pub fn give_indices(&mut self, v: Vec<u32>) {
        const MAX_INDEX_BUFFERS: usize = 16;
        if v.capacity() < MIN_POOLED {
            return;
        }
        keep_largest(&mut self.free_indices, v, MAX_INDEX_BUFFERS);
    }
}

/// Adds `v` to `kept`; beyond `max` entries the one of smallest capacity is
/// released.
fn keep_largest<V>(kept: &mut Vec<Vec<V>>, v: Vec<V>, max: usize) {
    kept.push(v);
    if kept.len() > max {
        if let Some((k, _)) = kept.iter().enumerate().min_by_key(|(_, v)| v.capacity()) {
            kept.swap_remove(k);
        }
    }
}

impl<T: Scalar> Buffers<T> {
    /// Most buffers kept; beyond it the smallest is released.
    const MAX_BUFFERS: usize = 256;

    /// A buffer of `len` elements whose content is unspecified (stale but
    /// initialised): for callers that overwrite every element.
    pub(crate) fn for_overwrite(&mut self, len: usize) -> Vec<T> {
        let v = self.unspecified(len);
        // Test builds hand out NaN, so that a kernel that claims to write
        // every element and leaves one shows up in every result that
        // reads it, instead of passing on a zero it happened to get.
        #[cfg(debug_assertions)]
        let v = {
            let mut v = v;
            v.fill(T::nan());
            v
        };
        v
    }

    /// [`Self::for_overwrite`]'s buffer, before the check builds' poison.
    fn unspecified(&mut self, len: usize) -> Vec<T> {
        // Best fit: the smallest kept buffer that holds `len` elements, but
        // not one more than twice too large: handing a large buffer to a
        // small request makes the next large request miss, and the pool
        // would drift instead of settling on what a step needs.
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len && v.capacity() <= len.saturating_mul(2))
            .min_by_key(|(_, v)| v.capacity())
            .map(|(k, _)| k);
        if best.is_none() && len >= MIN_POOLED {
            self.fresh += 1;
        }
        match best {
            Some(k) => {
                let mut v = self.free.swap_remove(k);
                if v.len() >= len {
                    v.truncate(len);
                } else {
                    v.resize(len, T::zero());
                }
                v
            }
            None if len >= MIN_POOLED => {
                // Room to grow: per-edge tensors of consecutive MD steps
                // differ by the few pairs that crossed the cutoff, and a
                // request one element above every kept capacity would map
                // (and fault in) a whole fresh tensor. Zeroed allocation
                // leaves the zeroing of a large block to the kernel, page
                // by page on first touch, so the spare capacity costs
                // nothing until a later request uses it.
                let mut v = vec![T::zero(); len + len / HEADROOM_DIVISOR];
                v.truncate(len);
                v
            }
            None => vec![T::zero(); len],
        }
    }

    /// A zero-filled buffer of `len` elements.
    pub(crate) fn zeroed(&mut self, len: usize) -> Vec<T> {
        let mut v = self.for_overwrite(len);
        map_into(&mut v, |_| T::zero());
        v
    }

    /// Keeps `v` for reuse.
    pub(crate) fn give(&mut self, v: Vec<T>) {
        if v.capacity() < MIN_POOLED {
            return;
        }
        keep_largest(&mut self.free, v, Self::MAX_BUFFERS);
    }
}

/// Buffers smaller than this (elements) are left to the allocator.
const MIN_POOLED: usize = 1 << 14;

/// A fresh pooled buffer gets `len / HEADROOM_DIVISOR` spare elements of
/// capacity (1/8: pair counts of an MD run drift by far less between
/// rebuilds).
const HEADROOM_DIVISOR: usize = 8;
