//! Rank-order reductions and gathers shared by the MD loop and FIRE, and
//! the volume/stress helpers they report with.

use crate::MdError;
use ddmlip_atoms::Cell;
use ddmlip_comm::Communicator;

/// Sums of `sums` and maxima of `maxes` over ranks, folded in rank order
/// (the same bits on every rank).
pub(crate) fn reduce(
    comm: &dyn Communicator,
    sums: &[f64],
    maxes: &[f64],
) -> Result<(Vec<f64>, Vec<f64>), MdError> {
    let mut mine = sums.to_vec();
    mine.extend_from_slice(maxes);
    let all = comm
        .all_gather_f64(&mine)
        .map_err(|e| MdError::Comm(format!("step reduction: {e}")))?;
    let mut s = vec![0.0; sums.len()];
    let mut m = vec![f64::NEG_INFINITY; maxes.len()];
    for part in &all {
        if part.len() != mine.len() {
            return Err(MdError::Comm(
                "step reduction: ranks disagree on its length".into(),
            ));
        }
        for (acc, v) in s.iter_mut().zip(part) {
            *acc += v;
        }
        for (acc, v) in m.iter_mut().zip(&part[sums.len()..]) {
            *acc = acc.max(*v);
        }
    }
    Ok((s, m))
}

/// The arrays of every rank's owned rows, by global id (complete on every rank).
pub(crate) fn gather_rows(
    comm: &dyn Communicator,
    n_atoms: usize,
    gids: &[u64],
    arrays: &[&[[f64; 3]]],
) -> Result<Vec<Vec<[f64; 3]>>, MdError> {
    let err = |e: ddmlip_comm::CommError| MdError::Comm(format!("gather frame: {e}"));
    let ids = comm.all_gather_u64(gids).map_err(err)?;
    let mut out = Vec::with_capacity(arrays.len());
    for a in arrays {
        let flat: Vec<f64> = a.iter().flatten().copied().collect();
        let parts = comm.all_gather_f64(&flat).map_err(err)?;
        let mut rows = vec![[f64::NAN; 3]; n_atoms];
        for (ids, p) in ids.iter().zip(&parts) {
            for (k, &id) in ids.iter().enumerate() {
                rows[id as usize] = [p[3 * k], p[3 * k + 1], p[3 * k + 2]];
            }
        }
        out.push(rows);
    }
    Ok(out)
}

pub(crate) fn periodic_volume(cell: &Cell, pbc: [bool; 3]) -> Option<f64> {
    (pbc == [true; 3] && cell.volume() > 1e-12).then(|| cell.volume())
}

pub(crate) fn stress_voigt(geps: &[f64; 9], volume: f64) -> [f64; 6] {
    let sym = |a: usize, b: usize| 0.5 * (geps[a * 3 + b] + geps[b * 3 + a]) / volume;
    [
        sym(0, 0),
        sym(1, 1),
        sym(2, 2),
        sym(1, 2),
        sym(0, 2),
        sym(0, 1),
    ]
}
