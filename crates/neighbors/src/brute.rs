//! O(N²·images) reference: every ordered pair, every image that can be in range.

use crate::frame::pair_vector;
use crate::{keep_in_half, prepare, NeighborError, NeighborList, NeighborOptions};
use ddmlip_atoms::Cell;

/// Reference neighbour list by exhaustive search over all atom pairs and all
/// periodic images that can lie within the cutoff; same contract, same output
/// (pairs and order) as [`crate::neighbor_list`]. Cost O(N² · images): for
/// tests and small systems only.
pub fn brute_force_neighbor_list(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
) -> Result<NeighborList, NeighborError> {
    let prepared = prepare(positions, cell, pbc, opts)?;
    let frame = &prepared.frame;
    let cutoff2 = opts.cutoff * opts.cutoff;
    let mut out = NeighborList::default();
    for (i, (&r_i, f_i)) in positions.iter().zip(&prepared.fractional).enumerate() {
        for (j, (&r_j, f_j)) in positions.iter().zip(&prepared.fractional).enumerate() {
            // |Δfrac_k| ≤ cutoff / height_k for any pair in range, so the image
            // shift S_k lies within cutoff/height_k of f_i − f_j; one extra
            // shift on each side absorbs rounding.
            let mut lo = [0i64; 3];
            let mut hi = [0i64; 3];
            for k in 0..3 {
                if pbc[k] {
                    let reach = opts.cutoff / frame.heights[k];
                    let centre = f_i[k] - f_j[k];
                    lo[k] = (centre - reach).floor() as i64 - 1;
                    hi[k] = (centre + reach).ceil() as i64 + 1;
                }
            }
            for s0 in lo[0]..=hi[0] {
                for s1 in lo[1]..=hi[1] {
                    for s2 in lo[2]..=hi[2] {
                        let shift = [s0 as i32, s1 as i32, s2 as i32];
                        if i == j && shift == [0, 0, 0] {
                            continue;
                        }
                        if opts.half && !keep_in_half(i as u32, j as u32, shift) {
                            continue;
                        }
                        let (vector, d2) = pair_vector(r_i, r_j, frame.shift_cartesian(shift));
                        if d2 < cutoff2 {
                            out.centers.push(i as u32);
                            out.neighbors.push(j as u32);
                            out.shifts.push(shift);
                            out.vectors.push(vector);
                            out.distances.push(d2.sqrt());
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}
