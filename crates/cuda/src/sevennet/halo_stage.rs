//! A rank's halo exchanges through the host, moving only the rows that
//! cross ranks: for a refresh, the owned rows peers read (gathered on the
//! device) go down and the ghost rows come back up; for a reverse sum, the
//! ghost rows go down and the sums their owners receive come back up, to
//! be added on the device. The host halves ([`refresh_on_host`],
//! [`reverse_sum_on_host`]) are plain functions so that the CPU tests can
//! check them against the communicator's full-row exchanges.

use super::{dev_err, grid_1d, zeros, GpuFloat, Kernels, RankRows};
use crate::{CudaDevice, CudaError};
use cudarc::driver::{CudaSlice, PushKernelArg};
use ddmlip_engine::{Distributor, EngineError};

/// Which way a halo exchange goes.
#[derive(Clone, Copy)]
pub(crate) enum Exchange {
    /// Ghost rows get their owners' values.
    Refresh,
    /// Ghost rows are added into their owners' rows, then zeroed.
    ReverseSum,
}

/// Host half of a staged refresh. `packed` holds the `cols`-wide rows
/// `sent` names, in that order; `rows` has the local layout (`n_local`
/// rows). Afterwards every ghost row of `rows` holds its owner's values.
/// Owned rows outside `sent` are neither read nor written.
pub(crate) fn refresh_on_host<T: GpuFloat>(
    sent: &[u32],
    packed: &[T],
    rows: &mut [T],
    cols: usize,
    halo: &mut dyn Distributor,
) -> Result<(), EngineError> {
    for (&r, src) in sent.iter().zip(packed.chunks_exact(cols)) {
        let r = r as usize * cols;
        rows[r..r + cols].copy_from_slice(src);
    }
    halo.refresh(T::rows_mut(rows), cols)
}

/// Host half of a staged reverse sum. The ghost rows of `rows` (local
/// layout) hold the ghosts' values; afterwards `packed` holds, for each row
/// `sent` names, the sum of its ghosts' values on every rank, to be added
/// to the owned row on the device. Owned rows outside `sent` are neither
/// read nor written.
pub(crate) fn reverse_sum_on_host<T: GpuFloat>(
    sent: &[u32],
    rows: &mut [T],
    packed: &mut [T],
    cols: usize,
    halo: &mut dyn Distributor,
) -> Result<(), EngineError> {
    // The owners' rows start at zero, so that after the sum they hold only
    // what arrived.
    for &r in sent {
        let r = r as usize * cols;
        rows[r..r + cols].fill(T::from_f64(0.0));
    }
    halo.reverse_sum(T::rows_mut(rows), cols)?;
    for (&r, dst) in sent.iter().zip(packed.chunks_exact_mut(cols)) {
        let r = r as usize * cols;
        dst.copy_from_slice(&rows[r..r + cols]);
    }
    Ok(())
}

/// The buffers of a rank's staged exchanges, allocated once per
/// evaluation for the widest exchange and reused by all of them.
pub(crate) struct HaloStage<T> {
    /// Owned rows peers read, ascending and distinct (`Distributor::sent_rows`).
    sent: Vec<u32>,
    sent_d: CudaSlice<u32>,
    /// `sent.len()` rows of the widest exchange, on the host and the device.
    packed: Vec<T>,
    packed_d: CudaSlice<T>,
    /// `n_local` rows of the widest exchange: only the sent and ghost rows
    /// are ever written or read.
    rows: Vec<T>,
    n_owned: usize,
    n_local: usize,
}

impl<T: GpuFloat> HaloStage<T> {
    pub(crate) fn new(
        device: &CudaDevice,
        rank: &RankRows<'_>,
        n_local: usize,
        max_cols: usize,
    ) -> Result<Self, CudaError> {
        let sent = rank.halo.sent_rows();
        if let Some(&bad) = sent.iter().find(|&&r| r as usize >= rank.n_owned) {
            return Err(CudaError::Comm {
                rank: rank.halo.rank(),
                message: format!(
                    "the halo plan sends row {bad}, but the rank owns only {} rows",
                    rank.n_owned
                ),
            });
        }
        let sent_d = if sent.is_empty() {
            zeros(device, 1, "allocating the sent rows")?
        } else {
            device
                .stream()
                .clone_htod(&sent)
                .map_err(dev_err("uploading the sent rows"))?
        };
        let zero = T::from_f64(0.0);
        Ok(Self {
            packed: vec![zero; sent.len() * max_cols],
            packed_d: zeros(device, sent.len() * max_cols, "allocating halo buffers")?,
            rows: vec![zero; n_local * max_cols],
            sent,
            sent_d,
            n_owned: rank.n_owned,
            n_local,
        })
    }

    /// Runs `how` on the `cols`-wide rows of `data` (all `n_local` rows).
    pub(crate) fn exchange(
        &mut self,
        k: &Kernels,
        device: &CudaDevice,
        data: &mut CudaSlice<T>,
        cols: usize,
        rank: &mut RankRows<'_>,
        how: Exchange,
    ) -> Result<(), CudaError> {
        let stream = device.stream();
        let (n_sent, ghosts) = (self.sent.len(), self.n_owned * cols..self.n_local * cols);
        if self.rows.len() < ghosts.end || self.packed.len() < n_sent * cols {
            return Err(CudaError::Input(format!(
                "a halo exchange of {cols} columns is wider than its staging"
            )));
        }
        let (q_end, cols32) = (n_sent as u64, cols as u32);
        let packed = &mut self.packed[..n_sent * cols];
        let rows = &mut self.rows[..self.n_local * cols];
        let halo = &mut *rank.halo;
        let comm = |rank: usize, e: EngineError| CudaError::Comm {
            rank,
            message: e.to_string(),
        };
        match how {
            Exchange::Refresh => {
                if n_sent > 0 {
                    launch!(stream, &k.gather_rows, grid_1d(q_end * u64::from(cols32), 256),
                        "gathering halo rows"; &*data, &self.sent_d, &0u64, &q_end, &cols32,
                        &mut self.packed_d)?;
                    stream
                        .memcpy_dtoh(&self.packed_d.slice(..n_sent * cols), packed)
                        .map_err(dev_err("downloading halo rows"))?;
                }
                refresh_on_host(&self.sent, packed, rows, cols, halo)
                    .map_err(|e| comm(halo.rank(), e))?;
                if !ghosts.is_empty() {
                    stream
                        .memcpy_htod(&rows[ghosts.clone()], &mut data.slice_mut(ghosts))
                        .map_err(dev_err("uploading halo rows"))?;
                }
            }
            Exchange::ReverseSum => {
                if !ghosts.is_empty() {
                    stream
                        .memcpy_dtoh(&data.slice(ghosts.clone()), &mut rows[ghosts.clone()])
                        .map_err(dev_err("downloading halo rows"))?;
                }
                reverse_sum_on_host(&self.sent, rows, packed, cols, halo)
                    .map_err(|e| comm(halo.rank(), e))?;
                if n_sent > 0 {
                    stream
                        .memcpy_htod(&*packed, &mut self.packed_d.slice_mut(..n_sent * cols))
                        .map_err(dev_err("uploading halo sums"))?;
                    // `sent` rows are distinct: no two threads add into one value.
                    launch!(stream, &k.scatter_add_rows, grid_1d(q_end * u64::from(cols32), 256),
                        "adding halo sums"; &self.packed_d, &self.sent_d, &0u64, &q_end, &cols32,
                        &mut *data)?;
                }
                if !ghosts.is_empty() {
                    stream
                        .memset_zeros(&mut data.slice_mut(ghosts))
                        .map_err(dev_err("zeroing ghost rows"))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddmlip_comm::{thread_world, ThreadsConfig};
    use ddmlip_domain::{halo_plans, partition_system, HaloRuntime, LocalHaloPlan};
    use ddmlip_spec::MLIPSpec;

    /// The staged exchanges, with the device's gather and scatter-add done
    /// on the host, give exactly the communicator's full-row exchanges
    /// (values are small integers, so sums are exact in any order), in f64
    /// and f32, over 1 to 8 ranks of a periodic crystal.
    #[test]
    fn staged_exchanges_equal_the_full_row_exchanges() {
        let mut system = ddmlip_testkit::build::fcc(18, 5.3, 3);
        ddmlip_testkit::build::rattle_uniform(&mut system, 0.2, 7);
        for ranks in [1, 2, 3, 4, 8] {
            let partition = partition_system(&system, ranks, 6.0).unwrap();
            let plans: Vec<LocalHaloPlan> = halo_plans(&partition).iter().map(Into::into).collect();
            let comms = thread_world(ranks, ThreadsConfig::default()).unwrap();
            std::thread::scope(|scope| {
                for (comm, plan) in comms.into_iter().zip(plans) {
                    scope.spawn(move || {
                        let spec = MLIPSpec::standard_energy_model();
                        let mut halo = HaloRuntime::new(Box::new(comm), plan, spec);
                        check::<f64>(&mut halo, 3);
                        check::<f32>(&mut halo, 5);
                    });
                }
            });
        }
    }

    fn check<T: GpuFloat + PartialEq + std::fmt::Debug>(halo: &mut HaloRuntime, cols: usize) {
        let (n_owned, n_local) = (halo.n_owned(), halo.n_local());
        let rank = halo.rank();
        let sent = halo.sent_rows();
        let value = |i: usize, c: usize| T::from_f64(((rank * 131 + i * 7 + c) % 97) as f64);
        let device: Vec<T> = (0..n_local * cols)
            .map(|k| value(k / cols, k % cols))
            .collect();

        // Refresh: full rows through the communicator…
        let mut full = device.clone();
        halo.refresh(T::rows_mut(&mut full), cols).unwrap();
        // …and staged: gather the sent rows, refresh on a host buffer whose
        // other owned rows are stale, upload the ghost rows.
        let packed: Vec<T> = sent
            .iter()
            .flat_map(|&r| device[r as usize * cols..(r as usize + 1) * cols].to_vec())
            .collect();
        let mut host = vec![T::from_f64(-1.0); n_local * cols];
        refresh_on_host(&sent, &packed, &mut host, cols, halo).unwrap();
        let mut staged = device.clone();
        staged[n_owned * cols..].copy_from_slice(&host[n_owned * cols..]);
        assert_eq!(staged, full, "rank {rank}: refresh");

        // Reverse sum: full rows through the communicator…
        let mut full = device.clone();
        halo.reverse_sum(T::rows_mut(&mut full), cols).unwrap();
        // …and staged: download the ghost rows, sum on the host, add the
        // sums into the sent rows, zero the ghosts.
        let mut host = vec![T::from_f64(-1.0); n_local * cols];
        host[n_owned * cols..].copy_from_slice(&device[n_owned * cols..]);
        let mut packed = vec![T::from_f64(0.0); sent.len() * cols];
        reverse_sum_on_host(&sent, &mut host, &mut packed, cols, halo).unwrap();
        let mut staged = device.clone();
        for (k, &r) in sent.iter().enumerate() {
            for c in 0..cols {
                let (a, b): (f64, f64) = (
                    staged[r as usize * cols + c].into(),
                    packed[k * cols + c].into(),
                );
                staged[r as usize * cols + c] = T::from_f64(a + b);
            }
        }
        staged[n_owned * cols..].fill(T::from_f64(0.0));
        assert_eq!(staged, full, "rank {rank}: reverse sum");
    }
}
