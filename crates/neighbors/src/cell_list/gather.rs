//! The per-chunk pair buffers of the cell-list search ([`ChunkPairs`]) and
//! their parallel copy into one list sorted by centre.

use super::*;

/// The pairs of one chunk of centres (in bin order): `counts[c]` pairs for
/// its c-th centre, stored consecutively.
#[derive(Default)]
pub(super) struct ChunkPairs {
    pub(super) counts: Vec<u32>,
    pub(super) neighbors: Vec<u32>,
    /// Empty unless `Fields::shifts`.
    pub(super) shifts: Vec<[i32; 3]>,
    /// Empty unless `Fields::geometry`.
    pub(super) vectors: Vec<[f64; 3]>,
    pub(super) distances: Vec<f64>,
    /// Without geometry: the chunk's shortest pair (index in the chunk, d²).
    pub(super) closest: Option<(usize, f64)>,
}

/// Copies the per-centre segments of the searched chunks into one list
/// sorted by centre, in parallel over ranges of centres; arrays not in
/// `fields` stay empty. Returns the shortest pair (index in `out`, distance)
/// of a search without geometry.
pub(super) fn gather_in_center_order(
    searched: &SearchedChunks<'_>,
    fields: Fields,
    out: &mut NeighborList,
    runner: Option<&ChunkRunner>,
) -> Option<(usize, f64)> {
    let SearchedChunks {
        chunks,
        order,
        chunk_size,
    } = searched;
    let chunk_size = *chunk_size;
    // `order` is a permutation of the centres 0..n.
    let n_atoms = order.len();
    // For each centre: (chunk, first pair in the chunk, count).
    let mut location = vec![(0u32, 0u32, 0u32); n_atoms];
    // The closest pair: (chunk, index in chunk, d²).
    let mut closest: Option<(usize, usize, f64)> = None;
    for (c, chunk) in chunks.iter().enumerate() {
        let mut offset = 0u32;
        for (k, &count) in chunk.counts.iter().enumerate() {
            location[order[c * chunk_size + k] as usize] = (c as u32, offset, count);
            offset += count;
        }
        if let Some((p, d2)) = chunk.closest {
            if closest.is_none_or(|(_, _, best)| d2 < best) {
                closest = Some((c, p, d2));
            }
        }
    }
    let ranges: Vec<std::ops::Range<usize>> = (0..n_atoms)
        .step_by(chunk_size)
        .map(|s| s..(s + chunk_size).min(n_atoms))
        .collect();
    let lengths: Vec<usize> = ranges
        .iter()
        .map(|r| location[r.clone()].iter().map(|l| l.2 as usize).sum())
        .collect();
    let total: usize = lengths.iter().sum();
    let sized = |on: bool| if on { total } else { 0 };
    // Fresh zeroed allocations come straight from the OS and are first
    // touched by the parallel copy below; reused ones are only resized.
    resize_for_overwrite(&mut out.centers, total, 0);
    resize_for_overwrite(&mut out.neighbors, total, 0);
    resize_for_overwrite(&mut out.shifts, sized(fields.shifts), [0; 3]);
    resize_for_overwrite(&mut out.vectors, sized(fields.geometry), [0.0; 3]);
    resize_for_overwrite(&mut out.distances, sized(fields.geometry), 0.0);
    let part_lengths = |on: bool| -> Vec<usize> {
        if on {
            lengths.clone()
        } else {
            vec![0; lengths.len()]
        }
    };
    let parts: Vec<_> = split_by_lengths(&mut out.centers, &lengths)
        .into_iter()
        .zip(split_by_lengths(&mut out.neighbors, &lengths))
        .zip(split_by_lengths(
            &mut out.shifts,
            &part_lengths(fields.shifts),
        ))
        .zip(split_by_lengths(
            &mut out.vectors,
            &part_lengths(fields.geometry),
        ))
        .zip(split_by_lengths(
            &mut out.distances,
            &part_lengths(fields.geometry),
        ))
        .zip(ranges.clone())
        .collect();
    for_each_part(
        parts,
        runner,
        |_, (((((centers, neighbors), shifts), vectors), distances), range)| {
            let mut at = 0;
            for i in range {
                let (c, first, count) = location[i];
                let (chunk, first, count) = (&chunks[c as usize], first as usize, count as usize);
                let src = first..first + count;
                let dst = at..at + count;
                centers[dst.clone()].fill(i as u32);
                neighbors[dst.clone()].copy_from_slice(&chunk.neighbors[src.clone()]);
                if fields.shifts {
                    shifts[dst.clone()].copy_from_slice(&chunk.shifts[src.clone()]);
                }
                if fields.geometry {
                    vectors[dst.clone()].copy_from_slice(&chunk.vectors[src.clone()]);
                    distances[dst].copy_from_slice(&chunk.distances[src]);
                }
                at += count;
            }
        },
    );
    // Where the closest pair landed: its centre's first output slot plus its
    // offset within that centre's segment.
    closest.map(|(c, p, d2)| {
        let chunk = &chunks[c];
        let (mut first, mut k) = (0usize, 0usize);
        while first + chunk.counts[k] as usize <= p {
            first += chunk.counts[k] as usize;
            k += 1;
        }
        let center = order[c * chunk_size + k] as usize;
        let before: usize = location[..center].iter().map(|l| l.2 as usize).sum();
        (before + (p - first), d2.sqrt())
    })
}

/// Sets `v` to length `len`, reusing its allocation when large enough and
/// otherwise taking a fresh zeroed one (no copy of old content). Reused
/// slots keep stale values: the caller overwrites every slot.
pub(super) fn resize_for_overwrite<T: Clone>(v: &mut Vec<T>, len: usize, zero: T) {
    if v.capacity() >= len {
        v.resize(len, zero);
    } else {
        *v = vec![zero; len];
    }
}

pub(super) fn split_by_lengths<'a, T>(
    mut rest: &'a mut [T],
    lengths: &[usize],
) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(lengths.len());
    for &len in lengths {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
        parts.push(head);
        rest = tail;
    }
    parts
}
