//! The engine's [`Distributor`] over a [`Communicator`]: halo refresh,
//! reverse-sum and all-reduce on one rank's local rows.

use ddmlip_comm::{CommError, Communicator};
use ddmlip_engine::{DataMut, Distributor, EngineError};
use ddmlip_spec::MLIPSpec;
use std::time::Instant;

/// Message tag of halo traffic (collectives are matched by order).
const HALO_TAG: u32 = 7;

/// One rank's halo plan in local row numbers: for each peer, the owned rows
/// this rank sends, and the ghost rows where that peer's rows land. Both
/// sides list rows in the same order, so position k of a message is row k.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LocalHaloPlan {
    /// Rows this rank owns (local rows `0..n_owned`).
    pub n_owned: usize,
    /// Owned plus ghost rows (ghosts are rows `n_owned..n_local`).
    pub n_local: usize,
    /// (peer, owned rows sent to it).
    pub sends: Vec<(usize, Vec<u32>)>,
    /// (peer, ghost rows filled from it).
    pub recvs: Vec<(usize, Vec<u32>)>,
}

impl From<&crate::HaloPlan> for LocalHaloPlan {
    /// The plan of one rank of a single-system partition.
    fn from(plan: &crate::HaloPlan) -> Self {
        let rows = |lists: &[(usize, Vec<usize>)]| -> Vec<(usize, Vec<u32>)> {
            lists
                .iter()
                .map(|(peer, rows)| (*peer, rows.iter().map(|&r| r as u32).collect()))
                .collect()
        };
        Self {
            n_owned: plan.n_owned,
            n_local: plan.n_local,
            sends: rows(&plan.sends),
            recvs: rows(&plan.recvs),
        }
    }
}

/// A rank's decomposition runtime as the engine sees it.
pub struct HaloRuntime {
    /// The communicator the exchanges go through.
    pub comm: Box<dyn Communicator>,
    /// This rank's halo plan.
    pub plan: LocalHaloPlan,
    /// The spec deciding how gathers, scatters and opaque ops cross ranks.
    pub spec: MLIPSpec,
    /// Seconds spent in halo exchanges and all-reduces so far (packing,
    /// waiting for peers and unpacking included).
    pub comm_s: f64,
    /// Send buffers of the last exchange, one per peer, refilled by the
    /// next: a rank exchanging every step packs into memory it already has.
    packed_f64: Vec<Vec<f64>>,
    /// As `packed_f64`, for f32 tensors.
    packed_f32: Vec<Vec<f32>>,
}

fn comm_err(op: &str, e: CommError) -> EngineError {
    EngineError::Comm {
        op: op.to_string(),
        message: e.to_string(),
    }
}

macro_rules! typed_exchange {
    ($self:ident, $data:ident, $cols:ident, $ex:ident, $packed:ident, $send_lists:expr, $recv_lists:expr, $combine:expr) => {{
        let packed = &mut $self.$packed;
        packed.resize_with($send_lists.len(), Vec::new);
        for ((_, rows), buf) in $send_lists.iter().zip(packed.iter_mut()) {
            buf.clear();
            for &r in rows {
                buf.extend_from_slice(&$data[r as usize * $cols..(r as usize + 1) * $cols]);
            }
        }
        let refs: Vec<(usize, &[_])> = $send_lists
            .iter()
            .zip(packed.iter())
            .map(|((p, _), b)| (*p, b.as_slice()))
            .collect();
        let from: Vec<usize> = $recv_lists.iter().map(|(p, _)| *p).collect();
        let got = $self
            .comm
            .$ex(&refs, &from, HALO_TAG)
            .map_err(|e| comm_err("halo exchange", e))?;
        for ((_, rows), buf) in $recv_lists.iter().zip(got) {
            if buf.len() != rows.len() * $cols {
                return Err(EngineError::Comm {
                    op: "halo exchange".into(),
                    message: format!(
                        "received {} values, expected {}",
                        buf.len(),
                        rows.len() * $cols
                    ),
                });
            }
            for (k, &r) in rows.iter().enumerate() {
                let dst = &mut $data[r as usize * $cols..(r as usize + 1) * $cols];
                let src = &buf[k * $cols..(k + 1) * $cols];
                $combine(dst, src);
            }
        }
    }};
}

fn overwrite<T: Copy>(dst: &mut [T], src: &[T]) {
    dst.copy_from_slice(src);
}

fn add_into<T: Copy + std::ops::AddAssign>(dst: &mut [T], src: &[T]) {
    for (a, &b) in dst.iter_mut().zip(src) {
        *a += b;
    }
}

impl HaloRuntime {
    /// A runtime that has not communicated yet.
    pub fn new(comm: Box<dyn Communicator>, plan: LocalHaloPlan, spec: MLIPSpec) -> Self {
        Self {
            comm,
            plan,
            spec,
            comm_s: 0.0,
            packed_f64: Vec::new(),
            packed_f32: Vec::new(),
        }
    }

    fn check_rows(&self, len: usize, cols: usize, op: &str) -> Result<(), EngineError> {
        if len != self.plan.n_local * cols {
            return Err(EngineError::Comm {
                op: op.into(),
                message: format!(
                    "tensor has {} values, expected {} local rows × {cols}",
                    len, self.plan.n_local
                ),
            });
        }
        Ok(())
    }
}

impl Distributor for HaloRuntime {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn world_size(&self) -> usize {
        self.comm.size()
    }
    fn n_owned(&self) -> usize {
        self.plan.n_owned
    }
    fn n_local(&self) -> usize {
        self.plan.n_local
    }
    fn spec(&self) -> &MLIPSpec {
        &self.spec
    }
    fn sent_rows(&self) -> Vec<u32> {
        let mut rows: Vec<u32> = self
            .plan
            .sends
            .iter()
            .flat_map(|(_, rows)| rows.iter().copied())
            .collect();
        rows.sort_unstable();
        rows.dedup();
        rows
    }

    fn refresh(&mut self, data: DataMut<'_>, cols: usize) -> Result<(), EngineError> {
        let t0 = Instant::now();
        match data {
            DataMut::F64(d) => {
                self.check_rows(d.len(), cols, "halo refresh")?;
                typed_exchange!(
                    self,
                    d,
                    cols,
                    exchange_f64,
                    packed_f64,
                    self.plan.sends,
                    self.plan.recvs,
                    overwrite::<f64>
                );
            }
            DataMut::F32(d) => {
                self.check_rows(d.len(), cols, "halo refresh")?;
                typed_exchange!(
                    self,
                    d,
                    cols,
                    exchange_f32,
                    packed_f32,
                    self.plan.sends,
                    self.plan.recvs,
                    overwrite::<f32>
                );
            }
        }
        self.comm_s += t0.elapsed().as_secs_f64();
        Ok(())
    }

    fn reverse_sum(&mut self, data: DataMut<'_>, cols: usize) -> Result<(), EngineError> {
        let t0 = Instant::now();
        let ghost_start = self.plan.n_owned * cols;
        match data {
            DataMut::F64(d) => {
                self.check_rows(d.len(), cols, "halo reverse-sum")?;
                typed_exchange!(
                    self,
                    d,
                    cols,
                    exchange_f64,
                    packed_f64,
                    self.plan.recvs,
                    self.plan.sends,
                    add_into::<f64>
                );
                d[ghost_start..].iter_mut().for_each(|x| *x = 0.0);
            }
            DataMut::F32(d) => {
                self.check_rows(d.len(), cols, "halo reverse-sum")?;
                typed_exchange!(
                    self,
                    d,
                    cols,
                    exchange_f32,
                    packed_f32,
                    self.plan.recvs,
                    self.plan.sends,
                    add_into::<f32>
                );
                d[ghost_start..].iter_mut().for_each(|x| *x = 0.0);
            }
        }
        self.comm_s += t0.elapsed().as_secs_f64();
        Ok(())
    }

    fn all_reduce_sum(&mut self, data: DataMut<'_>) -> Result<(), EngineError> {
        let t0 = Instant::now();
        let out = match data {
            DataMut::F64(d) => self.comm.all_reduce_sum_f64(d),
            DataMut::F32(d) => self.comm.all_reduce_sum_f32(d),
        }
        .map_err(|e| comm_err("all_reduce", e));
        self.comm_s += t0.elapsed().as_secs_f64();
        out
    }

    fn abort(&mut self, message: &str) {
        self.comm.abort(message);
    }

    fn comm_seconds(&self) -> f64 {
        self.comm_s
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{halo_plans, partition_system};
    use ddmlip_comm::{thread_world, ThreadsConfig};

    /// A refresh reads only the sent rows (the others hold NaN and no ghost
    /// gets one), and a reverse sum changes only the sent rows, each of
    /// which receives at least one ghost's part.
    #[test]
    fn exchanges_touch_only_the_sent_rows() {
        let mut system = ddmlip_atoms::build::fcc(18, 4.0, 3);
        ddmlip_atoms::build::rattle_uniform(&mut system, 0.1, 5);
        for ranks in [1, 2, 3, 4, 8] {
            let partition = partition_system(&system, ranks, 3.0).unwrap();
            let plans: Vec<LocalHaloPlan> = halo_plans(&partition).iter().map(Into::into).collect();
            let comms = thread_world(ranks, ThreadsConfig::default()).unwrap();
            std::thread::scope(|scope| {
                for ((comm, plan), domain) in comms.into_iter().zip(plans).zip(&partition.ranks) {
                    scope.spawn(move || {
                        let globals = domain.local_globals();
                        let spec = MLIPSpec::standard_energy_model();
                        let mut halo = HaloRuntime::new(Box::new(comm), plan, spec);
                        let (n_owned, n_local, cols) = (halo.n_owned(), halo.n_local(), 2);
                        let sent = halo.sent_rows();
                        assert!(sent.windows(2).all(|w| w[0] < w[1]), "ascending, distinct");
                        assert!(sent.iter().all(|&r| (r as usize) < n_owned));
                        let mut data = vec![f64::NAN; n_local * cols];
                        for &r in &sent {
                            let g = globals[r as usize] as f64;
                            data[r as usize * cols..][..cols].copy_from_slice(&[g, -g]);
                        }
                        halo.refresh(DataMut::F64(&mut data), cols).unwrap();
                        for i in n_owned..n_local {
                            let g = globals[i] as f64;
                            assert_eq!(&data[i * cols..(i + 1) * cols], &[g, -g], "ghost {i}");
                        }
                        let mut data = vec![0.0; n_local * cols];
                        data[n_owned * cols..].fill(1.0);
                        halo.reverse_sum(DataMut::F64(&mut data), cols).unwrap();
                        for r in 0..n_owned {
                            let got = data[r * cols];
                            if sent.binary_search(&(r as u32)).is_ok() {
                                assert!(got >= 1.0, "sent row {r} received {got}");
                            } else {
                                assert_eq!(got, 0.0, "unsent row {r} changed");
                            }
                        }
                        assert!(data[n_owned * cols..].iter().all(|&x| x == 0.0));
                    });
                }
            });
        }
    }
}
