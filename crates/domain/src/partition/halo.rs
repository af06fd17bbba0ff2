//! Halo plans: which owned rows each rank sends to which peer, and where the
//! received rows land.

use super::Partition;
use serde::Serialize;
use thiserror::Error;

/// Communication plan of one rank.
///
/// For every ghost on rank `r` owned by rank `p`, `p` lists the owned row in
/// its `sends` entry for peer `r`, and `r` lists the ghost's local row in its
/// `recvs` entry for peer `p`, at the same position in both lists. Entries are
/// sorted by peer; a rank may be its own peer (ghosts of its own atoms in
/// cells thinner than the halo).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HaloPlan {
    /// This rank.
    pub rank: usize,
    /// Number of owned rows (local rows `0..n_owned`).
    pub n_owned: usize,
    /// Number of local rows (owned + ghosts).
    pub n_local: usize,
    /// `(peer, owned rows to send to it)`, ascending peer.
    pub sends: Vec<(usize, Vec<usize>)>,
    /// `(peer, local ghost rows filled from it)`, ascending peer.
    pub recvs: Vec<(usize, Vec<usize>)>,
}

/// Errors of the serial reference exchanges.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HaloError {
    /// `per_rank_data` does not have one buffer per plan.
    #[error("expected data for {expected} ranks, got {got}")]
    RankCount {
        /// Plans given (one per rank).
        expected: usize,
        /// Buffers given.
        got: usize,
    },
    /// `plans[i].rank` is not `i`, or a peer is not a rank.
    #[error(
        "plan {index} names rank {rank}; plans must be indexed by rank id and name existing peers"
    )]
    PlanOrder {
        /// Position in the plan list.
        index: usize,
        /// The rank the plan (or its peer) names.
        rank: usize,
    },
    /// A rank's buffer is not `n_local × width`.
    #[error("rank {rank}: expected {expected} values (n_local × width), got {got}")]
    BufferLength {
        /// The rank (0-based).
        rank: usize,
        /// n_local × width.
        expected: usize,
        /// The buffer's length.
        got: usize,
    },
    /// A plan names a row outside the rank's owned (send) or ghost (receive) rows.
    #[error("rank {rank}: row {row} is outside its {kind} rows")]
    RowOutOfRange {
        /// The rank (0-based).
        rank: usize,
        /// The local row named.
        row: usize,
        /// `owned` (send) or `ghost` (receive).
        kind: &'static str,
    },
    /// A send has no matching receive of the same length.
    #[error("rank {from} sends {sent} rows to rank {to}, which expects {expected}")]
    Mismatch {
        /// Sending rank.
        from: usize,
        /// Receiving rank.
        to: usize,
        /// Rows sent.
        sent: usize,
        /// Rows the receiver expects.
        expected: usize,
    },
}

/// Builds the halo plan of every rank (indexed by rank id).
pub fn halo_plans(partition: &Partition) -> Vec<HaloPlan> {
    let n_ranks = partition.ranks.len();
    let mut plans: Vec<HaloPlan> = partition
        .ranks
        .iter()
        .map(|d| HaloPlan {
            rank: d.rank,
            n_owned: d.n_owned(),
            n_local: d.n_local(),
            sends: Vec::new(),
            recvs: Vec::new(),
        })
        .collect();
    // Receivers in ascending order, so every sender's list is ascending in peer.
    for receiver in 0..n_ranks {
        let domain = &partition.ranks[receiver];
        let n_owned = domain.n_owned();
        // Ghosts are sorted by owner rank, so each owner is one contiguous run.
        let mut start = 0;
        while start < domain.ghosts.len() {
            let owner = domain.ghosts[start].owner_rank;
            let end = start
                + domain.ghosts[start..]
                    .iter()
                    .take_while(|g| g.owner_rank == owner)
                    .count();
            let ghost_rows: Vec<usize> = (start..end).map(|g| n_owned + g).collect();
            let owned_rows: Vec<usize> = domain.ghosts[start..end]
                .iter()
                .map(|g| g.owner_row)
                .collect();
            plans[receiver].recvs.push((owner, ghost_rows));
            plans[owner].sends.push((receiver, owned_rows));
            start = end;
        }
    }
    plans
}

fn check_buffers(plans: &[HaloPlan], data: &[Vec<f64>], width: usize) -> Result<(), HaloError> {
    if plans.len() != data.len() {
        return Err(HaloError::RankCount {
            expected: plans.len(),
            got: data.len(),
        });
    }
    for (index, (plan, buffer)) in plans.iter().zip(data).enumerate() {
        if plan.rank != index {
            return Err(HaloError::PlanOrder {
                index,
                rank: plan.rank,
            });
        }
        if let Some(&(peer, _)) = plan
            .sends
            .iter()
            .chain(&plan.recvs)
            .find(|(peer, _)| *peer >= plans.len())
        {
            return Err(HaloError::PlanOrder { index, rank: peer });
        }
        if buffer.len() != plan.n_local * width {
            return Err(HaloError::BufferLength {
                rank: plan.rank,
                expected: plan.n_local * width,
                got: buffer.len(),
            });
        }
        let bad_send = plan
            .sends
            .iter()
            .flat_map(|(_, rows)| rows)
            .find(|&&row| row >= plan.n_owned);
        if let Some(&row) = bad_send {
            return Err(HaloError::RowOutOfRange {
                rank: plan.rank,
                row,
                kind: "owned",
            });
        }
        let bad_recv = plan
            .recvs
            .iter()
            .flat_map(|(_, rows)| rows)
            .find(|&&row| row < plan.n_owned || row >= plan.n_local);
        if let Some(&row) = bad_recv {
            return Err(HaloError::RowOutOfRange {
                rank: plan.rank,
                row,
                kind: "ghost",
            });
        }
    }
    Ok(())
}

/// The receive list on `to` matching `from`'s send, checked for equal length.
fn matching_recv(
    plans: &[HaloPlan],
    from: usize,
    to: usize,
    sent: usize,
) -> Result<&[usize], HaloError> {
    let rows = plans
        .get(to)
        .and_then(|p| p.recvs.iter().find(|(peer, _)| *peer == from))
        .map(|(_, rows)| rows.as_slice())
        .unwrap_or(&[]);
    if rows.len() != sent {
        return Err(HaloError::Mismatch {
            from,
            to,
            sent,
            expected: rows.len(),
        });
    }
    Ok(rows)
}

/// Serial reference of a halo refresh: copies every owner row into each of
/// its ghost rows. `per_rank_data[r]` is row-major `n_local × width`.
pub fn apply_refresh_serial(
    plans: &[HaloPlan],
    per_rank_data: &mut [Vec<f64>],
    width: usize,
) -> Result<(), HaloError> {
    check_buffers(plans, per_rank_data, width)?;
    // Pack every message first so that self-sends and overlapping peers read
    // the values from before the exchange, as a real exchange would.
    let mut messages = Vec::new();
    for plan in plans {
        for (peer, rows) in &plan.sends {
            let recv_rows = matching_recv(plans, plan.rank, *peer, rows.len())?;
            let src = &per_rank_data[plan.rank];
            let packed: Vec<f64> = rows
                .iter()
                .flat_map(|&r| src[r * width..(r + 1) * width].iter().copied())
                .collect();
            messages.push((*peer, recv_rows, packed));
        }
    }
    for (to, rows, packed) in messages {
        let dst = &mut per_rank_data[to];
        for (i, &row) in rows.iter().enumerate() {
            dst[row * width..(row + 1) * width]
                .copy_from_slice(&packed[i * width..(i + 1) * width]);
        }
    }
    Ok(())
}

/// Serial reference of a reverse halo sum (the adjoint of a refresh): every
/// ghost row is added to its owner's row and then zeroed.
/// `per_rank_data[r]` is row-major `n_local × width`.
pub fn apply_reverse_sum_serial(
    plans: &[HaloPlan],
    per_rank_data: &mut [Vec<f64>],
    width: usize,
) -> Result<(), HaloError> {
    check_buffers(plans, per_rank_data, width)?;
    let mut messages = Vec::new();
    for plan in plans {
        for (peer, owned_rows) in &plan.sends {
            let ghost_rows = matching_recv(plans, plan.rank, *peer, owned_rows.len())?;
            let src = &mut per_rank_data[*peer];
            let mut packed = Vec::with_capacity(ghost_rows.len() * width);
            for &g in ghost_rows {
                packed.extend_from_slice(&src[g * width..(g + 1) * width]);
                src[g * width..(g + 1) * width].fill(0.0);
            }
            messages.push((plan.rank, owned_rows.as_slice(), packed));
        }
    }
    for (to, rows, packed) in messages {
        let dst = &mut per_rank_data[to];
        for (i, &row) in rows.iter().enumerate() {
            for (d, s) in dst[row * width..(row + 1) * width]
                .iter_mut()
                .zip(&packed[i * width..(i + 1) * width])
            {
                *d += s;
            }
        }
    }
    Ok(())
}
