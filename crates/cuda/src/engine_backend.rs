//! The op engine's device on a CUDA GPU: [`CudaEngineDevice`] implements
//! [`DeviceBackend`] for f64 and f32 with the kernels of
//! `kernels/engine_ops.cu` and cuBLAS GEMMs, so that a [`Graph`] given it
//! ([`Graph::set_device`]) runs its generic ops on the GPU — any model the
//! engine runs, not only those with a hand-written GPU path.
//!
//! [`Graph`]: ddmlip_engine::Graph
//! [`Graph::set_device`]: ddmlip_engine::Graph::set_device

use crate::sevennet::{grid_1d, GpuFloat, SevenNetNets, SevenNetOnEngine};
use crate::{CudaDevice, CudaError};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use ddmlip_engine::device::{
    DeviceBackend, DeviceBinary, DeviceBroadcast, DeviceCsr, DeviceEdges, DeviceError, DeviceMem,
    DeviceSource, GemmShape, GeometrySource,
};
use ddmlip_engine::ops::{Radial, Unary};
use ddmlip_engine::Scalar;
use ddmlip_models::sevennet_device::SevenNetDeviceHandle;
use std::any::{Any, TypeId};
use std::marker::PhantomData;
use std::sync::Arc;

const THREADS: u32 = 256;

/// The engine's ops on one GPU, for elements of type `T` (f64 or f32):
/// its own stream and cuBLAS handle, the kernels compiled for the device.
pub struct CudaEngineDevice<T> {
    device: Arc<CudaDevice>,
    kernels: EngineKernels,
    name: String,
    /// SevenNet's own kernels on this stream, for the models that ask
    /// ([`DeviceBackend::extension`]).
    sevennet: SevenNetDeviceHandle<T>,
    _t: PhantomData<T>,
}

#[derive(Clone)]
struct EngineKernels {
    axpy: CudaFunction,
    unary: CudaFunction,
    unary_grad: CudaFunction,
    binary: CudaFunction,
    row_sums: CudaFunction,
    col_sums: CudaFunction,
    gather_rows: CudaFunction,
    copy_cols: CudaFunction,
    sum_rows_csr: CudaFunction,
    sum_rows_csr_wide: CudaFunction,
    radial: CudaFunction,
    edge_geometry: CudaFunction,
    edge_geometry_exact: CudaFunction,
    length_rows: CudaFunction,
    length_rows_exact: CudaFunction,
    shift_outer: CudaFunction,
    strain_rows: CudaFunction,
    strain_rows_grad: CudaFunction,
    row_outer: CudaFunction,
}

impl<T> CudaEngineDevice<T>
where
    T: GpuFloat + Scalar,
    CudaBlas: Gemm<T>,
{
    /// The engine's device on GPU `index` (typed errors as
    /// [`CudaDevice::open`]; a kernel that does not compile is
    /// [`CudaError::Compile`]).
    pub fn open(index: usize) -> Result<Self, CudaError> {
        Self::on(CudaDevice::open(index)?)
    }

    /// The engine's device on an open GPU handle (see [`CudaDevice::fork`]
    /// for one beside another user of the GPU).
    pub fn on(device: CudaDevice) -> Result<Self, CudaError> {
        let kernels = EngineKernels::load::<T>(&device)?;
        let name = format!("cuda:{}", device.index());
        let device = Arc::new(device);
        let sevennet = SevenNetDeviceHandle(Arc::new(SevenNetOnEngine::<T>::new(
            device.clone(),
            SevenNetNets::default(),
        )));
        Ok(Self {
            device,
            kernels,
            name,
            sevennet,
            _t: PhantomData,
        })
    }

    /// The GPU handle (stream, cuBLAS) the ops run on.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// A copy of `host` on the device (one element for an empty array, so
    /// that every buffer has an address); `what` names it in errors.
    fn upload_slice<U: DeviceRepr + ValidAsZeroBits + Send + Sync + 'static>(
        &self,
        host: &[U],
        what: &str,
    ) -> Result<DeviceMem, DeviceError> {
        let stream = self.device.stream();
        let m = if host.is_empty() {
            stream.alloc_zeros::<U>(1)
        } else {
            stream.clone_htod(host)
        }
        .map_err(|e| DeviceError(format!("uploading {} {what}: {e}", host.len())))?;
        Ok(DeviceMem::new(Box::new(m), host.len()))
    }
}

impl EngineKernels {
    /// The kernels for `T`, compiled for the device (or from the cache).
    fn load<T: GpuFloat>(device: &CudaDevice) -> Result<Self, CudaError> {
        let module = device.load_module("engine_ops", crate::kernels::ENGINE_OPS_KERNELS)?;
        let f = |name: &str| {
            let full = format!("eo_{name}_{}", T::SUFFIX);
            module
                .load_function(&full)
                .map_err(|e| CudaError::driver(format!("loading kernel {full}"), e))
        };
        Ok(Self {
            axpy: f("axpy")?,
            unary: f("unary")?,
            unary_grad: f("unary_grad")?,
            binary: f("binary")?,
            row_sums: f("row_sums")?,
            col_sums: f("col_sums")?,
            gather_rows: f("gather_rows")?,
            copy_cols: f("copy_cols")?,
            sum_rows_csr: f("sum_rows_csr")?,
            sum_rows_csr_wide: f("sum_rows_csr_wide")?,
            radial: f("radial")?,
            edge_geometry: f("edge_geometry")?,
            edge_geometry_exact: f("edge_geometry_exact")?,
            length_rows: f("length_rows")?,
            length_rows_exact: f("length_rows_exact")?,
            shift_outer: f("shift_outer")?,
            strain_rows: f("strain_rows")?,
            strain_rows_grad: f("strain_rows_grad")?,
            row_outer: f("row_outer")?,
        })
    }
}

/// Positions and cells of an edge kernel: f64 arrays (`Exact`) or the
/// graph's type (`Same`, typed where the kernel is launched).
enum Positions<'a> {
    Exact(&'a CudaSlice<f64>, &'a CudaSlice<f64>),
    Same(&'a DeviceMem, &'a DeviceMem),
}

/// The arguments every edge kernel takes. Without periodic shifts, the
/// shift and system arguments are stand-ins the kernel never reads
/// (`periodic` = 0), and so is the cell.
struct EdgeArgs<'a> {
    center: &'a CudaSlice<u32>,
    neighbor: &'a CudaSlice<u32>,
    shifts: &'a CudaSlice<u32>,
    systems: &'a CudaSlice<u32>,
    periodic: i32,
    positions: Positions<'a>,
}

impl<'a> EdgeArgs<'a> {
    fn new(edges: &DeviceEdges<'a>, source: GeometrySource<'a>) -> Result<Self, DeviceError> {
        let center = slice::<u32>(edges.center)?;
        let neighbor = slice::<u32>(edges.neighbor)?;
        let (shifts, systems, periodic) = match (edges.periodic, source.cell) {
            (Some((s, sys)), Some(_)) => (slice::<u32>(s)?, slice::<u32>(sys)?, 1),
            _ => (center, center, 0),
        };
        let cell = source.cell.unwrap_or(source.positions);
        let positions = if source.exact {
            Positions::Exact(slice::<f64>(source.positions)?, slice::<f64>(cell)?)
        } else {
            Positions::Same(source.positions, cell)
        };
        Ok(Self {
            center,
            neighbor,
            shifts,
            systems,
            periodic,
            positions,
        })
    }
}

fn err(what: &str) -> impl Fn(CudaError) -> DeviceError + '_ {
    move |e| DeviceError(format!("{what}: {e}"))
}

pub(crate) fn slice<U: 'static>(m: &DeviceMem) -> Result<&CudaSlice<U>, DeviceError> {
    m.get::<CudaSlice<U>>()
        .ok_or_else(|| DeviceError("an array of another device or element type".into()))
}

pub(crate) fn slice_mut<U: 'static>(m: &mut DeviceMem) -> Result<&mut CudaSlice<U>, DeviceError> {
    m.get_mut::<CudaSlice<U>>()
        .ok_or_else(|| DeviceError("an array of another device or element type".into()))
}

/// The code of `f` in `engine_ops.cu` and its parameter.
fn unary_code(f: Unary) -> (i32, f64) {
    match f {
        Unary::Silu => (0, 0.0),
        Unary::Tanh => (1, 0.0),
        Unary::Sigmoid => (2, 0.0),
        Unary::ShiftedSoftplus => (3, 0.0),
        Unary::Exp => (4, 0.0),
        Unary::Ln => (5, 0.0),
        Unary::Sqrt => (6, 0.0),
        Unary::Square => (7, 0.0),
        Unary::Recip => (8, 0.0),
        Unary::Neg => (9, 0.0),
        Unary::Scale(c) => (10, c),
        Unary::AddScalar(c) => (11, c),
        Unary::Powf(p) => (12, p),
        Unary::ScaledSilu(c) => (13, c),
        Unary::Cos => (14, 0.0),
        Unary::Sin => (15, 0.0),
    }
}

fn per_block(blocks: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl<T> DeviceBackend<T> for CudaEngineDevice<T>
where
    T: GpuFloat + Scalar,
    CudaBlas: Gemm<T>,
{
    fn name(&self) -> String {
        self.name.clone()
    }

    fn alloc(&self, len: usize) -> Result<DeviceMem, DeviceError> {
        let m = self
            .device
            .stream()
            .alloc_zeros::<T>(len.max(1))
            .map_err(|e| DeviceError(format!("allocating {len} values: {e}")))?;
        Ok(DeviceMem::new(Box::new(m), len))
    }

    fn upload(&self, host: &[T]) -> Result<DeviceMem, DeviceError> {
        self.upload_slice(host, "values")
    }

    fn upload_indices(&self, host: &[u32]) -> Result<DeviceMem, DeviceError> {
        self.upload_slice(host, "indices")
    }

    fn download(&self, mem: &DeviceMem, out: &mut [T]) -> Result<(), DeviceError> {
        if out.is_empty() {
            return Ok(());
        }
        let src = slice::<T>(mem)?;
        let stream = self.device.stream();
        stream
            .memcpy_dtoh(&src.slice(..out.len()), out)
            .and_then(|()| stream.synchronize())
            .map_err(|e| DeviceError(format!("downloading {} values: {e}", out.len())))
    }

    fn axpy(
        &self,
        alpha: f64,
        x: &DeviceMem,
        y: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let n = y.len() as u64;
        let (x, y) = (slice::<T>(x)?, slice_mut::<T>(y)?);
        let acc = i32::from(accumulate);
        launch!(self.device.stream(), &self.kernels.axpy, grid_1d(n, THREADS), "axpy";
            &alpha, x, y, &n, &acc)
        .map_err(err("axpy"))
    }

    fn unary(&self, f: Unary, x: &DeviceMem, out: &mut DeviceMem) -> Result<(), DeviceError> {
        let n = out.len() as u64;
        let (code, p) = unary_code(f);
        let (x, out) = (slice::<T>(x)?, slice_mut::<T>(out)?);
        launch!(self.device.stream(), &self.kernels.unary, grid_1d(n, THREADS), "unary";
            &code, &p, x, out, &n)
        .map_err(err("unary"))
    }

    fn unary_grad(
        &self,
        f: Unary,
        x: &DeviceMem,
        y: &DeviceMem,
        g: &DeviceMem,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let n = out.len() as u64;
        let (code, p) = unary_code(f);
        let (x, y, g) = (slice::<T>(x)?, slice::<T>(y)?, slice::<T>(g)?);
        let out = slice_mut::<T>(out)?;
        let acc = i32::from(accumulate);
        launch!(self.device.stream(), &self.kernels.unary_grad, grid_1d(n, THREADS), "unary gradient";
            &code, &p, x, y, g, out, &n, &acc)
        .map_err(err("unary gradient"))
    }

    fn binary(
        &self,
        op: DeviceBinary,
        a: &DeviceMem,
        b: &DeviceMem,
        bc: DeviceBroadcast,
        rows: usize,
        cols: usize,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let op = match op {
            DeviceBinary::Add => 0i32,
            DeviceBinary::Sub => 1,
            DeviceBinary::Mul => 2,
        };
        let bc = match bc {
            DeviceBroadcast::Full => 0i32,
            DeviceBroadcast::PerRow => 1,
            DeviceBroadcast::PerCol => 2,
            DeviceBroadcast::Scalar => 3,
        };
        let (rows, cols) = (rows as u64, cols as u64);
        let (a, b, out) = (slice::<T>(a)?, slice::<T>(b)?, slice_mut::<T>(out)?);
        let acc = i32::from(accumulate);
        launch!(self.device.stream(), &self.kernels.binary, grid_1d(rows * cols, THREADS), "binary op";
            &op, &bc, a, b, out, &rows, &cols, &acc)
        .map_err(err("binary op"))
    }

    fn row_sums(
        &self,
        x: &DeviceMem,
        rows: usize,
        cols: usize,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let (rows, cols) = (rows as u64, cols as u64);
        let (x, out) = (slice::<T>(x)?, slice_mut::<T>(out)?);
        let acc = i32::from(accumulate);
        launch!(self.device.stream(), &self.kernels.row_sums, grid_1d(rows, THREADS), "row sums";
            x, out, &rows, &cols, &acc)
        .map_err(err("row sums"))
    }

    fn col_sums(
        &self,
        x: &DeviceMem,
        rows: usize,
        cols: usize,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        if cols == 0 {
            return Ok(());
        }
        let (rows, cols) = (rows as u64, cols as u64);
        let (x, out) = (slice::<T>(x)?, slice_mut::<T>(out)?);
        let acc = i32::from(accumulate);
        launch!(self.device.stream(), &self.kernels.col_sums, per_block(cols), "column sums";
            x, out, &rows, &cols, &acc)
        .map_err(err("column sums"))
    }

    fn gather_rows(
        &self,
        src: &DeviceMem,
        cols: usize,
        index: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let rows = index.len() as u64;
        let cols = cols as u64;
        let (src, index) = (slice::<T>(src)?, slice::<u32>(index)?);
        let out = slice_mut::<T>(out)?;
        launch!(self.device.stream(), &self.kernels.gather_rows, grid_1d(rows * cols, THREADS), "row gather";
            src, index, out, &rows, &cols)
        .map_err(err("row gather"))
    }

    fn extension(&self, id: TypeId) -> Option<&(dyn Any + Send + Sync)> {
        (id == TypeId::of::<SevenNetDeviceHandle<T>>()).then_some(&self.sevennet as _)
    }

    fn zero(&self, mem: &mut DeviceMem) -> Result<(), DeviceError> {
        let m = slice_mut::<T>(mem)?;
        self.device
            .stream()
            .memset_zeros(m)
            .map_err(|e| DeviceError(format!("zeroing {} elements: {e}", m.len())))
    }

    fn copy_cols(
        &self,
        rows: usize,
        width: usize,
        (src, src_cols, src_col0): (&DeviceMem, usize, usize),
        (dst, dst_cols, dst_col0): (&mut DeviceMem, usize, usize),
    ) -> Result<(), DeviceError> {
        ddmlip_engine::device::check_column_copy(
            width,
            (src_cols, src_col0),
            (dst_cols, dst_col0),
        )?;
        let n = (rows * width) as u64;
        if n == 0 {
            return Ok(());
        }
        let [sc, s0, dc, d0, r, w] =
            [src_cols, src_col0, dst_cols, dst_col0, rows, width].map(|v| v as u64);
        let (src, dst) = (slice::<T>(src)?, slice_mut::<T>(dst)?);
        launch!(self.device.stream(), &self.kernels.copy_cols, grid_1d(n, THREADS), "column copy";
            src, &sc, &s0, dst, &dc, &d0, &r, &w)
        .map_err(err("column copy"))
    }

    fn sum_rows_csr(
        &self,
        src: &DeviceMem,
        cols: usize,
        csr: &DeviceCsr,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let (targets, cols_u) = (csr.targets as u64, cols as u64);
        if targets * cols_u == 0 {
            return Ok(());
        }
        let src_s = slice::<T>(src)?;
        let offsets = slice::<u32>(&csr.offsets)?;
        // Without a permutation the kernel reads the offsets in its place
        // and ignores them (has_sources = 0).
        let (sources, has_sources) = match &csr.sources {
            Some(s) => (slice::<u32>(s)?, 1i32),
            None => (offsets, 0i32),
        };
        let out = slice_mut::<T>(out)?;
        let acc = i32::from(accumulate);
        let outputs = targets * cols_u;
        // Few outputs, each summing many rows (per-system totals): a block
        // per output; else a thread per output.
        let per_output = src.len() as u64 / targets.max(1);
        if outputs < 4096 && per_output >= 512 {
            launch!(self.device.stream(), &self.kernels.sum_rows_csr_wide, per_block(outputs), "inverse-map sums";
                src_s, offsets, sources, &has_sources, out, &cols_u, &acc)
        } else {
            launch!(self.device.stream(), &self.kernels.sum_rows_csr, grid_1d(outputs, THREADS), "inverse-map sums";
                src_s, offsets, sources, &has_sources, out, &targets, &cols_u, &acc)
        }
        .map_err(err("inverse-map sums"))
    }

    fn gemm(
        &self,
        s: GemmShape,
        a: &DeviceMem,
        b: &DeviceMem,
        c: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        if s.m == 0 || s.n == 0 {
            return Ok(());
        }
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| DeviceError(format!("GEMM dimension {v} too large")))
        };
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        // Column-major view: Cᵀ (n × m) = op(B)ᵀ (n × k) · op(A)ᵀ (k × m);
        // a row-major matrix is its transpose column-major.
        let cfg = GemmConfig {
            transa: op(s.b_transposed),
            transb: op(s.a_transposed),
            m: int(s.n)?,
            n: int(s.m)?,
            k: int(s.k)?,
            alpha: <T as GpuFloat>::from_f64(1.0),
            lda: int(if s.b_transposed { s.k } else { s.n })?.max(1),
            ldb: int(if s.a_transposed { s.m } else { s.k })?.max(1),
            beta: <T as GpuFloat>::from_f64(if accumulate { 1.0 } else { 0.0 }),
            ldc: int(s.n)?,
        };
        let (a, b, c) = (slice::<T>(a)?, slice::<T>(b)?, slice_mut::<T>(c)?);
        if s.k == 0 {
            // An empty sum: C = 0 (or unchanged).
            return if accumulate {
                Ok(())
            } else {
                self.device
                    .stream()
                    .memset_zeros(c)
                    .map_err(|e| DeviceError(format!("GEMM: {e}")))
            };
        }
        // SAFETY: the engine sizes A (m·k), B (k·n) and C (m·n) from the
        // same shape (the `DeviceBackend` contract).
        unsafe { self.device.blas().gemm(cfg, b, a, c) }
            .map_err(|e| DeviceError(format!("a cuBLAS GEMM: {e:?}")))
    }

    fn upload_f64(&self, host: &[f64]) -> Result<DeviceMem, DeviceError> {
        self.upload_slice(host, "f64 values")
    }

    fn edge_geometry(
        &self,
        edges: &DeviceEdges<'_>,
        source: GeometrySource<'_>,
        vectors: Option<&mut DeviceMem>,
        lengths: Option<&mut DeviceMem>,
    ) -> Result<(), DeviceError> {
        let n = edges.count as u64;
        if n == 0 {
            return Ok(());
        }
        let g = EdgeArgs::new(edges, source)?;
        let (want_vectors, want_lengths) =
            (i32::from(vectors.is_some()), i32::from(lengths.is_some()));
        let stream = self.device.stream();
        // An output not asked for gets a one-element stand-in, never written.
        let stand_in = |what| {
            stream
                .alloc_zeros::<T>(1)
                .map_err(|e| DeviceError(format!("allocating the {what} stand-in: {e}")))
        };
        let (mut spare_v, mut spare_l) = (None, None);
        let vectors = match vectors {
            Some(v) => slice_mut::<T>(v)?,
            None => spare_v.insert(stand_in("vectors")?),
        };
        let lengths = match lengths {
            Some(l) => slice_mut::<T>(l)?,
            None => spare_l.insert(stand_in("lengths")?),
        };
        let cfg = grid_1d(n, THREADS);
        match g.positions {
            Positions::Exact(pos, cell) => launch!(stream, &self.kernels.edge_geometry_exact, cfg, "edge geometry";
                pos, cell, g.center, g.neighbor, g.shifts, g.systems, &g.periodic, vectors, &want_vectors, lengths, &want_lengths, &n),
            Positions::Same(pos, cell) => launch!(stream, &self.kernels.edge_geometry, cfg, "edge geometry";
                slice::<T>(pos)?, slice::<T>(cell)?, g.center, g.neighbor, g.shifts, g.systems, &g.periodic, vectors, &want_vectors, lengths, &want_lengths, &n),
        }
        .map_err(err("edge geometry"))
    }

    fn length_gradient_rows(
        &self,
        edges: &DeviceEdges<'_>,
        source: GeometrySource<'_>,
        g: &DeviceMem,
        lengths: &DeviceMem,
        rows: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let n = edges.count as u64;
        if n == 0 {
            return Ok(());
        }
        let a = EdgeArgs::new(edges, source)?;
        let (g, lengths, rows) = (slice::<T>(g)?, slice::<T>(lengths)?, slice_mut::<T>(rows)?);
        let stream = self.device.stream();
        let cfg = grid_1d(n, THREADS);
        match a.positions {
            Positions::Exact(pos, cell) => launch!(stream, &self.kernels.length_rows_exact, cfg, "length gradient";
                pos, cell, a.center, a.neighbor, a.shifts, a.systems, &a.periodic, g, lengths, rows, &n),
            Positions::Same(pos, cell) => launch!(stream, &self.kernels.length_rows, cfg, "length gradient";
                slice::<T>(pos)?, slice::<T>(cell)?, a.center, a.neighbor, a.shifts, a.systems, &a.periodic, g, lengths, rows, &n),
        }
        .map_err(err("length gradient"))
    }

    fn shift_outer(
        &self,
        edges: &DeviceEdges<'_>,
        rows: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let n = edges.count as u64;
        let Some((shifts, _)) = edges.periodic else {
            return Err(DeviceError("cell gradient of edges without shifts".into()));
        };
        if n == 0 {
            return Ok(());
        }
        let (shifts, rows, out) = (
            slice::<u32>(shifts)?,
            slice::<T>(rows)?,
            slice_mut::<T>(out)?,
        );
        launch!(self.device.stream(), &self.kernels.shift_outer, grid_1d(9 * n, THREADS), "shift outer products";
            shifts, rows, out, &n)
        .map_err(err("shift outer products"))
    }

    fn strain_rows(
        &self,
        x: &DeviceMem,
        eps: &DeviceMem,
        system: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let rows = system.len() as u64;
        let (x, eps, system) = (slice::<T>(x)?, slice::<T>(eps)?, slice::<u32>(system)?);
        let out = slice_mut::<T>(out)?;
        launch!(self.device.stream(), &self.kernels.strain_rows, grid_1d(rows, THREADS), "strain";
            x, eps, system, out, &rows)
        .map_err(err("strain"))
    }

    fn strain_rows_grad(
        &self,
        eps: &DeviceMem,
        system: &DeviceMem,
        g: &DeviceMem,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let rows = system.len() as u64;
        let (eps, system, g) = (slice::<T>(eps)?, slice::<u32>(system)?, slice::<T>(g)?);
        let out = slice_mut::<T>(out)?;
        let acc = i32::from(accumulate);
        launch!(self.device.stream(), &self.kernels.strain_rows_grad, grid_1d(rows, THREADS), "strain gradient";
            eps, system, g, out, &rows, &acc)
        .map_err(err("strain gradient"))
    }

    fn row_outer(
        &self,
        x: &DeviceMem,
        g: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let rows = (x.len() / 3) as u64;
        let (x, g, out) = (slice::<T>(x)?, slice::<T>(g)?, slice_mut::<T>(out)?);
        launch!(self.device.stream(), &self.kernels.row_outer, grid_1d(9 * rows, THREADS), "row outer products";
            x, g, out, &rows)
        .map_err(err("row outer products"))
    }

    fn radial(
        &self,
        f: &Radial,
        d: &DeviceMem,
        values: &mut DeviceMem,
        derivatives: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let rows = d.len() as u64;
        let k = f.width() as u64;
        let (kind, centers, gamma, cutoff, p): (i32, &[f64], f64, f64, i32) = match f {
            Radial::Gaussian { centers, gamma } => (0, centers, *gamma, 0.0, 0),
            Radial::Bessel { cutoff, .. } => (1, &[], 0.0, *cutoff, 0),
            Radial::CosineCutoff { cutoff } => (2, &[], 0.0, *cutoff, 0),
            Radial::PolynomialCutoff { cutoff, p } => (3, &[], 0.0, *cutoff, *p),
        };
        let stream = self.device.stream();
        let centers = if centers.is_empty() {
            stream.alloc_zeros::<f64>(1)
        } else {
            stream.clone_htod(centers)
        }
        .map_err(|e| DeviceError(format!("uploading the radial centres: {e}")))?;
        let d = slice::<T>(d)?;
        let values = slice_mut::<T>(values)?;
        let derivatives = slice_mut::<T>(derivatives)?;
        launch!(stream, &self.kernels.radial, grid_1d(rows, THREADS), "radial basis";
            &kind, &centers, &gamma, &cutoff, &p, &k, d, values, derivatives, &rows)
        .map_err(err("radial basis"))
    }
}

/// A GPU as the runtime's [`DeviceSource`]: every graph (one process's,
/// each rank's) gets its own stream and cuBLAS handle on it
/// ([`CudaDevice::fork`]), the kernels compiled once.
pub struct CudaEngineSource {
    base: CudaDevice,
    f64_kernels: EngineKernels,
    f32_kernels: EngineKernels,
}

impl CudaEngineSource {
    /// GPU `index` for the engine's ops (typed errors as
    /// [`CudaDevice::open`]).
    pub fn open(index: usize) -> Result<Self, CudaError> {
        let base = CudaDevice::open(index)?;
        let f64_kernels = EngineKernels::load::<f64>(&base)?;
        let f32_kernels = EngineKernels::load::<f32>(&base)?;
        Ok(Self {
            base,
            f64_kernels,
            f32_kernels,
        })
    }

    /// The GPU (name, architecture, memory).
    pub fn device(&self) -> &CudaDevice {
        &self.base
    }

    fn fork<T>(&self, kernels: &EngineKernels) -> Result<CudaEngineDevice<T>, DeviceError>
    where
        T: GpuFloat + Scalar,
        CudaBlas: Gemm<T>,
    {
        let device = self.base.fork().map_err(|e| {
            DeviceError(format!(
                "opening a stream on cuda:{}: {e}",
                self.base.index()
            ))
        })?;
        let device = Arc::new(device);
        Ok(CudaEngineDevice {
            name: format!("cuda:{}", device.index()),
            sevennet: SevenNetDeviceHandle(Arc::new(SevenNetOnEngine::<T>::new(
                device.clone(),
                SevenNetNets::default(),
            ))),
            device,
            kernels: kernels.clone(),
            _t: PhantomData,
        })
    }
}

impl DeviceSource for CudaEngineSource {
    fn name(&self) -> String {
        format!("cuda:{}", self.base.index())
    }

    fn open_f64(&self) -> Result<Arc<dyn DeviceBackend<f64>>, DeviceError> {
        Ok(Arc::new(self.fork::<f64>(&self.f64_kernels)?))
    }

    fn open_f32(&self) -> Result<Arc<dyn DeviceBackend<f32>>, DeviceError> {
        Ok(Arc::new(self.fork::<f32>(&self.f32_kernels)?))
    }
}
