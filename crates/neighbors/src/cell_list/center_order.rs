//! The search behind [`NeighborList`]s: centres walked in index order, so
//! that each range of centres writes its pairs already in output order.
//!
//! The bin-order search of pair lists ([`search_chunks`]) keeps every pair
//! in per-chunk buffers and copies them into centre order afterwards: two
//! writes of every pair, and page faults on buffers as large as the list.
//! Here a single range (one thread) appends straight to the caller's list,
//! reusing its allocation across calls. With several threads the centres
//! are cut into ranges of about equal search cost, estimated by searching
//! every 64th centre first; each range writes into its own region of the
//! caller's arrays, sized by that estimate; the gaps left are closed
//! afterwards by one move of each region, and a range that outgrows its
//! region continues in a list of its own. The pairs and their order are those of the
//! bin-order search; only the order in which centres are visited differs.

use super::gather::{resize_for_overwrite, split_by_lengths};
use super::*;

/// Fewest centres a range gets: below this a second thread costs more in
/// start-up and copying than it saves. At 1,024 a 4,000-atom crystal
/// (42 pairs a centre at 5 Å) is split over two threads; a split costs
/// about 5 % more CPU time there (the sampling and the move of the second
/// region), against half the wall time when a second core is free. At
/// 2,048 such a system ran on one thread whatever the pool held.
const MIN_CENTERS_PER_RANGE: usize = 1024;

/// Centres between two looks at the shared pair count (which stops a search
/// that finds far more pairs than the memory allows).
const CENTERS_PER_LIMIT_CHECK: usize = 256;

/// [`NeighborList`] of the centres `0..n_centers` written over `out` (its
/// allocations reused); on error `out` is left empty.
pub(super) fn search_in_center_order(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
    n_centers: usize,
    out: &mut NeighborList,
) -> Result<(), NeighborError> {
    let result = search_ranges(positions, cell, pbc, opts, n_centers, out);
    if result.is_err() {
        out.clear();
    }
    result
}

fn search_ranges(
    positions: &[[f64; 3]],
    cell: Option<&Cell>,
    pbc: [bool; 3],
    opts: &NeighborOptions,
    n_centers: usize,
    out: &mut NeighborList,
) -> Result<(), NeighborError> {
    let n_centers = n_centers.min(positions.len());
    let plan = Plan::new(positions, cell, pbc, opts, n_centers, ALL_FIELDS)?;
    let Some(plan) = plan.filter(|_| n_centers > 0) else {
        out.clear();
        return Ok(());
    };
    let search = plan.search(positions, opts, ALL_FIELDS);
    let threads = rayon::current_num_threads().max(1);
    let n_ranges = threads.min(n_centers / MIN_CENTERS_PER_RANGE).max(1);
    let pairs_per_center = plan.expected_pairs / n_centers as f64;
    // The estimate sizes the first allocation only, never beyond a bound:
    // lists grow like any vector when they find more.
    let capacity =
        |centers: usize| (centers as f64 * pairs_per_center * 1.05 + 64.0).min(1e9) as usize;
    let found = AtomicUsize::new(0);
    let limit = (memory_budget_bytes() / plan.bytes_per_pair).min(MAX_ESTIMATED_PAIRS) as usize;
    let too_many = |found: usize| NeighborError::TooManyPairs {
        cutoff: opts.cutoff,
        estimated_pairs: found as f64,
        estimated_bytes: found as f64 * plan.bytes_per_pair,
        limit_pairs: MAX_ESTIMATED_PAIRS,
        budget_bytes: memory_budget_bytes(),
    };

    if n_ranges == 1 {
        out.clear();
        reserve_total(out, capacity(n_centers));
        // An empty region: every pair is appended straight to `out`.
        search.centers_into(0..n_centers, &mut Region::default(), out, &found, limit);
        let found = found.into_inner();
        return if found > limit {
            Err(too_many(found))
        } else {
            Ok(())
        };
    }

    // One region of `out` per range, sized by the estimate; a range that
    // finds more continues in its own spill list. Regions reuse the list's
    // memory (old pairs are overwritten, not cleared).
    // Ranges of about equal search cost, as sampled: with atoms numbered
    // at random, centre i of a half list has about (n − i)/n of its
    // neighbours, so equal numbers of centres would give the first thread
    // three quarters of the pairs (and overflow its region). Each region
    // is sized by its range's sampled pairs.
    let (ranges, sampled) = balanced_ranges(&search, n_centers, n_ranges);
    let lengths: Vec<usize> = sampled
        .iter()
        .map(|&pairs| (pairs * REGION_MARGIN + 256.0).min(1e9) as usize)
        .collect();
    let total: usize = lengths.iter().sum();
    resize_for_overwrite(&mut out.centers, total, 0);
    resize_for_overwrite(&mut out.neighbors, total, 0);
    resize_for_overwrite(&mut out.shifts, total, [0; 3]);
    resize_for_overwrite(&mut out.vectors, total, [0.0; 3]);
    resize_for_overwrite(&mut out.distances, total, 0.0);
    let mut spills: Vec<NeighborList> = ranges.iter().map(|_| NeighborList::default()).collect();
    let regions: Vec<Region<'_>> = split_by_lengths(&mut out.centers, &lengths)
        .into_iter()
        .zip(split_by_lengths(&mut out.neighbors, &lengths))
        .zip(split_by_lengths(&mut out.shifts, &lengths))
        .zip(split_by_lengths(&mut out.vectors, &lengths))
        .zip(split_by_lengths(&mut out.distances, &lengths))
        .map(
            |((((centers, neighbors), shifts), vectors), distances)| Region {
                centers,
                neighbors,
                shifts,
                vectors,
                distances,
                used: 0,
            },
        )
        .collect();
    let used: Vec<usize> = regions
        .into_par_iter()
        .zip(ranges.clone())
        .zip(spills.par_iter_mut())
        .map(|((mut region, range), spill)| {
            search.centers_into(range, &mut region, spill, &found, limit);
            region.used
        })
        .collect();
    let found = found.into_inner();
    if found > limit {
        return Err(too_many(found));
    }

    if spills.iter().all(NeighborList::is_empty) {
        // Close the gaps the estimate left between regions.
        let mut at = 0;
        let mut start = 0;
        for (&length, &used) in lengths.iter().zip(&used) {
            if at == start {
                // Already in place (the first region): nothing to move.
                at += used;
                start += length;
                continue;
            }
            out.centers.copy_within(start..start + used, at);
            out.neighbors.copy_within(start..start + used, at);
            out.shifts.copy_within(start..start + used, at);
            out.vectors.copy_within(start..start + used, at);
            out.distances.copy_within(start..start + used, at);
            at += used;
            start += length;
        }
        out.centers.truncate(at);
        out.neighbors.truncate(at);
        out.shifts.truncate(at);
        out.vectors.truncate(at);
        out.distances.truncate(at);
        return Ok(());
    }
    // Some range found far more pairs than estimated (atoms crowded in part
    // of the cell): rebuild the list region by region, spill by spill.
    let mut whole = NeighborList::default();
    reserve_total(&mut whole, found);
    let mut start = 0;
    for ((&length, &used), spill) in lengths.iter().zip(&used).zip(&spills) {
        let part = start..start + used;
        whole.centers.extend_from_slice(&out.centers[part.clone()]);
        whole
            .neighbors
            .extend_from_slice(&out.neighbors[part.clone()]);
        whole.shifts.extend_from_slice(&out.shifts[part.clone()]);
        whole.vectors.extend_from_slice(&out.vectors[part.clone()]);
        whole.distances.extend_from_slice(&out.distances[part]);
        whole.centers.extend_from_slice(&spill.centers);
        whole.neighbors.extend_from_slice(&spill.neighbors);
        whole.shifts.extend_from_slice(&spill.shifts);
        whole.vectors.extend_from_slice(&spill.vectors);
        whole.distances.extend_from_slice(&spill.distances);
        start += length;
    }
    *out = whole;
    Ok(())
}

/// A range's share of the output arrays: `used` pairs written so far.
#[derive(Default)]
struct Region<'a> {
    centers: &'a mut [u32],
    neighbors: &'a mut [u32],
    shifts: &'a mut [[i32; 3]],
    vectors: &'a mut [[f64; 3]],
    distances: &'a mut [f64],
    used: usize,
}

/// Every this many centres, one is searched ahead to estimate how the pairs
/// spread over the centres.
const SAMPLE_EVERY: usize = 64;

/// A range's region holds this many times the pairs sampled for it (plus
/// a few), which absorbs the sampling error.
const REGION_MARGIN: f64 = 1.1;

/// Splits the centres `0..n_centers` into `n_ranges` consecutive ranges of
/// about equal search cost (pairs plus a per-centre part), estimated from
/// the pairs of one centre in each block of [`SAMPLE_EVERY`] (standing for
/// its block); returns the ranges and their estimated pairs.
fn balanced_ranges(
    search: &Search<'_>,
    n_centers: usize,
    n_ranges: usize,
) -> (Vec<std::ops::Range<usize>>, Vec<f64>) {
    let samples: Vec<f64> = (0..n_centers.div_ceil(SAMPLE_EVERY))
        .into_par_iter()
        .map_init(Probe::default, |probe, k| {
            // A scrambled centre of the block, not its first: a fixed
            // stride aliases with the numbering of a crystal (every 64th
            // atom of an FCC lattice numbered cell by cell sits at the
            // same place in its cell and, periodically, at a face).
            let centre = (k * SAMPLE_EVERY + scramble(k) % SAMPLE_EVERY).min(n_centers - 1);
            let mut pairs = 0usize;
            search.center(centre, probe, |_, _, _, _, _| pairs += 1);
            // One pair more, so that pair-free stretches still count.
            (pairs + 1) as f64
        })
        .collect();
    // Centres in sample block k, and the pairs they are estimated to have.
    let block = |k: usize| (n_centers.min((k + 1) * SAMPLE_EVERY) - k * SAMPLE_EVERY) as f64;
    let pairs_of = |k: usize| samples[k] * block(k);
    // A centre costs about as much to search as the average centre has
    // pairs, whatever it keeps (walking its stencil, the bins' index
    // ranges), plus its pairs: cutting by pairs alone gave a half list of
    // randomly numbered atoms one range of 30 % of the centres and one of
    // 70 %, which took 1.5 times as long.
    let per_center = samples.iter().sum::<f64>() / samples.len() as f64;
    let cost = |k: usize| pairs_of(k) + per_center * block(k);
    let total: f64 = (0..samples.len()).map(cost).sum();
    let mut ranges = Vec::with_capacity(n_ranges);
    let mut estimates = Vec::with_capacity(n_ranges);
    let (mut start, mut sum, mut k) = (0, 0.0, 0);
    for r in 1..=n_ranges {
        let goal = total * r as f64 / n_ranges as f64;
        let mut end = start;
        let mut pairs = 0.0;
        while k < samples.len() && (r == n_ranges || sum + cost(k) / 2.0 < goal) {
            sum += cost(k);
            pairs += pairs_of(k);
            k += 1;
            end = n_centers.min(k * SAMPLE_EVERY);
        }
        ranges.push(start..end);
        estimates.push(pairs);
        start = end;
    }
    (ranges, estimates)
}

/// A fixed bijective mix of `k` (the SplitMix64 finaliser): deterministic,
/// with no period a numbering could share.
fn scramble(k: usize) -> usize {
    let mut z = (k as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as usize
}

/// Makes room for `pairs` pairs in every array of `list`.
fn reserve_total(list: &mut NeighborList, pairs: usize) {
    let more = pairs.saturating_sub(list.len());
    list.centers.reserve(more);
    list.neighbors.reserve(more);
    list.shifts.reserve(more);
    list.vectors.reserve(more);
    list.distances.reserve(more);
}

impl Search<'_> {
    /// Writes the pairs of the centres in `centers`, in `(i, j, S)` order,
    /// into `region` and, once a centre does not fit there, append them to
    /// `list`
    /// (that centre and all later ones, so that the order holds); adds
    /// their number to `found` and stops early once `found` exceeds `limit`
    /// (the caller then refuses the search).
    fn centers_into(
        &self,
        centers: std::ops::Range<usize>,
        region: &mut Region<'_>,
        list: &mut NeighborList,
        found: &AtomicUsize,
        limit: usize,
    ) {
        let mut scratch = Scratch::default();
        let mut counted = 0;
        let mut spilling = region.centers.is_empty();
        for i in centers {
            if i % CENTERS_PER_LIMIT_CHECK == 0 {
                let now = region.used + list.len();
                let total = found.fetch_add(now - counted, Ordering::Relaxed) + now - counted;
                counted = now;
                if total > limit {
                    return;
                }
            }
            self.sorted_pairs(i, &mut scratch);
            let Scratch {
                found: pairs,
                order,
                ..
            } = &scratch;
            let pair = |k: &u32| &pairs[*k as usize];
            let count = order.len();
            spilling = spilling || region.used + count > region.centers.len();
            if spilling {
                // One pass per array: each `extend` runs without per-pair
                // capacity checks.
                list.centers.resize(list.centers.len() + count, i as u32);
                list.neighbors.extend(order.iter().map(|k| pair(k).j));
                list.shifts.extend(order.iter().map(|k| pair(k).shift));
                list.vectors.extend(order.iter().map(|k| pair(k).vector));
                list.distances
                    .extend(order.iter().map(|k| pair(k).d2.sqrt()));
                continue;
            }
            let at = region.used..region.used + count;
            region.centers[at.clone()].fill(i as u32);
            for (slot, k) in region.neighbors[at.clone()].iter_mut().zip(order) {
                *slot = pair(k).j;
            }
            for (slot, k) in region.shifts[at.clone()].iter_mut().zip(order) {
                *slot = pair(k).shift;
            }
            for (slot, k) in region.vectors[at.clone()].iter_mut().zip(order) {
                *slot = pair(k).vector;
            }
            for (slot, k) in region.distances[at].iter_mut().zip(order) {
                *slot = pair(k).d2.sqrt();
            }
            region.used += count;
        }
        let now = region.used + list.len();
        found.fetch_add(now - counted, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a half list of atoms numbered at random, centre `i` keeps about
    /// `2P(1 − i/n)` pairs (P the mean). Cutting by pairs alone would give
    /// the first of two ranges `1 − 1/√2 ≈ 29 %` of the centres; with each
    /// centre also costing P, equal costs put the cut at `(3 − √5)/2 ≈ 38 %`.
    /// The estimates still count pairs only (they size the ranges' regions).
    #[test]
    fn ranges_balance_cost_not_pairs() {
        let (n, side) = (8192usize, 44.0);
        let mut rng = ddmlip_atoms::build::SplitMix64::new(11);
        let mut uniform = || (rng.uniform() + 1.0) * 0.5 * side;
        let positions: Vec<[f64; 3]> = (0..n).map(|_| [uniform(), uniform(), uniform()]).collect();
        let cell = Cell::new([[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]]);
        let opts = NeighborOptions {
            cutoff: 5.0,
            half: true,
        };
        let plan = Plan::new(&positions, Some(&cell), [true; 3], &opts, n, ALL_FIELDS)
            .unwrap()
            .unwrap();
        let search = plan.search(&positions, &opts, ALL_FIELDS);
        let (ranges, estimates) = balanced_ranges(&search, n, 2);
        assert_eq!(ranges.len(), 2);
        assert_eq!((ranges[0].start, ranges[0].end), (0, ranges[1].start));
        assert_eq!(ranges[1].end, n);
        let share = ranges[0].end as f64 / n as f64;
        assert!(
            (0.34..0.42).contains(&share),
            "first range holds {share:.3} of the centres"
        );
        // Pairs: the first range has more of them than the second.
        let mut list = NeighborList::default();
        search_in_center_order(&positions, Some(&cell), [true; 3], &opts, n, &mut list).unwrap();
        let first = list
            .centers
            .iter()
            .filter(|&&i| (i as usize) < ranges[0].end)
            .count();
        let (e0, e1) = (estimates[0], estimates[1]);
        assert!(first as f64 > 0.55 * list.len() as f64);
        assert!((e0 / (e0 + e1) - first as f64 / list.len() as f64).abs() < 0.05);
    }
}
