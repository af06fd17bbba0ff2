//! The ops of the engine, grouped by kind. All are methods of [`crate::Graph`].
//!
//! Every op computes its forward value eagerly, records a backward closure,
//! and is rayon-parallel over rows for large inputs.

mod device_geometry;
mod device_ops;
mod device_pointwise;
mod edge_geometry;
mod elementwise;
mod exact;
mod geometry;
mod index;
mod linalg;
pub mod message;
pub mod opaque;
mod pointwise;
mod radial;
mod shape;
pub(crate) mod simd;

pub use elementwise::Unary;
pub use geometry::PeriodicShifts;
pub use pointwise::{Pointwise, Reg};
pub use radial::Radial;

/// Below this many elements an op runs on the calling thread.
pub(crate) const PAR_THRESHOLD: usize = 1 << 14;

/// Whether a scatter of `len` source elements runs on the calling thread:
/// small inputs, or a pool of one worker (one thread per rank). It then adds
/// rows straight in source order, which gives every target the same sum, in
/// the same order, as the parallel path through the inverse map, without
/// building that map or reading the sources out of order.
pub(crate) fn scatter_in_source_order(len: usize) -> bool {
    len < PAR_THRESHOLD || rayon::current_num_threads() == 1
}

/// Whether an index scatter of `len` source elements runs on the calling
/// thread in source order: as [`scatter_in_source_order`], unless other
/// ranks can take pieces of it (then it goes through the inverse map, whose
/// target rows split into independent pieces).
pub(crate) fn index_scatter_in_source_order(len: usize) -> bool {
    scatter_in_source_order(len) && crate::helpers::pieces_for(len) == 1
}

/// `out[i] = f(i)` for every element: over rayon above [`PAR_THRESHOLD`],
/// in pieces other ranks may run when they can help.
pub(crate) fn map_into<T: Send>(out: &mut [T], f: impl Fn(usize) -> T + Sync) {
    update_each(out, |i, o| *o = f(i));
}

/// `f(start, part)` over consecutive parts of `out` that together cover it
/// (`start` = the part's first element): work-sharing pieces, rayon chunks
/// above [`PAR_THRESHOLD`], or one part. `f` must compute each element the
/// same way whatever part holds it. [`map_rows`] with one-element rows.
pub(crate) fn map_parts<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Sync) {
    map_rows(out, 1, f)
}

/// `f(row0, part)` over consecutive whole-row parts of `out` (rows of
/// `width` elements; `row0` = the part's first row) that together cover
/// it: work-sharing pieces, rayon chunks above [`PAR_THRESHOLD`] elements,
/// or one part. `f` must compute each row the same way whatever part holds
/// it (a row's result may not depend on the split).
pub(crate) fn map_rows<T: Send>(out: &mut [T], width: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    use rayon::prelude::*;
    let width = width.max(1);
    let pieces = crate::helpers::pieces_for(out.len());
    if pieces > 1 {
        crate::helpers::run_parts(out, width, pieces, &|start, part| f(start / width, part));
    } else if out.len() >= PAR_THRESHOLD {
        // About 4096 elements per chunk, in whole rows.
        let rows = (4096 / width).max(1);
        out.par_chunks_mut(rows * width)
            .enumerate()
            .for_each(|(c, part)| f(c * rows, part));
    } else {
        f(0, out);
    }
}

/// `update(i, &mut out[i])` for every element, each once: over rayon above
/// [`PAR_THRESHOLD`], in pieces other ranks may run when they can help.
pub(crate) fn update_each<T: Send>(out: &mut [T], update: impl Fn(usize, &mut T) + Sync) {
    use rayon::prelude::*;
    let pieces = crate::helpers::pieces_for(out.len());
    if pieces > 1 {
        crate::helpers::run_parts(out, 1, pieces, &|start, part| {
            for (i, o) in part.iter_mut().enumerate() {
                update(start + i, o);
            }
        });
    } else if out.len() >= PAR_THRESHOLD {
        out.par_iter_mut()
            .enumerate()
            .for_each(|(i, o)| update(i, o));
    } else {
        out.iter_mut().enumerate().for_each(|(i, o)| update(i, o));
    }
}
