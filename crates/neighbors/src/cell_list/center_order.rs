//! The search behind [`NeighborList`]s: centres walked in index order, so
//! that each range of centres writes its pairs already in output order.
//!
//! The bin-order search of pair lists ([`search_chunks`]) keeps every pair
//! in per-chunk buffers and copies them into centre order afterwards: two
//! writes of every pair, and page faults on buffers as large as the list.
//! Here the first range of centres (all of them on one thread) appends
//! straight to the caller's list, reusing its allocation across calls; the
//! other ranges, one per further thread, append to their own lists, which
//! are copied behind it. The pairs and their order are those of the
//! bin-order search; only the order in which centres are visited differs.

use super::*;

/// Fewest centres a range gets: below this a second thread costs more in
/// start-up and copying than it saves.
const MIN_CENTERS_PER_RANGE: usize = 2048;

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
    out.clear();
    let Some(plan) = Plan::new(positions, cell, pbc, opts, n_centers, ALL_FIELDS)? else {
        return Ok(());
    };
    let n_centers = n_centers.min(positions.len());
    if n_centers == 0 {
        return Ok(());
    }
    let search = plan.search(positions, opts, ALL_FIELDS);
    let threads = rayon::current_num_threads().max(1);
    let n_ranges = threads.min(n_centers / MIN_CENTERS_PER_RANGE).max(1);
    let per_range = n_centers.div_ceil(n_ranges);
    let pairs_per_center = plan.expected_pairs / n_centers as f64;
    // The estimate sizes the first allocation only, never beyond a bound:
    // lists grow like any vector when they find more.
    let capacity =
        |centers: usize| (centers as f64 * pairs_per_center * 1.05 + 64.0).min(1e9) as usize;
    reserve_total(out, capacity(n_centers));

    let found = AtomicUsize::new(0);
    let limit = (memory_budget_bytes() / plan.bytes_per_pair).min(MAX_ESTIMATED_PAIRS) as usize;
    let mut tails: Vec<NeighborList> = (1..n_ranges).map(|_| NeighborList::default()).collect();
    let lists: Vec<&mut NeighborList> =
        std::iter::once(&mut *out).chain(tails.iter_mut()).collect();
    lists.into_par_iter().enumerate().for_each(|(r, list)| {
        let range = r * per_range..((r + 1) * per_range).min(n_centers);
        if r > 0 {
            reserve_total(list, capacity(range.len()));
        }
        search.centers_into(range, list, &found, limit);
    });
    let found = found.into_inner();
    if found > limit {
        out.clear();
        return Err(NeighborError::TooManyPairs {
            cutoff: opts.cutoff,
            estimated_pairs: found as f64,
            estimated_bytes: found as f64 * plan.bytes_per_pair,
            limit_pairs: MAX_ESTIMATED_PAIRS,
            budget_bytes: memory_budget_bytes(),
        });
    }
    for tail in &tails {
        out.centers.extend_from_slice(&tail.centers);
        out.neighbors.extend_from_slice(&tail.neighbors);
        out.shifts.extend_from_slice(&tail.shifts);
        out.vectors.extend_from_slice(&tail.vectors);
        out.distances.extend_from_slice(&tail.distances);
    }
    Ok(())
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
    /// Appends the pairs of the centres in `centers`, in `(i, j, S)` order,
    /// to `out`; adds their number to `found` and stops early once `found`
    /// exceeds `limit` (the caller then refuses the search).
    fn centers_into(
        &self,
        centers: std::ops::Range<usize>,
        out: &mut NeighborList,
        found: &AtomicUsize,
        limit: usize,
    ) {
        let mut scratch = Scratch::default();
        let mut counted = out.len();
        for i in centers {
            if i % CENTERS_PER_LIMIT_CHECK == 0 {
                let delta = out.len() - counted;
                let total = found.fetch_add(delta, Ordering::Relaxed) + delta;
                counted = out.len();
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
            // One pass per array: each `extend` runs without per-pair
            // capacity checks.
            let pair = |k: &u32| &pairs[*k as usize];
            out.centers
                .resize(out.centers.len() + order.len(), i as u32);
            out.neighbors.extend(order.iter().map(|k| pair(k).j));
            out.shifts.extend(order.iter().map(|k| pair(k).shift));
            out.vectors.extend(order.iter().map(|k| pair(k).vector));
            out.distances
                .extend(order.iter().map(|k| pair(k).d2.sqrt()));
        }
        found.fetch_add(out.len() - counted, Ordering::Relaxed);
    }
}
