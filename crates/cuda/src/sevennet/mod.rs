//! SevenNet on the GPU: energy, per-atom energies, forces and stress in f64
//! or f32, everything on the device between the upload of the positions and
//! the download of the results (the host reads the receiver and sender CSR
//! row offsets once, to cut the edge chunks).
//!
//! Per evaluation: the neighbour list ([`GpuNeighborList`]); per edge the
//! vector, the radial embedding and the spherical harmonics (in f64, rounded
//! once for f32, as the CPU path does); the sender CSR. Per interaction
//! block: the self-connection, Linear_1 and Linear_2 as cuBLAS GEMMs on
//! dense matrices; the radial MLP in edge chunks of at most
//! [`CHUNK_EDGES`] edges (never for all edges at once) consumed at once by
//! the convolution, one thread block per receiver row; the gate. The
//! readout, then the whole backward by hand: the convolution's backward per
//! sender-CSR position (weight and SH gradients, a warp per edge) and per
//! sender row (feature gradients), the MLP's backward in the same chunks.
//! Forces by receiver and sender CSR rows, the virial by a fixed-order
//! reduction of per-atom rows. No floating-point atomics: the same bits
//! every run.

mod host;
mod on_engine;

pub(crate) use on_engine::{SevenNetNets, SevenNetOnEngine};

pub use host::{
    activation_code, longest_row, row_chunks, ConvTables, DenseAffine, EdgeSetup, GateTables,
    HostLayer, HostModel, MAX_BASIS, MAX_LMAX_SH, PATH_FIELDS, RANGE_FIELDS,
};

use crate::model::stress_volume;
use crate::neighbors::GpuTimings;
use crate::{CudaDevice, CudaError, GpuNeighborList, GpuOutput, Precision};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use ddmlip_atoms::System;
use ddmlip_e3nn::sevennet::SevenNetWeights;
use ddmlip_engine::{DataMut, Distributor};
use std::time::Instant;

/// Edges per chunk of the fused radial MLP + convolution: the per-edge
/// weights exist for at most this many edges at a time (plus the longest
/// row, when one row has more).
pub const CHUNK_EDGES: u64 = 1 << 16;

/// A float the SevenNet kernels are compiled for (f64 or f32).
pub trait GpuFloat: DeviceRepr + ValidAsZeroBits + Copy + Into<f64> + 'static {
    /// Suffix of the kernel names (`f64`, `f32`).
    const SUFFIX: &'static str;
    /// Bytes per value.
    const BYTES: u64;
    /// Rounds an f64.
    fn from_f64(v: f64) -> Self;
    /// Host rows of this type as the halo exchanges take them.
    fn rows_mut(v: &mut [Self]) -> DataMut<'_>;
}

impl GpuFloat for f64 {
    const SUFFIX: &'static str = "f64";
    const BYTES: u64 = 8;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn rows_mut(v: &mut [Self]) -> DataMut<'_> {
        DataMut::F64(v)
    }
}

impl GpuFloat for f32 {
    const SUFFIX: &'static str = "f32";
    const BYTES: u64 = 4;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn rows_mut(v: &mut [Self]) -> DataMut<'_> {
        DataMut::F32(v)
    }
}

/// `struct ConvParams` of the kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ConvParams {
    n_paths: u32,
    dim_in: u32,
    dim_w: u32,
    dim_msg: u32,
    dim_sh: u32,
    n_ranges: u32,
    n_range_slots: u32,
    t_size: u32,
    inv_den: f64,
    /// Message rows component-major within each path block (1) or in
    /// e3nn's order (0).
    msg_component_major: u32,
    _pad: u32,
}

// SAFETY: plain `repr(C)` data matching `struct ConvParams` in sevennet.cu.
unsafe impl DeviceRepr for ConvParams {}

/// `struct EdgeParams` of the kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct EdgeParams {
    freqs: [f64; MAX_BASIS],
    n_basis: u32,
    lmax: u32,
    envelope: i32,
    _pad: u32,
    cutoff: f64,
    cutoff_on: f64,
    p: f64,
}

// SAFETY: plain `repr(C)` data matching `struct EdgeParams` in sevennet.cu.
unsafe impl DeviceRepr for EdgeParams {}

/// A rank's place in a decomposed evaluation: the first `n_owned` atoms of
/// the system it is given are the ones it owns, the rest are ghosts that
/// `halo` fills from (and returns gradients to) their owners.
pub struct RankRows<'a> {
    /// Atoms this rank owns (the first rows).
    pub n_owned: usize,
    /// The rank's halo plan and communicator.
    pub halo: &'a mut dyn Distributor,
}

struct DeviceAffine<T> {
    dim_in: usize,
    dim_out: usize,
    matrix: CudaSlice<T>,
    bias: Option<CudaSlice<T>>,
}

struct DeviceLayer<T> {
    self_connection: DeviceAffine<T>,
    linear_1: DeviceAffine<T>,
    linear_2: DeviceAffine<T>,
    radial_widths: Vec<usize>,
    radial: Vec<CudaSlice<T>>,
    paths: CudaSlice<i32>,
    nz_idx: CudaSlice<i32>,
    nz_coef: CudaSlice<T>,
    col_path: CudaSlice<i32>,
    ranges: CudaSlice<i32>,
    range_paths: CudaSlice<i32>,
    slot_range: CudaSlice<i32>,
    params: ConvParams,
    gate_forward: CudaSlice<i32>,
    gate_backward: CudaSlice<i32>,
    gate_activation: i32,
    dim_gate_in: usize,
    dim_out: usize,
}

pub(crate) struct Kernels {
    pub(crate) filters: CudaFunction,
    pub(crate) conv_fwd: CudaFunction,
    pub(crate) conv_bwd_edge: CudaFunction,
    pub(crate) conv_bwd_h: CudaFunction,
    pub(crate) silu_copy: CudaFunction,
    pub(crate) silu_backward: CudaFunction,
    pub(crate) gate_fwd: CudaFunction,
    pub(crate) gate_bwd: CudaFunction,
    pub(crate) add_bias: CudaFunction,
    pub(crate) embed_species: CudaFunction,
    pub(crate) gather_rows: CudaFunction,
    pub(crate) scatter_add_rows: CudaFunction,
    pub(crate) readout: CudaFunction,
    pub(crate) readout_bwd: CudaFunction,
    pub(crate) edge_features: CudaFunction,
    pub(crate) edge_features_bwd: CudaFunction,
    pub(crate) edge_rows: CudaFunction,
    pub(crate) edge_rows_bwd: CudaFunction,
    pub(crate) sender_count: CudaFunction,
    pub(crate) sender_fill: CudaFunction,
    pub(crate) sender_sort: CudaFunction,
    pub(crate) forces_virial: CudaFunction,
    pub(crate) scan_counts: CudaFunction,
    pub(crate) column_sums: CudaFunction,
    pub(crate) column_sums_f64: CudaFunction,
}

impl Kernels {
    /// The SevenNet module's kernels for floats `T` (and the shared scan
    /// and reductions), compiled or read from the cache.
    pub(crate) fn load<T: GpuFloat>(device: &CudaDevice) -> Result<Self, CudaError> {
        let module = device.load_module("sevennet", crate::kernels::SEVENNET_KERNELS)?;
        let f = |name: &str| -> Result<CudaFunction, CudaError> {
            let full = format!("{name}_{}", T::SUFFIX);
            module
                .load_function(&full)
                .map_err(|e| CudaError::driver(format!("loading kernel {full}"), e))
        };
        let plain = |name: &str| -> Result<CudaFunction, CudaError> {
            module
                .load_function(name)
                .map_err(|e| CudaError::driver(format!("loading kernel {name}"), e))
        };
        Ok(Kernels {
            filters: f("sn_filters")?,
            conv_fwd: f("sn_conv_fwd")?,
            conv_bwd_edge: f("sn_conv_bwd_edge")?,
            conv_bwd_h: f("sn_conv_bwd_h")?,
            silu_copy: f("sn_silu_copy")?,
            silu_backward: f("sn_silu_backward")?,
            gate_fwd: f("sn_gate_fwd")?,
            gate_bwd: f("sn_gate_bwd")?,
            add_bias: f("sn_add_bias")?,
            embed_species: f("sn_embed_species")?,
            gather_rows: f("sn_gather_rows")?,
            scatter_add_rows: f("sn_scatter_add_rows")?,
            readout: f("sn_readout")?,
            readout_bwd: f("sn_readout_bwd")?,
            edge_features: f("sn_edge_features")?,
            edge_features_bwd: f("sn_edge_features_bwd")?,
            edge_rows: f("sn_edge_rows")?,
            edge_rows_bwd: f("sn_edge_rows_bwd")?,
            sender_count: plain("sn_sender_count")?,
            sender_fill: plain("sn_sender_fill")?,
            sender_sort: plain("sn_sender_sort")?,
            forces_virial: plain("sn_forces_virial")?,
            scan_counts: device.function("scan_counts")?,
            column_sums: device.function(&format!("column_sums_{}", T::SUFFIX))?,
            column_sums_f64: device.function("column_sums_f64")?,
        })
    }
}

struct DeviceNet<T> {
    embedding: CudaSlice<T>,
    layers: Vec<DeviceLayer<T>>,
    readout_v: CudaSlice<T>,
    readout_c: T,
    scale: CudaSlice<T>,
    shift: CudaSlice<T>,
    edge: EdgeParams,
    k: Kernels,
}

enum Net {
    F64(DeviceNet<f64>),
    F32(DeviceNet<f32>),
}

/// A SevenNet with its weights on a CUDA device in one precision.
pub struct GpuSevenNet {
    host: HostModel,
    net: Net,
    precision: Precision,
}

impl std::fmt::Debug for GpuSevenNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSevenNet")
            .field("precision", &self.precision)
            .field("layers", &self.host.layers.len())
            .finish()
    }
}

pub(crate) fn dev_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::driver(what, e)
}

pub(crate) fn upload<T: DeviceRepr + ValidAsZeroBits>(
    device: &CudaDevice,
    data: &[T],
) -> Result<CudaSlice<T>, CudaError> {
    if data.is_empty() {
        // A one-element placeholder: kernels never read an empty table.
        return zeros(device, 1, "allocating model weights");
    }
    device
        .stream()
        .clone_htod(data)
        .map_err(dev_err("uploading model weights"))
}

pub(crate) fn upload_t<T: GpuFloat>(
    device: &CudaDevice,
    data: &[f64],
) -> Result<CudaSlice<T>, CudaError> {
    let v: Vec<T> = data.iter().map(|&x| T::from_f64(x)).collect();
    upload(device, &v)
}

pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    device: &CudaDevice,
    len: usize,
    what: &'static str,
) -> Result<CudaSlice<T>, CudaError> {
    device
        .stream()
        .alloc_zeros::<T>(len.max(1))
        .map_err(dev_err(what))
}

pub(crate) fn grid_1d(n: u64, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(u64::from(threads)).max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn per_row(rows: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) mod halo_stage;
use halo_stage::{Exchange, HaloStage};

/// Row-major `C (rows × n) = A (rows × k) · B + beta·C`, with `B` stored
/// `k × n`, or with `b_transposed` stored `n × k` (then `A · Bᵀ`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: GpuFloat, A: DevicePtr<T>, B: DevicePtr<T>, C: DevicePtrMut<T>>(
    blas: &CudaBlas,
    rows: usize,
    k: usize,
    n: usize,
    a: &A,
    b: &B,
    b_transposed: bool,
    beta: f64,
    c: &mut C,
) -> Result<(), CudaError>
where
    CudaBlas: Gemm<T>,
{
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| CudaError::Input(format!("GEMM dimension {v} too large")))
    };
    // Column-major view: Cᵀ (n × rows) = op(B) (n × k) · Aᵀ (k × rows).
    let cfg = GemmConfig {
        transa: if b_transposed {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        },
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: int(n)?,
        n: int(rows)?,
        k: int(k)?,
        alpha: T::from_f64(1.0),
        lda: int(if b_transposed { k } else { n })?,
        ldb: int(k)?,
        beta: T::from_f64(beta),
        ldc: int(n)?,
    };
    // SAFETY: A holds rows·k, B k·n and C rows·n values (the callers size
    // every buffer from the same widths).
    unsafe { blas.gemm(cfg, b, a, c) }
        .map_err(|e| CudaError::driver("a cuBLAS GEMM", format!("{e:?}")))
}

impl GpuSevenNet {
    /// Puts the SevenNet of `weights` (modality `modal` of a multi-fidelity
    /// checkpoint, else `None`) on `device` in `precision`. Errors name what
    /// the GPU path does not cover (see [`HostModel::new`]).
    pub fn new(
        device: &CudaDevice,
        weights: &SevenNetWeights,
        modal: Option<&str>,
        precision: Precision,
    ) -> Result<Self, CudaError> {
        Self::from_host(device, HostModel::new(weights, modal)?, precision)
    }

    /// [`GpuSevenNet::new`] on the weights of the checkpoint at `path`
    /// (errors name the file).
    pub fn from_checkpoint(
        device: &CudaDevice,
        path: &std::path::Path,
        modal: Option<&str>,
        precision: Precision,
    ) -> Result<Self, CudaError> {
        let weights = SevenNetWeights::from_checkpoint(path)
            .map_err(|e| CudaError::Input(format!("{}: {e}", path.display())))?;
        Self::new(device, &weights, modal, precision)
    }

    /// Puts a prepared [`HostModel`] on `device` in `precision`.
    pub fn from_host(
        device: &CudaDevice,
        host: HostModel,
        precision: Precision,
    ) -> Result<Self, CudaError> {
        let net = match precision {
            Precision::F64 => Net::F64(DeviceNet::new(device, &host)?),
            Precision::F32 => Net::F32(DeviceNet::new(device, &host)?),
        };
        Ok(Self {
            host,
            net,
            precision,
        })
    }

    /// The precision of the evaluation.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The host description the weights came from.
    pub fn host(&self) -> &HostModel {
        &self.host
    }

    /// Cutoff of the neighbour list (Å).
    pub fn cutoff(&self) -> f64 {
        self.host.edge.cutoff
    }

    /// Bytes per float of the evaluation.
    pub fn float_bytes(&self) -> u64 {
        match self.precision {
            Precision::F64 => 8,
            Precision::F32 => 4,
        }
    }

    /// Evaluates `system` on `device`: energy, per-atom energies, forces,
    /// stress. Errors: elements the model does not know, the neighbour
    /// list's input errors, and [`CudaError::OutOfMemory`] (checked before
    /// allocating) naming how many atoms of this density would fit.
    pub fn evaluate(&self, device: &CudaDevice, system: &System) -> Result<GpuOutput, CudaError> {
        self.evaluate_rows(device, system, None)
    }

    /// One rank's part of a decomposed evaluation: `local` holds the rank's
    /// owned atoms (rows `0..rank.n_owned`) and then its ghosts (images
    /// within the cutoff of its domain, at their image positions; no cell).
    /// Node features of the ghosts come from their owners through
    /// `rank.halo` after every interaction block, and their gradients go
    /// back the same way, so the owned rows get the single-process values.
    /// Returns this rank's share: energy and virial summed over its owned
    /// atoms and edges (to be summed over ranks), per-atom energies and
    /// forces of its owned atoms (complete), no stress.
    pub fn evaluate_rank(
        &self,
        device: &CudaDevice,
        local: &System,
        rank: RankRows<'_>,
    ) -> Result<GpuOutput, CudaError> {
        self.evaluate_rows(device, local, Some(rank))
    }

    fn evaluate_rows(
        &self,
        device: &CudaDevice,
        system: &System,
        mut rank: Option<RankRows<'_>>,
    ) -> Result<GpuOutput, CudaError> {
        let types: Vec<i32> = system
            .numbers
            .iter()
            .enumerate()
            .map(|(i, &z)| {
                self.host.type_index(z).map(|t| t as i32).ok_or_else(|| {
                    CudaError::Input(format!(
                        "atom {i}: element Z={z} is not one of this model's {} species",
                        self.host.species.len()
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        if types.is_empty() {
            return Err(CudaError::Input("the system has no atoms".into()));
        }
        // Freed buffers of earlier work return to the driver at a
        // synchronisation: only then does the free memory tell what is usable.
        device.synchronize()?;
        let (free_before, _) = device.memory()?;
        let start = Instant::now();
        let mut list = GpuNeighborList::build(device, system, self.cutoff())?;
        // A rank's ghosts are senders only: their own rows would compute
        // messages that the next refresh overwrites.
        let row_start = match &rank {
            Some(r) => list.keep_first_centers(device, r.n_owned)?,
            None => device
                .stream()
                .clone_dtoh(&list.row_start)
                .map_err(dev_err("downloading the row offsets"))?,
        };
        device.synchronize()?;
        let neighbors_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let (n, ne) = (list.n_atoms as u64, list.n_pairs as u64);
        let cap = CHUNK_EDGES.min(ne).max(longest_row(&row_start)).max(1);
        let estimated = self.host.memory_bytes(n, ne, self.float_bytes(), cap);
        // A fifth of the free memory stays in reserve: the stream-ordered
        // allocator's pool keeps freed blocks until the next synchronisation,
        // so the high-water mark exceeds the live buffers the estimate counts
        // (on an H200, 2.74M atoms of Si at an estimated 115 GiB did not fit).
        let usable = free_before - free_before / 5;
        let refuse = |fit: u64| CudaError::OutOfMemory {
            what: format!("SevenNet on {n} atoms ({ne} edges)"),
            device: device.index(),
            needed_bytes: estimated,
            free_bytes: free_before,
            reserved_bytes: free_before - usable,
            atoms_that_fit: Some(fit),
        };
        let fit = (n as f64 * usable as f64 / estimated as f64).floor() as u64;
        if estimated > usable {
            return Err(refuse(fit));
        }
        let run = match &self.net {
            Net::F64(net) => net.run(device, &list, &row_start, &types, cap, rank.as_mut()),
            Net::F32(net) => net.run(device, &list, &row_start, &types, cap, rank.as_mut()),
        };
        let out = match run {
            Ok(out) => out,
            // The estimate passed but the driver ran out: still a typed
            // error that says how many atoms should fit.
            Err(CudaError::Driver { message, .. }) if message.contains("OUT_OF_MEMORY") => {
                return Err(refuse(fit.min(n.saturating_sub(1)) * 4 / 5));
            }
            Err(e) => return Err(e),
        };
        let model_s = start.elapsed().as_secs_f64();
        let stress = stress_volume(system)
            .filter(|_| rank.is_none())
            .map(|v| out.virial.map(|w| w / v.max(1e-3)));
        Ok(GpuOutput {
            energy: out.energy,
            atomic_energies: out.atomic,
            forces: out.forces,
            virial: out.virial,
            stress,
            n_pairs: list.n_pairs,
            timings: GpuTimings {
                neighbors_s,
                model_s,
            },
            peak_bytes: Some(out.min_free.map_or(0, |f| free_before.saturating_sub(f))),
            estimated_bytes: Some(estimated),
        })
    }
}

struct RunOutput {
    energy: f64,
    atomic: Vec<f64>,
    forces: Vec<[f64; 3]>,
    virial: [f64; 6],
    min_free: Option<u64>,
}

/// Chunk scratch of the fused radial MLP.
struct Scratch<T> {
    pre: Vec<CudaSlice<T>>,
    act: Vec<CudaSlice<T>>,
    w: CudaSlice<T>,
    gw: CudaSlice<T>,
    ga: CudaSlice<T>,
    gb: CudaSlice<T>,
    /// Filter rows (chunk positions × t_size).
    filt: CudaSlice<T>,
}

/// The sender CSR of a neighbour list: for every atom the edges it sends
/// (is the neighbour of), in ascending edge order.
pub(crate) struct SenderCsr {
    /// Row offsets, `n_atoms + 1`.
    pub(crate) start: CudaSlice<u64>,
    /// Edge indices, row after row.
    pub(crate) edges: CudaSlice<u32>,
}

impl SenderCsr {
    /// Counts, scans, fills (integer atomics) and sorts each row, so that
    /// the fill order changes nothing downstream.
    pub(crate) fn build(
        device: &CudaDevice,
        k: &Kernels,
        list: &GpuNeighborList,
    ) -> Result<Self, CudaError> {
        let stream = device.stream();
        let (n, ne) = (list.n_atoms, list.n_pairs);
        let (n32, ne64) = (n as u32, ne as u64);
        let mut counts = zeros::<u32>(device, n, "allocating sender counts")?;
        launch!(stream, &k.sender_count, grid_1d(ne64, 256), "counting senders";
            &list.neighbors, &ne64, &mut counts)?;
        let mut start = zeros::<u64>(device, n + 1, "allocating sender offsets")?;
        launch!(stream, &k.scan_counts, per_row(1, 1024), "the sender scan";
            &counts, &mut start, &n32)?;
        let mut cursor = zeros::<u32>(device, n, "allocating sender cursors")?;
        let mut edges = zeros::<u32>(device, ne, "allocating the sender list")?;
        launch!(stream, &k.sender_fill, grid_1d(ne64, 256), "filling the sender list";
            &list.neighbors, &ne64, &start, &mut cursor, &mut edges)?;
        launch!(stream, &k.sender_sort, grid_1d(u64::from(n32), 128), "sorting the sender list";
            &start, &n32, &mut edges)?;
        Ok(Self { start, edges })
    }
}

/// What an evaluation hands back, on the host.
pub(crate) struct Finished {
    /// Energy summed over the owned atoms (f64).
    pub(crate) energy: f64,
    /// Owned atoms' energies.
    pub(crate) atomic: Vec<f64>,
    /// Owned atoms' forces, complete (ghost shares summed in).
    pub(crate) forces: Vec<[f64; 3]>,
    /// Virial summed over the rank's edges (Voigt).
    pub(crate) virial: [f64; 6],
}

/// The end every GPU model shares: forces and per-atom virials from the
/// edges' `(vectors, dE/dr_e)` by receiver and sender CSR rows, the virial
/// summed into `totals[1..7]` (`totals[0]` already holds the energy), the
/// results downloaded and, for a rank, its ghosts' forces summed into
/// their owners through the halo.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish<T: GpuFloat>(
    device: &CudaDevice,
    k: &Kernels,
    list: &GpuNeighborList,
    sender: &SenderCsr,
    (vectors, grad_vec): (&CudaSlice<f64>, &CudaSlice<f64>),
    energies: &CudaSlice<T>,
    totals: &mut CudaSlice<f64>,
    n_owned: usize,
    rank: Option<&mut RankRows<'_>>,
) -> Result<Finished, CudaError> {
    let stream = device.stream();
    let n = list.n_atoms;
    let n32 = n as u32;
    let mut forces = zeros::<f64>(device, 3 * n, "allocating forces")?;
    let mut virial = zeros::<f64>(device, 6 * n, "allocating virials")?;
    launch!(stream, &k.forces_virial, grid_1d(u64::from(n32), 128), "forces and virials";
        vectors, grad_vec, &list.row_start, &sender.start, &sender.edges, &n32, &mut forces,
        &mut virial)?;
    {
        let mut w_out = totals.slice_mut(1..7);
        let six = 6u32;
        launch!(stream, &k.column_sums_f64, per_row(6, 256), "the virial sum";
            &virial, &n32, &six, &mut w_out)?;
    }
    let e_host = stream
        .clone_dtoh(energies)
        .map_err(dev_err("downloading energies"))?;
    let mut f_host = stream
        .clone_dtoh(&forces)
        .map_err(dev_err("downloading forces"))?;
    let t_host = stream
        .clone_dtoh(&*totals)
        .map_err(dev_err("downloading totals"))?;
    device.synchronize()?;
    // Forces on ghosts are parts of their owners' forces.
    if let Some(r) = rank {
        let halo = &mut *r.halo;
        halo.reverse_sum(DataMut::F64(&mut f_host[..3 * n]), 3)
            .map_err(|e| CudaError::Comm {
                rank: halo.rank(),
                message: e.to_string(),
            })?;
    }
    let mut virial6 = [0.0; 6];
    virial6.copy_from_slice(&t_host[1..7]);
    Ok(Finished {
        energy: t_host[0],
        atomic: e_host[..n_owned].iter().map(|&v| v.into()).collect(),
        forces: f_host[..3 * n_owned]
            .chunks_exact(3)
            .map(|c| [c[0], c[1], c[2]])
            .collect(),
        virial: virial6,
    })
}

impl<T: GpuFloat> DeviceNet<T>
where
    CudaBlas: Gemm<T>,
{
    fn new(device: &CudaDevice, host: &HostModel) -> Result<Self, CudaError> {
        let k = Kernels::load::<T>(device)?;
        let affine = |a: &DenseAffine| -> Result<DeviceAffine<T>, CudaError> {
            Ok(DeviceAffine {
                dim_in: a.dim_in,
                dim_out: a.dim_out,
                matrix: upload_t(device, &a.matrix)?,
                bias: a.bias.as_deref().map(|b| upload_t(device, b)).transpose()?,
            })
        };
        let mut layers = Vec::with_capacity(host.layers.len());
        for l in &host.layers {
            let c = &l.conv;
            let u = |v: usize| v as u32;
            layers.push(DeviceLayer {
                self_connection: affine(&l.self_connection)?,
                linear_1: affine(&l.linear_1)?,
                linear_2: affine(&l.linear_2)?,
                radial_widths: l.radial_widths.clone(),
                radial: l
                    .radial
                    .iter()
                    .map(|w| upload_t(device, w))
                    .collect::<Result<_, _>>()?,
                paths: upload(device, &c.paths)?,
                nz_idx: upload(device, &c.nz_idx)?,
                nz_coef: upload_t(device, &c.nz_coef)?,
                col_path: upload(device, &c.col_path)?,
                ranges: upload(device, &c.ranges)?,
                range_paths: upload(device, &c.range_paths)?,
                slot_range: upload(device, &c.slot_range)?,
                params: ConvParams {
                    n_paths: u(c.n_paths),
                    dim_in: u(c.dim_in),
                    dim_w: u(c.dim_w),
                    dim_msg: u(c.dim_msg),
                    dim_sh: u(c.dim_sh),
                    n_ranges: u(c.n_ranges()),
                    n_range_slots: u(c.slot_range.len()),
                    t_size: u(c.t_size),
                    inv_den: c.inv_den,
                    msg_component_major: 0,
                    _pad: 0,
                },
                gate_forward: upload(device, &l.gate.forward)?,
                gate_backward: upload(device, &l.gate.backward)?,
                gate_activation: l.gate.gate_activation,
                dim_gate_in: l.gate.dim_in,
                dim_out: l.gate.dim_out,
            });
        }
        let mut freqs = [0.0; MAX_BASIS];
        freqs[..host.edge.freqs.len()].copy_from_slice(&host.edge.freqs);
        let bias = host.readout.bias.as_ref().map_or(0.0, |b| b[0]);
        Ok(Self {
            embedding: upload_t(device, &host.embedding_table)?,
            layers,
            readout_v: upload_t(device, &host.readout.matrix)?,
            readout_c: T::from_f64(bias),
            scale: upload_t(device, &host.scale)?,
            shift: upload_t(device, &host.shift)?,
            edge: EdgeParams {
                freqs,
                n_basis: host.edge.freqs.len() as u32,
                lmax: host.edge.lmax_sh as u32,
                envelope: host.edge.envelope,
                _pad: 0,
                cutoff: host.edge.cutoff,
                cutoff_on: host.edge.cutoff_on,
                p: host.edge.p,
            },
            k,
        })
    }

    fn dim0(&self) -> usize {
        self.layers
            .first()
            .map_or(self.readout_v.len(), |l| l.linear_1.dim_in)
    }

    /// `out (rows × dim) += bias` when the affine map has one.
    fn add_bias(
        &self,
        device: &CudaDevice,
        a: &DeviceAffine<T>,
        rows: u32,
        out: &mut CudaSlice<T>,
    ) -> Result<(), CudaError> {
        if let Some(bias) = &a.bias {
            let dim = a.dim_out as u32;
            launch!(device.stream(), &self.k.add_bias, grid_1d(u64::from(rows) * u64::from(dim), 256),
                "adding a bias"; bias, &rows, &dim, out)?;
        }
        Ok(())
    }

    /// Radial MLP of `rows` edges (`input` rows × n_basis) into `s.w`,
    /// keeping the hidden pre-activations and activations in `s`.
    fn mlp_forward(
        &self,
        device: &CudaDevice,
        layer: &DeviceLayer<T>,
        input: &CudaView<'_, T>,
        rows: usize,
        s: &mut Scratch<T>,
    ) -> Result<(), CudaError> {
        let blas = device.blas();
        let nl = layer.radial.len();
        let w = &layer.radial_widths;
        for k in 0..nl {
            let (i, o) = (w[k], w[k + 1]);
            let last = k + 1 == nl;
            {
                let previous;
                let a: &CudaView<'_, T> = if k == 0 {
                    input
                } else {
                    previous = s.act[k - 1].slice(..rows * i);
                    &previous
                };
                // The last layer writes the weights; hidden ones their pre-activations.
                let mut out = if last {
                    s.w.slice_mut(..rows * o)
                } else {
                    s.pre[k].slice_mut(..rows * o)
                };
                gemm(blas, rows, i, o, a, &layer.radial[k], false, 0.0, &mut out)?;
            }
            if !last {
                let len = (rows * o) as u64;
                launch!(device.stream(), &self.k.silu_copy, grid_1d(len, 256), "radial SiLU";
                    &s.pre[k], &mut s.act[k], &len)?;
            }
        }
        Ok(())
    }

    /// Backward of the MLP last run by [`Self::mlp_forward`] with `s`:
    /// from `s.gw` (rows × dim_w) into `grad_in` (rows × n_basis).
    fn mlp_backward(
        &self,
        device: &CudaDevice,
        layer: &DeviceLayer<T>,
        rows: usize,
        s: &mut Scratch<T>,
        grad_in: &mut CudaSlice<T>,
    ) -> Result<(), CudaError> {
        let blas = device.blas();
        let nl = layer.radial.len();
        let w = &layer.radial_widths;
        // Where the gradient w.r.t. the current layer's output lives:
        // 0 = s.gw, 1 = s.ga, 2 = s.gb.
        let mut cur = 0;
        for k in (0..nl).rev() {
            let (i, o) = (w[k], w[k + 1]);
            let Scratch {
                gw, ga, gb, pre, ..
            } = &mut *s;
            let (src, dst): (CudaView<'_, T>, CudaViewMut<'_, T>) = match cur {
                0 => (gw.slice(..rows * o), ga.slice_mut(..rows * i)),
                1 => (ga.slice(..rows * o), gb.slice_mut(..rows * i)),
                _ => (gb.slice(..rows * o), ga.slice_mut(..rows * i)),
            };
            if k == 0 {
                let mut out = grad_in.slice_mut(..rows * i);
                gemm(
                    blas,
                    rows,
                    o,
                    i,
                    &src,
                    &layer.radial[k],
                    true,
                    0.0,
                    &mut out,
                )?;
            } else {
                let mut dst = dst;
                gemm(
                    blas,
                    rows,
                    o,
                    i,
                    &src,
                    &layer.radial[k],
                    true,
                    0.0,
                    &mut dst,
                )?;
                let len = (rows * i) as u64;
                launch!(device.stream(), &self.k.silu_backward, grid_1d(len, 256), "radial SiLU backward";
                    &pre[k - 1], &mut dst, &len)?;
                cur = if cur == 1 { 2 } else { 1 };
            }
        }
        Ok(())
    }

    fn run(
        &self,
        device: &CudaDevice,
        list: &GpuNeighborList,
        row_start: &[u64],
        types: &[i32],
        cap: u64,
        mut rank: Option<&mut RankRows<'_>>,
    ) -> Result<RunOutput, CudaError> {
        let stream = device.stream();
        let blas = device.blas();
        let (n, ne) = (list.n_atoms, list.n_pairs);
        let (n32, ne64) = (n as u32, ne as u64);
        // Only owned atoms' energies count: the readout's gradient is seeded
        // and the energy summed over them.
        let n_owned = rank.as_ref().map_or(n, |r| r.n_owned);
        if n_owned > n {
            return Err(CudaError::Input(format!(
                "a rank owns {n_owned} atoms but holds only {n}"
            )));
        }
        let owned32 = n_owned as u32;
        let max_cols = self
            .layers
            .iter()
            .map(|l| l.dim_out.max(l.linear_1.dim_in))
            .max()
            .unwrap_or(1);
        let mut stage = match rank.as_deref() {
            Some(r) => Some(HaloStage::<T>::new(device, r, n, max_cols)?),
            None => None,
        };
        let nb = self.edge.n_basis as usize;
        let ds = ((self.edge.lmax + 1) * (self.edge.lmax + 1)) as usize;
        let mut min_free: Option<u64> = None;
        let mut sample = |device: &CudaDevice| -> Result<(), CudaError> {
            device.synchronize()?;
            let (free, _) = device.memory()?;
            min_free = Some(min_free.map_or(free, |m: u64| m.min(free)));
            Ok(())
        };

        // Edge features.
        let mut centers = zeros::<u32>(device, ne, "allocating edge receivers")?;
        let mut vectors = zeros::<f64>(device, 3 * ne, "allocating edge vectors")?;
        let mut emb = zeros::<T>(device, ne * nb, "allocating the radial embedding")?;
        let mut sh = zeros::<T>(device, ne * ds, "allocating spherical harmonics")?;
        let basis: Vec<f64> = list.frame.basis.iter().flatten().copied().collect();
        let basis_d = upload(device, &basis)?;
        launch!(stream, &self.k.edge_features, grid_1d(u64::from(n32), 128), "the edge features";
            &list.positions, &basis_d, &list.row_start, &list.neighbors, &list.shifts, &self.edge,
            &n32, &mut centers, &mut vectors, &mut emb, &mut sh)?;

        let SenderCsr {
            start: sender_start,
            edges: sender_edges,
        } = SenderCsr::build(device, &self.k, list)?;
        let sender_host = stream
            .clone_dtoh(&sender_start)
            .map_err(dev_err("downloading the sender offsets"))?;
        if longest_row(&sender_host) > cap {
            return Err(CudaError::Input(
                "the neighbour list is not symmetric (a sender row outgrows the chunks)".into(),
            ));
        }
        let recv_chunks = row_chunks(row_start, cap);
        let send_chunks = row_chunks(&sender_host, cap);

        // Scratch of the fused MLP, sized for the widest layer.
        let cap_us = cap as usize;
        let max_hidden = self
            .layers
            .iter()
            .flat_map(|l| {
                l.radial_widths[1..l.radial_widths.len() - 1]
                    .iter()
                    .copied()
            })
            .max()
            .unwrap_or(0);
        let n_hidden = self
            .layers
            .iter()
            .map(|l| l.radial_widths.len() - 2)
            .max()
            .unwrap_or(0);
        let max_w = self
            .layers
            .iter()
            .map(|l| l.params.dim_w as usize)
            .max()
            .unwrap_or(0);
        let max_t = self
            .layers
            .iter()
            .map(|l| l.params.t_size as usize)
            .max()
            .unwrap_or(0);
        let buf = |len: usize| zeros::<T>(device, len, "allocating the radial MLP scratch");
        let mut s = Scratch {
            pre: (0..n_hidden)
                .map(|_| buf(cap_us * max_hidden))
                .collect::<Result<_, _>>()?,
            act: (0..n_hidden)
                .map(|_| buf(cap_us * max_hidden))
                .collect::<Result<_, _>>()?,
            w: buf(cap_us * max_w)?,
            gw: buf(cap_us * max_w)?,
            ga: buf(cap_us * max_hidden.max(nb))?,
            gb: buf(cap_us * max_hidden.max(nb))?,
            filt: buf(cap_us * max_t)?,
        };
        let mut emb_chunk = buf(cap_us * nb)?;
        let mut gemb_chunk = buf(cap_us * nb)?;

        // Forward.
        let types_d = upload(device, types)?;
        let d0 = self.dim0() as u32;
        let mut x = zeros::<T>(device, n * d0 as usize, "allocating node features")?;
        launch!(stream, &self.k.embed_species, grid_1d(u64::from(n32) * u64::from(d0), 256),
            "the species embedding"; &self.embedding, &types_d, &n32, &d0, &mut x)?;
        let mut caches: Vec<(CudaSlice<T>, CudaSlice<T>)> = Vec::with_capacity(self.layers.len());
        for (li, layer) in self.layers.iter().enumerate() {
            let (di, dg, dm) = (
                layer.linear_1.dim_in,
                layer.dim_gate_in,
                layer.params.dim_msg as usize,
            );
            let mut y = zeros::<T>(device, n * dg, "allocating the gate input")?;
            gemm(
                blas,
                n,
                di,
                dg,
                &x,
                &layer.self_connection.matrix,
                false,
                0.0,
                &mut y,
            )?;
            self.add_bias(device, &layer.self_connection, n32, &mut y)?;
            let mut h = zeros::<T>(device, n * di, "allocating Linear_1 output")?;
            gemm(
                blas,
                n,
                di,
                di,
                &x,
                &layer.linear_1.matrix,
                false,
                0.0,
                &mut h,
            )?;
            self.add_bias(device, &layer.linear_1, n32, &mut h)?;
            let mut a = zeros::<T>(device, n * dm, "allocating the messages")?;
            for &(r0, r1, p0, p1) in &recv_chunks {
                let rows = (p1 - p0) as usize;
                if rows > 0 {
                    let input = emb.slice(p0 as usize * nb..p1 as usize * nb);
                    self.mlp_forward(device, layer, &input, rows, &mut s)?;
                    let (jobs, no_idx) = (rows as u64 * u64::from(layer.params.n_paths), 0i32);
                    launch!(stream, &self.k.filters, grid_1d(jobs, 128), "the filters";
                        &layer.paths, &layer.nz_idx, &layer.nz_coef, &sh, &list.neighbors, &no_idx,
                        &layer.params, &p0, &p1, &mut s.filt)?;
                }
                launch!(stream, &self.k.conv_fwd, per_row(r1 - r0, 128), "the convolution";
                    &layer.paths, &s.filt, &layer.col_path, &h, &s.w,
                    &list.row_start, &list.neighbors, &layer.params, &r0, &r1, &p0, &mut a)?;
            }
            gemm(
                blas,
                n,
                dm,
                dg,
                &a,
                &layer.linear_2.matrix,
                false,
                1.0,
                &mut y,
            )?;
            self.add_bias(device, &layer.linear_2, n32, &mut y)?;
            drop(a);
            let dout = layer.dim_out as u32;
            let (dg32, n_out) = (dg as u32, u64::from(n32) * u64::from(dout));
            let mut next = zeros::<T>(device, n * dout as usize, "allocating block outputs")?;
            launch!(stream, &self.k.gate_fwd, grid_1d(n_out, 256), "the gate";
                &y, &layer.gate_forward, &n32, &dg32, &dout, &layer.gate_activation, &mut next)?;
            x = next;
            caches.push((h, y));
            // The next block reads its senders' features: ghosts get their
            // owners' (the readout after the last block reads owned rows only).
            if let (Some(r), Some(stage)) = (rank.as_deref_mut(), stage.as_mut()) {
                if li + 1 < self.layers.len() {
                    stage.exchange(&self.k, device, &mut x, dout as usize, r, Exchange::Refresh)?;
                }
            }
        }
        let d_last = self.readout_v.len() as u32;
        let mut energies = zeros::<T>(device, n, "allocating atomic energies")?;
        launch!(stream, &self.k.readout, grid_1d(u64::from(n32), 128), "the readout";
            &x, &self.readout_v, &self.readout_c, &types_d, &self.scale, &self.shift, &n32, &d_last,
            &mut energies)?;
        let mut totals = zeros::<f64>(device, 7, "allocating totals")?;
        {
            let mut e_out = totals.slice_mut(0..1);
            let one = 1u32;
            launch!(stream, &self.k.column_sums, per_row(1, 256), "the energy sum";
                &energies, &owned32, &one, &mut e_out)?;
        }
        sample(device)?;

        // Backward.
        let mut gx = zeros::<T>(device, n * d_last as usize, "allocating feature gradients")?;
        launch!(stream, &self.k.readout_bwd, grid_1d(u64::from(n32) * u64::from(d_last), 256),
            "the readout backward"; &self.readout_v, &types_d, &self.scale, &owned32, &d_last, &mut gx)?;
        drop(x);
        let mut grad_emb = zeros::<T>(device, ne * nb, "allocating embedding gradients")?;
        let mut grad_sh = zeros::<T>(device, ne * ds, "allocating SH gradients")?;
        for (li, (layer, (h, y))) in self.layers.iter().zip(caches.iter()).enumerate().rev() {
            let (di, dg, dm) = (
                layer.linear_1.dim_in,
                layer.dim_gate_in,
                layer.params.dim_msg as usize,
            );
            let (dg32, dout) = (dg as u32, layer.dim_out as u32);
            let mut gy = zeros::<T>(device, n * dg, "allocating gate gradients")?;
            launch!(stream, &self.k.gate_bwd, grid_1d(u64::from(n32) * u64::from(dg32), 256),
                "the gate backward"; y, &gx, &layer.gate_backward, &n32, &dg32, &dout,
                &layer.gate_activation, &mut gy)?;
            let mut ga = zeros::<T>(device, n * dm, "allocating message gradients")?;
            gemm(
                blas,
                n,
                dg,
                dm,
                &gy,
                &layer.linear_2.matrix,
                true,
                0.0,
                &mut ga,
            )?;
            let mut gh = zeros::<T>(device, n * di, "allocating Linear_1 gradients")?;
            for &(r0, r1, q0, q1) in &send_chunks {
                let rows = (q1 - q0) as usize;
                if rows > 0 {
                    let nb32 = nb as u32;
                    launch!(stream, &self.k.gather_rows, grid_1d(rows as u64 * nb as u64, 256),
                        "gathering embeddings"; &emb, &sender_edges, &q0, &q1, &nb32, &mut emb_chunk)?;
                    let input = emb_chunk.slice(..rows * nb);
                    self.mlp_forward(device, layer, &input, rows, &mut s)?;
                    let (jobs, by_idx) = (rows as u64 * u64::from(layer.params.n_paths), 1i32);
                    launch!(stream, &self.k.filters, grid_1d(jobs, 128), "the filters";
                        &layer.paths, &layer.nz_idx, &layer.nz_coef, &sh, &sender_edges, &by_idx,
                        &layer.params, &q0, &q1, &mut s.filt)?;
                    launch!(stream, &self.k.conv_bwd_edge, grid_1d(rows as u64 * 32, 256),
                        "the convolution backward (edges)";
                        &layer.paths, &layer.nz_idx, &layer.nz_coef, h, &s.filt, &s.w, &ga, &sender_edges,
                        &centers, &list.neighbors, &layer.params, &q0, &q1, &mut s.gw, &mut grad_sh)?;
                }
                launch!(stream, &self.k.conv_bwd_h, per_row(r1 - r0, 128),
                    "the convolution backward (features)";
                    &layer.paths, &s.filt, &layer.ranges, &layer.range_paths,
                    &layer.slot_range, &s.w, &ga, &sender_start, &sender_edges, &centers,
                    &layer.params, &r0, &r1, &q0, &mut gh)?;
                if rows > 0 {
                    self.mlp_backward(device, layer, rows, &mut s, &mut gemb_chunk)?;
                    let nb32 = nb as u32;
                    launch!(stream, &self.k.scatter_add_rows, grid_1d(rows as u64 * nb as u64, 256),
                        "adding embedding gradients";
                        &gemb_chunk, &sender_edges, &q0, &q1, &nb32, &mut grad_emb)?;
                }
            }
            drop(ga);
            let mut gx_new = zeros::<T>(device, n * di, "allocating feature gradients")?;
            gemm(
                blas,
                n,
                di,
                di,
                &gh,
                &layer.linear_1.matrix,
                true,
                0.0,
                &mut gx_new,
            )?;
            gemm(
                blas,
                n,
                dg,
                di,
                &gy,
                &layer.self_connection.matrix,
                true,
                1.0,
                &mut gx_new,
            )?;
            gx = gx_new;
            // Ghost rows of this block's input were copies of their owners'
            // rows: their gradients belong to the owners (the first block's
            // input, the species embedding, depends on no position).
            if let (Some(r), Some(stage)) = (rank.as_deref_mut(), stage.as_mut()) {
                if li > 0 {
                    stage.exchange(&self.k, device, &mut gx, di, r, Exchange::ReverseSum)?;
                }
            }
            if li + 1 == self.layers.len() {
                sample(device)?;
            }
        }
        drop(s);

        // Edge gradients, forces, virial.
        let mut grad_vec = zeros::<f64>(device, 3 * ne, "allocating edge gradients")?;
        launch!(stream, &self.k.edge_features_bwd, grid_1d(ne64, 128), "the edge features backward";
            &vectors, &grad_emb, &grad_sh, &self.edge, &ne64, &mut grad_vec)?;
        let sender = SenderCsr {
            start: sender_start,
            edges: sender_edges,
        };
        let out = finish(
            device,
            &self.k,
            list,
            &sender,
            (&vectors, &grad_vec),
            &energies,
            &mut totals,
            n_owned,
            rank,
        )?;
        Ok(RunOutput {
            energy: out.energy,
            atomic: out.atomic,
            forces: out.forces,
            virial: out.virial,
            min_free,
        })
    }
}
