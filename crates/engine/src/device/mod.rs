//! Tensors on an accelerator: the contract a device backend (the CUDA one
//! lives in `ddmlip-cuda`) implements so that the engine's generic ops run
//! there with the same row domains, tape and trace as on the host.
//!
//! A graph given a backend ([`Graph::set_device`](crate::Graph::set_device))
//! runs every op that has a device kernel on the device: its inputs are
//! uploaded once (a tensor may then live in both places, the same values)
//! and its output stays there. Ops without one (geometry, opaque kernels,
//! distributed handlers) read their inputs on the host, downloaded once.
//! So every model runs, and runs where kernels exist; the trace records the
//! same ops, shapes and sums as a host run, each event naming where it ran.
//! Gradients follow their op: a device op's backward adds into device
//! gradients, a host op's into host ones, and a tensor's two parts are
//! summed where its own backward runs.

use crate::ops::opaque::Shape;
use crate::ops::Radial;
use crate::ops::Unary;
use crate::{DType, Scalar};
use std::any::{Any, TypeId};
use std::sync::Arc;

mod reference;
pub use reference::{ReferenceDevice, ReferenceSource};

/// Memory of one array on a device: `len` elements of the graph's float
/// type (or `u32` for index arrays), held by the backend that made it.
pub struct DeviceMem {
    inner: Box<dyn Any + Send + Sync>,
    len: usize,
}

impl std::fmt::Debug for DeviceMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMem").field("len", &self.len).finish()
    }
}

impl DeviceMem {
    /// Wraps a backend's buffer of `len` elements.
    pub fn new(inner: Box<dyn Any + Send + Sync>, len: usize) -> Self {
        Self { inner, len }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty array.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The backend's buffer, when it is a `B`.
    pub fn get<B: 'static>(&self) -> Option<&B> {
        self.inner.downcast_ref()
    }

    /// The backend's buffer, mutably, when it is a `B`.
    pub fn get_mut<B: 'static>(&mut self) -> Option<&mut B> {
        self.inner.downcast_mut()
    }
}

/// Why a device call failed (allocation, a launch, a transfer), in words.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct DeviceError(pub String);

/// The element-wise binary ops with a device kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceBinary {
    /// a + b
    Add,
    /// a − b
    Sub,
    /// a · b
    Mul,
}

/// How `b` broadcasts against a `rows × cols` operand `a` in
/// [`DeviceBackend::binary`]: element `(r, c)` reads `b` at
/// `r·cols + c` (`Full`), `r` (`PerRow`), `c` (`PerCol`) or 0 (`Scalar`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceBroadcast {
    /// Same shape.
    Full,
    /// One value per row.
    PerRow,
    /// One value per column.
    PerCol,
    /// One value.
    Scalar,
}

/// A row-major GEMM `C (m×n) = op(A) · op(B)` (+ C when accumulating),
/// with `op(A)` m×k and `op(B)` k×n; a transposed operand is stored the
/// other way round (`A` k×m, `B` n×k).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    /// Rows of C.
    pub m: usize,
    /// The summed dimension.
    pub k: usize,
    /// Columns of C.
    pub n: usize,
    /// `A` is stored k×m and read transposed.
    pub a_transposed: bool,
    /// `B` is stored n×k and read transposed.
    pub b_transposed: bool,
}

/// An inverse map on the device (target row → its source rows, ascending):
/// `offsets` (targets + 1 values, `u32`) and, unless the sources of target
/// `t` are `offsets[t]..offsets[t+1]` themselves, the permutation `sources`.
pub struct DeviceCsr {
    /// Start of each target's sources; `targets + 1` entries.
    pub offsets: DeviceMem,
    /// Source rows in target order, or `None` for a non-decreasing index.
    pub sources: Option<DeviceMem>,
    /// Number of target rows.
    pub targets: usize,
}

/// The edges of an edge-geometry kernel on the device: centre and
/// neighbour rows (`u32`, one per edge) and, for periodic images, each
/// edge's integer shift (three `i32` stored as `u32` bit patterns) and
/// system (`u32`).
pub struct DeviceEdges<'a> {
    /// Centre row of each edge.
    pub center: &'a DeviceMem,
    /// Neighbour row of each edge.
    pub neighbor: &'a DeviceMem,
    /// Shift `S` of each edge (3 per edge) with each edge's system, when
    /// the edges cross periodic boundaries.
    pub periodic: Option<(&'a DeviceMem, &'a DeviceMem)>,
    /// Number of edges.
    pub count: usize,
}

/// Where edge vectors come from: positions (rows × 3) and, with periodic
/// edges, the cells ((3·systems) × 3, lattice vectors as rows), both of the
/// graph's type, or both f64 (`exact`: the f64 values an f32 graph's
/// positions round, the geometry computed in f64 and rounded once).
#[derive(Clone, Copy)]
pub struct GeometrySource<'a> {
    /// Positions, rows × 3.
    pub positions: &'a DeviceMem,
    /// Cells, when the edges are periodic.
    pub cell: Option<&'a DeviceMem>,
    /// Both arrays hold f64 values.
    pub exact: bool,
}

/// An accelerator the engine's ops run on, for elements of type `T`.
///
/// Every kernel is deterministic (the same bits on every run: sums in a
/// fixed order, no floating-point atomics) and queued in order on one
/// stream: a call returns once the work is queued, [`DeviceBackend::download`]
/// waits for it. "Accumulate" arguments say whether a kernel adds into its
/// output (`true`) or overwrites every element of it (`false`). Lengths are
/// the caller's contract: every buffer holds the elements its shape says.
pub trait DeviceBackend<T: Scalar>: Send + Sync {
    /// Where the tensors live, as traces and messages name it (`cuda:0`).
    fn name(&self) -> String;
    /// `len` elements of unspecified value.
    fn alloc(&self, len: usize) -> Result<DeviceMem, DeviceError>;
    /// A copy of `host` on the device.
    fn upload(&self, host: &[T]) -> Result<DeviceMem, DeviceError>;
    /// A copy of an index array on the device.
    fn upload_indices(&self, host: &[u32]) -> Result<DeviceMem, DeviceError>;
    /// Copies `mem` (after the work queued before) into `out` (same length).
    fn download(&self, mem: &DeviceMem, out: &mut [T]) -> Result<(), DeviceError>;
    /// `y (+)= alpha · x`, element-wise.
    fn axpy(
        &self,
        alpha: f64,
        x: &DeviceMem,
        y: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError>;
    /// `out = f(x)`, element-wise.
    fn unary(&self, f: Unary, x: &DeviceMem, out: &mut DeviceMem) -> Result<(), DeviceError>;
    /// `out (+)= g · f'(x)` with `y = f(x)` given too (whichever the
    /// derivative reads).
    fn unary_grad(
        &self,
        f: Unary,
        x: &DeviceMem,
        y: &DeviceMem,
        g: &DeviceMem,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError>;
    /// `out (+)= a ∘ b` over a `rows × cols` `a`, `b` broadcast by `bc`.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(), DeviceError>;
    /// `out[r] (+)= Σ_c x[r, c]` (columns in order).
    fn row_sums(
        &self,
        x: &DeviceMem,
        rows: usize,
        cols: usize,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError>;
    /// `out[c] (+)= Σ_r x[r, c]` (a fixed order of the rows).
    fn col_sums(
        &self,
        x: &DeviceMem,
        rows: usize,
        cols: usize,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError>;
    /// `out[r] = src[index[r]]`, rows of `cols` elements.
    fn gather_rows(
        &self,
        src: &DeviceMem,
        cols: usize,
        index: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError>;
    /// `out[t] (+)= Σ_{s ∈ csr(t)} src[s]`, rows of `cols` elements, each
    /// target's sources added in ascending order in f64 and rounded once.
    fn sum_rows_csr(
        &self,
        src: &DeviceMem,
        cols: usize,
        csr: &DeviceCsr,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError>;
    /// [`GemmShape`]'s product.
    fn gemm(
        &self,
        shape: GemmShape,
        a: &DeviceMem,
        b: &DeviceMem,
        c: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError>;
    /// A copy of f64 values on the device (an f32 graph's exact positions).
    fn upload_f64(&self, host: &[f64]) -> Result<DeviceMem, DeviceError>;
    /// Edge vectors `v = r[neighbor] − r[center]`, then `+ S_a · cell_a`
    /// for each axis `a` with `S_a ≠ 0` in axis order (the host's order of
    /// operations, so the same bits), into `vectors` (edges × 3) and their
    /// lengths `|v| = √(v₀² + v₁² + v₂²)` into `lengths`, each when given.
    fn edge_geometry(
        &self,
        edges: &DeviceEdges<'_>,
        source: GeometrySource<'_>,
        vectors: Option<&mut DeviceMem>,
        lengths: Option<&mut DeviceMem>,
    ) -> Result<(), DeviceError>;
    /// The gradient of the edge vectors from that of their lengths:
    /// `rows[e] = (g[e] / lengths[e]) · v_e` (zero where the length is
    /// zero), `v_e` as [`DeviceBackend::edge_geometry`] computes it.
    fn length_gradient_rows(
        &self,
        edges: &DeviceEdges<'_>,
        source: GeometrySource<'_>,
        g: &DeviceMem,
        lengths: &DeviceMem,
        rows: &mut DeviceMem,
    ) -> Result<(), DeviceError>;
    /// `out[e] = S_e ⊗ rows[e]` (edges × 9, element `3a + k` =
    /// `S_e,a · rows[e, k]`): what edge `e` adds to its system's cell
    /// gradient; zero for unshifted edges.
    fn shift_outer(
        &self,
        edges: &DeviceEdges<'_>,
        rows: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError>;
    /// Strained rows `out[r, k] = x[r, k] + Σ_m x[r, m] · ε_s[m, k]` (sum
    /// over m in order), `s = system[r]`, ε row-major 3 × 3 per system.
    fn strain_rows(
        &self,
        x: &DeviceMem,
        eps: &DeviceMem,
        system: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError>;
    /// The strained rows' gradient with respect to the rows:
    /// `out[r, m] (+)= g[r, m] + Σ_k g[r, k] · ε_s[m, k]`.
    fn strain_rows_grad(
        &self,
        eps: &DeviceMem,
        system: &DeviceMem,
        g: &DeviceMem,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError>;
    /// Per-row outer products `out[r, 3m + k] = x[r, m] · g[r, k]` (rows ×
    /// 9): each row's term of the strain's gradient.
    fn row_outer(
        &self,
        x: &DeviceMem,
        g: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError>;
    /// The K functions of `f` at each of the `rows` distances `d`, and
    /// their derivatives (both rows × K), computed in f64 and rounded.
    fn radial(
        &self,
        f: &Radial,
        d: &DeviceMem,
        values: &mut DeviceMem,
        derivatives: &mut DeviceMem,
    ) -> Result<(), DeviceError>;
    /// Every element of `mem` set to zero.
    fn zero(&self, mem: &mut DeviceMem) -> Result<(), DeviceError>;
    /// Copies a block of columns between row-major arrays of `rows` rows:
    /// `dst[r, dst.2 + c] = src[r, src.2 + c]` for `c < width`, each given
    /// as `(array, columns, first column)`; `dst`'s other columns keep
    /// their values.
    fn copy_cols(
        &self,
        rows: usize,
        width: usize,
        src: (&DeviceMem, usize, usize),
        dst: (&mut DeviceMem, usize, usize),
    ) -> Result<(), DeviceError>;
    /// A capability this backend offers beyond the generic kernels, looked
    /// up by the type that carries it (say, a model crate's handle to its
    /// own fused kernels on this device): `Some` when the backend has one.
    /// Callers downcast the result to the type whose id they passed.
    fn extension(&self, _id: TypeId) -> Option<&(dyn Any + Send + Sync)> {
        None
    }
}

/// Checks the column ranges of [`DeviceBackend::copy_cols`]: `width`
/// columns from `src_col0` of `src_cols` into `dst_col0` of `dst_cols`.
pub fn check_column_copy(
    width: usize,
    (src_cols, src_col0): (usize, usize),
    (dst_cols, dst_col0): (usize, usize),
) -> Result<(), DeviceError> {
    if src_col0 + width > src_cols || dst_col0 + width > dst_cols {
        return Err(DeviceError(format!(
            "columns {src_col0}+{width} of {src_cols} into {dst_col0}+{width} of {dst_cols}"
        )));
    }
    Ok(())
}

/// The device side of a kernel the engine sees as one op (an
/// [`OpaqueKernel`](crate::OpaqueKernel) or a row-wise kernel), as its
/// [`device_kernel`](crate::OpaqueKernel::device_kernel) returns it: the op
/// then runs on the device, forward and backward, under the same name,
/// shapes and row domains as on the host.
pub trait DeviceKernel<T: Scalar>: Send + Sync {
    /// Writes every element of `out` (the output shape the host kernel
    /// gives) from the inputs' device values; `shapes` as the host's.
    fn forward(
        &self,
        backend: &dyn DeviceBackend<T>,
        inputs: &[&DeviceMem],
        shapes: &[Shape],
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError>;
    /// The gradient of input `pos` from the output's `g`, as a new array of
    /// that input's shape, or `None` when the input has none (a constant of
    /// the structure). Inputs that [`DeviceKernel::backward_reads`] says are
    /// not read arrive as stand-ins of unspecified content.
    fn backward(
        &self,
        backend: &dyn DeviceBackend<T>,
        inputs: &[&DeviceMem],
        shapes: &[Shape],
        g: &DeviceMem,
        pos: usize,
    ) -> Result<Option<DeviceMem>, DeviceError>;
    /// Whether [`DeviceKernel::backward`] reads input `pos`'s value
    /// (default: yes), so that the engine may release those it does not.
    fn backward_reads(&self, _pos: usize) -> bool {
        true
    }
}

/// The device side of a [`MessageKernel`](crate::MessageKernel), as its
/// [`device_kernel`](crate::MessageKernel::device_kernel) returns it for one
/// set of edges.
pub trait DeviceMessageKernel<T: Scalar>: Send + Sync {
    /// Writes every element of `out` (rows × the kernel's output columns)
    /// from the node and edge inputs' device values.
    fn forward(
        &self,
        backend: &dyn DeviceBackend<T>,
        nodes: &[&DeviceMem],
        edges: &[&DeviceMem],
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError>;
    /// The gradients of the node inputs, then of the edge inputs, each a
    /// new array of its input's shape; `None` where `wants` (same order)
    /// says none is asked for.
    fn backward(
        &self,
        backend: &dyn DeviceBackend<T>,
        nodes: &[&DeviceMem],
        edges: &[&DeviceMem],
        g: &DeviceMem,
        wants: &[bool],
    ) -> Result<Vec<Option<DeviceMem>>, DeviceError>;
}

/// A row-wise affine map `y = x·M + b` (`M` dim_in × dim_out row-major, `b`
/// one row), on the host: what a linear kernel's device side runs as a GEMM.
#[derive(Debug, Clone, PartialEq)]
pub struct RowAffine<T> {
    /// Input width.
    pub dim_in: usize,
    /// Output width.
    pub dim_out: usize,
    /// `dim_in × dim_out`, row-major.
    pub matrix: Vec<T>,
    /// One row of `dim_out` values; `None` when every one is zero.
    pub bias: Option<Vec<T>>,
}

impl<T: Scalar> RowAffine<T> {
    /// Reads an affine row map off its values: `f(x, rows, out)` maps
    /// `rows × dim_in` to `rows × dim_out`; `b = f(0)` and row `k` of `M` is
    /// `f(e_k) − b`. For a map that is not affine per row the result is
    /// meaningless: the caller vouches for that.
    pub fn probe<E>(
        dim_in: usize,
        dim_out: usize,
        f: impl Fn(&[T], usize, &mut [T]) -> Result<(), E>,
    ) -> Result<Self, E> {
        let mut bias = vec![T::ZERO; dim_out];
        f(&vec![T::ZERO; dim_in], 1, &mut bias)?;
        let mut identity = vec![T::ZERO; dim_in * dim_in];
        for k in 0..dim_in {
            identity[k * dim_in + k] = T::ONE;
        }
        let mut matrix = vec![T::ZERO; dim_in * dim_out];
        if dim_in > 0 {
            f(&identity, dim_in, &mut matrix)?;
        }
        for row in matrix.chunks_mut(dim_out.max(1)) {
            for (m, &b) in row.iter_mut().zip(&bias) {
                *m -= b;
            }
        }
        let bias = bias.iter().any(|&b| b != T::ZERO).then_some(bias);
        Ok(Self {
            dim_in,
            dim_out,
            matrix,
            bias,
        })
    }

    /// The map on `backend`'s device (matrix and bias uploaded).
    pub fn to_device(&self, backend: &dyn DeviceBackend<T>) -> Result<DeviceAffine, DeviceError> {
        Ok(DeviceAffine {
            dim_in: self.dim_in,
            dim_out: self.dim_out,
            matrix: backend.upload(&self.matrix)?,
            bias: self
                .bias
                .as_deref()
                .map(|b| backend.upload(b))
                .transpose()?,
        })
    }
}

/// A [`RowAffine`] on a device: the [`DeviceKernel`] of a kernel with one
/// input (rows × dim_in) and output rows × dim_out, computed as one GEMM
/// (plus the bias row), its gradient as `g · Mᵀ`.
#[derive(Debug)]
pub struct DeviceAffine {
    dim_in: usize,
    dim_out: usize,
    matrix: DeviceMem,
    bias: Option<DeviceMem>,
}

impl<T: Scalar> DeviceKernel<T> for DeviceAffine {
    fn forward(
        &self,
        backend: &dyn DeviceBackend<T>,
        inputs: &[&DeviceMem],
        shapes: &[Shape],
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let (x, rows) = match (inputs, shapes) {
            ([x], [(_, rows, cols)]) if *cols == self.dim_in => (*x, *rows),
            _ => {
                return Err(DeviceError(format!(
                    "an affine map takes one input of {} columns",
                    self.dim_in
                )))
            }
        };
        let shape = GemmShape {
            m: rows,
            k: self.dim_in,
            n: self.dim_out,
            a_transposed: false,
            b_transposed: false,
        };
        match &self.bias {
            None => backend.gemm(shape, x, &self.matrix, out, false),
            Some(bias) => {
                let mut product = backend.alloc(rows * self.dim_out)?;
                backend.gemm(shape, x, &self.matrix, &mut product, false)?;
                backend.binary(
                    DeviceBinary::Add,
                    &product,
                    bias,
                    DeviceBroadcast::PerCol,
                    rows,
                    self.dim_out,
                    out,
                    false,
                )
            }
        }
    }

    fn backward(
        &self,
        backend: &dyn DeviceBackend<T>,
        _inputs: &[&DeviceMem],
        shapes: &[Shape],
        g: &DeviceMem,
        _pos: usize,
    ) -> Result<Option<DeviceMem>, DeviceError> {
        let rows = shapes.first().map_or(0, |s| s.1);
        let mut gx = backend.alloc(rows * self.dim_in)?;
        let shape = GemmShape {
            m: rows,
            k: self.dim_out,
            n: self.dim_in,
            a_transposed: false,
            b_transposed: true,
        };
        backend.gemm(shape, g, &self.matrix, &mut gx, false)?;
        Ok(Some(gx))
    }

    fn backward_reads(&self, _pos: usize) -> bool {
        false
    }
}

/// One device as a runtime sees it: it opens a backend per graph that runs
/// there (each with its own queue, so that ranks sharing the device never
/// share a stream), for either float type.
pub trait DeviceSource: Send + Sync {
    /// The device's name (`cuda:0`).
    fn name(&self) -> String;
    /// A new f64 backend on the device.
    fn open_f64(&self) -> Result<Arc<dyn DeviceBackend<f64>>, DeviceError>;
    /// A new f32 backend on the device.
    fn open_f32(&self) -> Result<Arc<dyn DeviceBackend<f32>>, DeviceError>;
}

/// The device a run's graphs use (what options hold): each graph — one
/// process's, every rank's, every MD step's evaluator — opens its own
/// backend there.
#[derive(Clone)]
pub struct EngineDevice(pub Arc<dyn DeviceSource>);

impl std::fmt::Debug for EngineDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EngineDevice({})", self.0.name())
    }
}

/// A new backend of element type `T` on `source`'s device.
pub fn open_backend<T: Scalar>(
    source: &dyn DeviceSource,
) -> Result<Arc<dyn DeviceBackend<T>>, DeviceError> {
    let opened: Box<dyn Any> = match T::DTYPE {
        DType::F64 => Box::new(source.open_f64()?),
        DType::F32 => Box::new(source.open_f32()?),
    };
    opened
        .downcast::<Arc<dyn DeviceBackend<T>>>()
        .map(|b| *b)
        .map_err(|_| DeviceError("no backend for this element type".into()))
}
