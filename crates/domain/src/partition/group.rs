//! Parallel regrouping of per-atom items by rank.
//!
//! The partition produces items (owned atoms, ghost images, atoms of a slab)
//! chunk by chunk in ascending atom order, each tagged with the rank (or
//! slab, or column) it belongs to. Regrouping them per rank with a serial
//! pass cost more than the rest of a 200,000-atom partition on sixteen
//! threads, so it is done here in parallel: a stable sort inside each chunk,
//! then one concatenation per rank. The result is the same as a serial
//! stable bucketing, so nothing downstream depends on the thread count.

use rayon::prelude::*;

/// Atoms per parallel work item of the partition.
pub(super) const ATOM_CHUNK: usize = 4096;

/// One rank's run of items inside one chunk.
#[derive(Clone, Copy)]
struct Segment {
    rank: usize,
    start: usize,
    end: usize,
    /// Items of this rank in all earlier chunks.
    base: usize,
}

/// Items regrouped by rank, in their original order within each rank.
pub(super) struct RankGroups<T> {
    /// Each chunk's items, stably sorted by rank.
    chunks: Vec<Vec<(usize, T)>>,
    /// Each chunk's runs of equal rank.
    segments: Vec<Vec<Segment>>,
    /// `(chunk, segment)` of every run, ordered by rank, then chunk.
    by_rank: Vec<(usize, usize)>,
    /// `by_rank[rank_start[r]..rank_start[r + 1]]` are rank `r`'s runs.
    rank_start: Vec<usize>,
}

impl<T: Copy + Send + Sync> RankGroups<T> {
    /// Regroups `chunks` (items tagged `(rank, item)`, ranks `< n_ranks`).
    pub(super) fn new(mut chunks: Vec<Vec<(usize, T)>>, n_ranks: usize) -> Self {
        let mut segments: Vec<Vec<Segment>> = chunks
            .par_iter_mut()
            .map(|chunk| {
                chunk.sort_by_key(|e| e.0);
                let mut runs = Vec::new();
                let mut start = 0;
                for run in chunk.chunk_by(|a, b| a.0 == b.0) {
                    runs.push(Segment {
                        rank: run[0].0,
                        start,
                        end: start + run.len(),
                        base: 0,
                    });
                    start += run.len();
                }
                runs
            })
            .collect();
        // Counting sort of the runs by rank (chunk order kept), filling in
        // each run's base on the way.
        let mut rank_start = vec![0usize; n_ranks + 1];
        for s in segments.iter().flatten() {
            rank_start[s.rank + 1] += 1;
        }
        for r in 0..n_ranks {
            rank_start[r + 1] += rank_start[r];
        }
        let mut next = rank_start.clone();
        let mut filled = vec![0usize; n_ranks];
        let mut by_rank = vec![(0, 0); rank_start[n_ranks]];
        for (c, runs) in segments.iter_mut().enumerate() {
            for (k, s) in runs.iter_mut().enumerate() {
                by_rank[next[s.rank]] = (c, k);
                next[s.rank] += 1;
                s.base = filled[s.rank];
                filled[s.rank] += s.end - s.start;
            }
        }
        Self {
            chunks,
            segments,
            by_rank,
            rank_start,
        }
    }

    /// Number of ranks.
    fn n_ranks(&self) -> usize {
        self.rank_start.len() - 1
    }

    /// Rank `r`'s items in their original order.
    pub(super) fn items_of(&self, r: usize) -> impl Iterator<Item = T> + '_ {
        self.by_rank[self.rank_start[r]..self.rank_start[r + 1]]
            .iter()
            .flat_map(move |&(c, k)| {
                let s = self.segments[c][k];
                self.chunks[c][s.start..s.end].iter().map(|e| e.1)
            })
    }

    /// Every rank's items, in their original order (parallel over ranks).
    pub(super) fn per_rank(&self) -> Vec<Vec<T>> {
        (0..self.n_ranks())
            .into_par_iter()
            .map(|r| self.items_of(r).collect())
            .collect()
    }

    /// Calls `set(part, position within the rank, item)` for every item,
    /// where `part` is chunk `c`'s part of `out`
    /// (`out[c * per_chunk..(c + 1) * per_chunk]`); parallel over chunks.
    pub(super) fn fill_positions<U: Send>(
        &self,
        out: &mut [U],
        per_chunk: usize,
        set: impl Fn(&mut [U], usize, T) + Sync,
    ) {
        out.par_chunks_mut(per_chunk)
            .zip(&self.chunks)
            .zip(&self.segments)
            .for_each(|((part, chunk), runs)| {
                for s in runs {
                    for (k, e) in chunk[s.start..s.end].iter().enumerate() {
                        set(part, s.base + k, e.1);
                    }
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regrouping_matches_a_serial_stable_bucketing() {
        // Pseudo-random ranks over uneven chunks, some ranks never used.
        let mut state = 12345u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            (state >> 33) as usize
        };
        let n_ranks = 13;
        let mut chunks: Vec<Vec<(usize, usize)>> = Vec::new();
        for c in 0..9 {
            let len = next() % 50;
            let mut chunk = Vec::new();
            for k in 0..len {
                chunk.push((next() % 11, c * 1000 + k));
            }
            chunks.push(chunk);
        }
        let mut expected = vec![Vec::new(); n_ranks];
        for &(r, x) in chunks.iter().flatten() {
            expected[r].push(x);
        }
        let groups = RankGroups::new(chunks, n_ranks);
        assert_eq!(groups.per_rank(), expected);
        // Position of every item within its rank, written per chunk slot.
        let per_chunk = 50;
        let mut position = vec![usize::MAX; 9 * per_chunk];
        groups.fill_positions(&mut position, per_chunk, |part, k, x| {
            part[x % 1000] = k;
        });
        for (r, items) in expected.iter().enumerate() {
            for (k, &x) in items.iter().enumerate() {
                assert_eq!(position[(x / 1000) * per_chunk + x % 1000], k, "rank {r}");
            }
        }
    }
}
