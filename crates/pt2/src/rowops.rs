//! Row-local kernels for the N-d ops of imported graphs whose first
//! dimension is the row (atoms or edges): per-row einsum (also `tensordot`
//! and `permute`), column gathers (`slice`, `narrow`, `cat`, `stack`) and
//! `clamp_min`. Each row is computed independently, so decomposed they need
//! no exchange (the engine's `rowwise`), and each has a backward.

use ddmlip_engine::ops::opaque::Shape;
use ddmlip_engine::{KernelError, OpaqueKernel, Scalar};
use rayon::prelude::*;

/// Rows per rayon task in the row-local kernels: rows are a few to a few
/// hundred values, so one task per row would cost more in scheduling than
/// in arithmetic.
const ROWS_PER_TASK: usize = 64;

/// `out[r, o…] = Σ_{contracted} Π_k operand_k[r?, …]`: an einsum whose
/// first label is the row in every per-row operand and in the output;
/// constant operands (weights) have no row label.
///
/// The constants are folded once, when the kernel is built, into a list of
/// terms `out[o] += c · Π_k x_k[i_k]` over the per-row operands `x_k` (zero
/// coefficients dropped, equal index tuples merged), so a row costs one
/// multiply-add per non-zero term and no index arithmetic: e3nn's
/// Clebsch–Gordan and Wigner blocks are mostly zeros, and outer products
/// and sums are 0/1 patterns. With one per-row operand the einsum is a
/// linear map `out_row = x_row · M`; [`RowEinsum::dense_matrix`] hands a
/// dense enough `M` to the engine's blocked GEMM instead.
pub(crate) struct RowEinsum {
    name: String,
    /// Values per row of each per-row (tensor) operand, in input order.
    in_cols: Vec<usize>,
    out_cols: usize,
    /// Per term: the output offset, then one offset per per-row operand.
    offsets: Vec<u32>,
    /// Per term: the product of the constant operands' factors.
    coefs: Vec<f64>,
}

/// One einsum operand: its labels (row label excluded), sizes and, for a
/// constant, its values.
pub(crate) struct EinsumOperand {
    pub labels: Vec<char>,
    pub sizes: Vec<usize>,
    pub constant: Option<Vec<f64>>,
}

/// A linear map with at least this fraction of non-zero entries runs as a
/// dense GEMM: below it, the term list does less work.
const DENSE_FRACTION: f64 = 0.3;

impl RowEinsum {
    /// Builds the contraction; `out_labels` excludes the row label.
    pub(crate) fn new(
        name: &str,
        operands: Vec<EinsumOperand>,
        out_labels: &[char],
    ) -> Result<RowEinsum, String> {
        let mut labels: Vec<char> = Vec::new();
        let mut sizes: Vec<usize> = Vec::new();
        for op in &operands {
            if op.labels.len() != op.sizes.len() {
                return Err(format!(
                    "{} labels for {} dimensions",
                    op.labels.len(),
                    op.sizes.len()
                ));
            }
            for (&l, &n) in op.labels.iter().zip(&op.sizes) {
                match labels.iter().position(|&x| x == l) {
                    Some(k) if sizes[k] != n => {
                        return Err(format!("label `{l}` has sizes {} and {n}", sizes[k]))
                    }
                    Some(_) => {}
                    None => {
                        labels.push(l);
                        sizes.push(n);
                    }
                }
            }
        }
        let strides_for = |ls: &[char]| -> Result<(Vec<usize>, usize), String> {
            let mut st = vec![0; labels.len()];
            let mut s = 1;
            for &l in ls.iter().rev() {
                let k = labels
                    .iter()
                    .position(|&x| x == l)
                    .ok_or_else(|| format!("output label `{l}` is in no operand"))?;
                if st[k] != 0 {
                    return Err(format!(
                        "label `{l}` repeated within one operand (diagonals are not supported)"
                    ));
                }
                st[k] = s;
                s *= sizes[k];
            }
            Ok((st, s))
        };
        let mut tensors = Vec::new();
        let mut constants = Vec::new();
        for op in &operands {
            let (st, n) = strides_for(&op.labels)?;
            match &op.constant {
                Some(c) if c.len() != n => {
                    return Err(format!("a constant of {} values for {n}", c.len()))
                }
                Some(c) => constants.push((st, c)),
                None => tensors.push((st, n)),
            }
        }
        let (out_strides, out_cols) = strides_for(out_labels)?;
        let combos: usize = sizes.iter().product();
        if u32::try_from(combos.max(out_cols)).is_err() {
            return Err(format!("an einsum of {combos} index combinations"));
        }
        // Every label combination once: its constant factor, and the term's
        // offsets (merged with an equal earlier term).
        let width = 1 + tensors.len();
        let mut offsets: Vec<u32> = Vec::new();
        let mut coefs: Vec<f64> = Vec::new();
        let mut seen: std::collections::HashMap<Vec<u32>, usize> = Default::default();
        let mut idx = vec![0usize; sizes.len()];
        let at =
            |idx: &[usize], st: &[usize]| -> usize { idx.iter().zip(st).map(|(i, s)| i * s).sum() };
        let mut key = Vec::with_capacity(width);
        for _ in 0..combos {
            let c: f64 = constants.iter().map(|(st, v)| v[at(&idx, st)]).product();
            if c != 0.0 {
                key.clear();
                key.push(at(&idx, &out_strides) as u32);
                key.extend(tensors.iter().map(|(st, _)| at(&idx, st) as u32));
                match seen.get(&key) {
                    Some(&t) => coefs[t] += c,
                    None => {
                        seen.insert(key.clone(), coefs.len());
                        offsets.extend_from_slice(&key);
                        coefs.push(c);
                    }
                }
            }
            // Next combination, the last label fastest.
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < sizes[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(RowEinsum {
            name: name.to_string(),
            in_cols: tensors.iter().map(|&(_, n)| n).collect(),
            out_cols,
            offsets,
            coefs,
        })
    }

    /// With exactly two per-row operands and no contraction (every output
    /// column the product of one column of each, coefficient 1: an outer or
    /// element-wise product such as `cb,ca->cba`), the column each operand
    /// gives each output column; `None` otherwise.
    pub(crate) fn product_maps(&self) -> Option<[Vec<u32>; 2]> {
        if self.in_cols.len() != 2 || self.coefs.len() != self.out_cols {
            return None;
        }
        let mut maps = [vec![u32::MAX; self.out_cols], vec![u32::MAX; self.out_cols]];
        for (t, &c) in self.offsets.chunks_exact(3).zip(&self.coefs) {
            let o = t[0] as usize;
            if c != 1.0 || maps[0][o] != u32::MAX {
                return None;
            }
            maps[0][o] = t[1];
            maps[1][o] = t[2];
        }
        Some(maps)
    }

    /// With exactly one per-row operand, the matrix `M` (row-major,
    /// `in_cols × out_cols`) of `out_row = x_row · M` when at least
    /// [`DENSE_FRACTION`] of its entries are non-zero; `None` otherwise.
    pub(crate) fn dense_matrix(&self) -> Option<(usize, usize, Vec<f64>)> {
        let [k] = self.in_cols[..] else { return None };
        let n = self.out_cols;
        let entries = k * n;
        if entries == 0 || (self.coefs.len() as f64) < DENSE_FRACTION * entries as f64 {
            return None;
        }
        let mut m = vec![0.0; entries];
        for (t, &c) in self.offsets.chunks_exact(2).zip(&self.coefs) {
            m[t[1] as usize * n + t[0] as usize] += c;
        }
        Some((k, n, m))
    }

    fn coefs_as<T: Scalar>(&self) -> Vec<T> {
        self.coefs.iter().map(|&c| T::from_f64(c)).collect()
    }
}

impl<T: Scalar> OpaqueKernel<T> for RowEinsum {
    fn name(&self) -> &str {
        &self.name
    }

    // The backward adds each term's gradient into its operand (zeroing a
    // fresh row first).
    fn adds_into_gradients(&self) -> bool {
        true
    }

    fn skips_unwanted_gradients(&self) -> bool {
        true
    }

    // Each output row is zeroed where it is about to be summed into.
    fn writes_every_output(&self) -> bool {
        true
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        let (domain, rows, _) = *inputs
            .first()
            .ok_or_else(|| inputs_err("per-row operands"))?;
        if inputs.len() != self.in_cols.len()
            || inputs
                .iter()
                .zip(&self.in_cols)
                .any(|(&(_, r, c), &n)| r != rows || c != n)
        {
            return Err(inputs_err(&format!(
                "{} per-row operands of {:?} values per row",
                self.in_cols.len(),
                self.in_cols
            )));
        }
        Ok((domain, rows, self.out_cols))
    }

    fn forward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        let coefs = self.coefs_as::<T>();
        let oc = self.out_cols.max(1);
        let width = 1 + self.in_cols.len();
        out.par_chunks_mut(oc * ROWS_PER_TASK)
            .enumerate()
            .for_each(|(block, o_block)| {
                let first = block * ROWS_PER_TASK;
                for (i, o) in o_block.chunks_mut(oc).enumerate() {
                    let r = first + i;
                    o.fill(T::zero());
                    let row = |k: usize| &inputs[k][r * self.in_cols[k]..(r + 1) * self.in_cols[k]];
                    let terms = self.offsets.chunks_exact(width).zip(&coefs);
                    match self.in_cols.len() {
                        1 => {
                            let x = row(0);
                            for (t, &c) in terms {
                                o[t[0] as usize] += c * x[t[1] as usize];
                            }
                        }
                        2 => {
                            let (x, y) = (row(0), row(1));
                            for (t, &c) in terms {
                                o[t[0] as usize] += c * x[t[1] as usize] * y[t[2] as usize];
                            }
                        }
                        n => {
                            for (t, &c) in terms {
                                let mut p = c;
                                for k in 0..n {
                                    p *= row(k)[t[1 + k] as usize];
                                }
                                o[t[0] as usize] += p;
                            }
                        }
                    }
                }
            });
        Ok(())
    }

    /// An operand is read by the gradients of the other operands.
    fn backward_reads(&self, input: usize, wants: &[bool]) -> bool {
        (0..wants.len()).any(|k| k != input && wants[k])
    }

    fn backward_fresh(
        &self,
        inputs: &[&[T]],
        shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
        fresh: &[bool],
    ) -> Option<Result<(), KernelError>> {
        let coefs = self.coefs_as::<T>();
        let oc = self.out_cols.max(1);
        let n_ops = self.in_cols.len();
        let width = 1 + n_ops;
        // One pass per per-row operand, parallel over its rows:
        // ∂out[o]/∂x_k[i_k] = c · Π_{j≠k} x_j[i_j].
        // An operand left unread (empty, with a non-empty shape) means no
        // gradient is wanted for the others (their buffers are empty).
        let unread = |j: usize| inputs[j].is_empty() && shapes[j].1 * shapes[j].2 > 0;
        for ((k, gk), &fresh) in grads.iter_mut().enumerate().zip(fresh) {
            if gk.is_empty() || (0..n_ops).any(|j| j != k && unread(j)) {
                continue;
            }
            let cols = self.in_cols[k].max(1);
            gk.par_chunks_mut(cols * ROWS_PER_TASK)
                .enumerate()
                .for_each(|(block, g_block)| {
                    let first = block * ROWS_PER_TASK;
                    for (i, gr) in g_block.chunks_mut(cols).enumerate() {
                        let r = first + i;
                        if fresh {
                            gr.fill(T::zero());
                        }
                        let row =
                            |j: usize| &inputs[j][r * self.in_cols[j]..(r + 1) * self.in_cols[j]];
                        let g = &grad_out[r * oc..(r + 1) * oc];
                        let terms = self.offsets.chunks_exact(width).zip(&coefs);
                        match n_ops {
                            1 => {
                                for (t, &c) in terms {
                                    gr[t[1] as usize] += c * g[t[0] as usize];
                                }
                            }
                            2 => {
                                let other = row(1 - k);
                                for (t, &c) in terms {
                                    gr[t[1 + k] as usize] +=
                                        c * g[t[0] as usize] * other[t[2 - k] as usize];
                                }
                            }
                            _ => {
                                for (t, &c) in terms {
                                    let mut p = c * g[t[0] as usize];
                                    for j in (0..n_ops).filter(|&j| j != k) {
                                        p *= row(j)[t[1 + j] as usize];
                                    }
                                    gr[t[1 + k] as usize] += p;
                                }
                            }
                        }
                    }
                });
        }
        Some(Ok(()))
    }
}

/// `out[r, j] = input_{src[j].0}[r, src[j].1]`: slices, narrows, permutes,
/// concatenations and stacks along non-row dimensions.
pub(crate) struct RowGather {
    pub name: String,
    /// For each output column: (input, column).
    pub src: Vec<(usize, usize)>,
}

/// A run of output columns `out..out + len` copied from columns
/// `col..col + len` of one input.
struct ColumnRun {
    input: usize,
    col: usize,
    out: usize,
    len: usize,
}

impl RowGather {
    /// The gather as runs of consecutive columns (a slice or narrow is one
    /// run per row, a concatenation one per part): `None` when runs average
    /// under two columns (a permute), where copying element by element is
    /// cheaper.
    fn runs(&self) -> Option<Vec<ColumnRun>> {
        let mut runs: Vec<ColumnRun> = Vec::new();
        for (j, &(input, col)) in self.src.iter().enumerate() {
            match runs.last_mut() {
                Some(r) if r.input == input && r.col + r.len == col => r.len += 1,
                _ => runs.push(ColumnRun {
                    input,
                    col,
                    out: j,
                    len: 1,
                }),
            }
        }
        (2 * runs.len() <= self.src.len()).then_some(runs)
    }
}

impl<T: Scalar> OpaqueKernel<T> for RowGather {
    fn name(&self) -> &str {
        &self.name
    }

    // Every output column names its source, and an input without a
    // gradient buffer has no rows to walk.
    fn writes_every_output(&self) -> bool {
        true
    }

    fn skips_unwanted_gradients(&self) -> bool {
        true
    }

    // The backward adds each output column's gradient into its source.
    fn adds_into_gradients(&self) -> bool {
        true
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        let (domain, rows, _) = *inputs
            .first()
            .ok_or_else(|| inputs_err("at least one input"))?;
        for &(i, c) in &self.src {
            let (_, r, cols) = *inputs
                .get(i)
                .ok_or_else(|| inputs_err("a gather input index within the inputs"))?;
            if r != rows || c >= cols {
                return Err(inputs_err("column indices within the input"));
            }
        }
        Ok((domain, rows, self.src.len()))
    }

    fn forward(&self, inputs: &[&[T]], shapes: &[Shape], out: &mut [T]) -> Result<(), KernelError> {
        let n = self.src.len().max(1);
        let runs = self.runs();
        out.par_chunks_mut(n * ROWS_PER_TASK)
            .enumerate()
            .for_each(|(block, o_block)| {
                let first = block * ROWS_PER_TASK;
                let rows = o_block.len() / n;
                match &runs {
                    // Run by run, each over the block's rows.
                    Some(runs) => {
                        for run in runs {
                            let cols = shapes[run.input].2;
                            let src = &inputs[run.input][first * cols + run.col..];
                            let dst = &mut o_block[run.out..];
                            run_rows(RunOp::Copy, dst, n, src, cols, rows, run.len);
                        }
                    }
                    None => {
                        for (k, o) in o_block.chunks_mut(n).enumerate() {
                            let r = first + k;
                            for (oj, &(i, c)) in o.iter_mut().zip(&self.src) {
                                *oj = inputs[i][r * shapes[i].2 + c];
                            }
                        }
                    }
                }
            });
        Ok(())
    }

    /// The backward routes the output gradient back: it reads no value.
    fn backward_reads(&self, _input: usize, _wants: &[bool]) -> bool {
        false
    }

    fn backward_fresh(
        &self,
        _inputs: &[&[T]],
        shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
        fresh: &[bool],
    ) -> Option<Result<(), KernelError>> {
        let n = self.src.len().max(1);
        // One pass per input, parallel over its rows, over the (output
        // column, input column) pairs that read it; a fresh row is zeroed
        // first, while it is in cache.
        let runs = self.runs();
        for ((i, gi), &fresh) in grads.iter_mut().enumerate().zip(fresh) {
            let cols = shapes[i].2.max(1);
            let pairs: Vec<(usize, usize)> = (self.src.iter().enumerate())
                .filter(|(_, &(input, _))| input == i)
                .map(|(j, &(_, c))| (j, c))
                .collect();
            let my_runs: Option<Vec<&ColumnRun>> = runs
                .as_ref()
                .map(|rs| rs.iter().filter(|run| run.input == i).collect());
            gi.par_chunks_mut(cols * ROWS_PER_TASK)
                .enumerate()
                .for_each(|(block, g_block)| {
                    let first = block * ROWS_PER_TASK;
                    // A fresh block is zeroed while it is in cache.
                    if fresh {
                        g_block.fill(T::zero());
                    }
                    match &my_runs {
                        Some(rs) => {
                            let rows = g_block.len() / cols;
                            for run in rs {
                                let src = &grad_out[first * n + run.out..];
                                let dst = &mut g_block[run.col..];
                                run_rows(RunOp::Add, dst, cols, src, n, rows, run.len);
                            }
                        }
                        None => {
                            for (k, gr) in g_block.chunks_mut(cols).enumerate() {
                                let g = &grad_out[(first + k) * n..(first + k + 1) * n];
                                for &(j, c) in &pairs {
                                    gr[c] += g[j];
                                }
                            }
                        }
                    }
                });
        }
        Some(Ok(()))
    }
}

/// What [`run_rows`] does with each element of a run.
#[derive(Clone, Copy)]
enum RunOp {
    Copy,
    Add,
}

/// For each of `rows` rows `k`: `dst[k·dst_stride..][..len]` is set to
/// (`Copy`) or increased by (`Add`) `src[k·src_stride..][..len]`, one run
/// of columns row by row. Short runs (a few columns of an irreps block)
/// have their width fixed at compile time, so that each row is a few
/// vector moves instead of a `memcpy` call or a loop of unknown length.
fn run_rows<T: Scalar>(
    op: RunOp,
    dst: &mut [T],
    dst_stride: usize,
    src: &[T],
    src_stride: usize,
    rows: usize,
    len: usize,
) {
    macro_rules! fixed {
        ($($n:literal)*) => {
            match len {
                $($n => return run_rows_fixed::<T, $n>(op, dst, dst_stride, src, src_stride, rows),)*
                _ => {}
            }
        };
    }
    fixed!(1 2 3 4 5 6 7 8 9 12 15 16 24 32);
    for k in 0..rows {
        let d = &mut dst[k * dst_stride..k * dst_stride + len];
        let s = &src[k * src_stride..k * src_stride + len];
        match op {
            RunOp::Copy => d.copy_from_slice(s),
            RunOp::Add => d.iter_mut().zip(s).for_each(|(d, &s)| *d += s),
        }
    }
}

/// [`run_rows`] for runs of `N` columns.
#[inline(always)]
fn run_rows_fixed<T: Scalar, const N: usize>(
    op: RunOp,
    dst: &mut [T],
    dst_stride: usize,
    src: &[T],
    src_stride: usize,
    rows: usize,
) {
    let rows = (dst, dst_stride, src, src_stride, rows);
    match op {
        RunOp::Copy => each_fixed_row::<T, N>(rows, |d, s| *d = *s),
        RunOp::Add => {
            each_fixed_row::<T, N>(rows, |d, s| d.iter_mut().zip(s).for_each(|(d, &s)| *d += s))
        }
    }
}

/// `f(dst row k, src row k)` over `rows` rows of `N` elements at the given
/// strides: one loop per `f`, its arithmetic inlined. The ranges have
/// exactly N elements (indexing past the end panics, as any slice would),
/// so the chunks always exist.
#[inline(always)]
fn each_fixed_row<T: Scalar, const N: usize>(
    (dst, dst_stride, src, src_stride, rows): (&mut [T], usize, &[T], usize, usize),
    f: impl Fn(&mut [T; N], &[T; N]),
) {
    for k in 0..rows {
        let (d, s) = (k * dst_stride, k * src_stride);
        if let (Some(d), Some(s)) = (
            dst[d..d + N].first_chunk_mut::<N>(),
            src[s..s + N].first_chunk::<N>(),
        ) {
            f(d, s);
        }
    }
}

/// The arithmetic of a [`RowBroadcast`] kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum BroadcastOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BroadcastOp {
    #[inline(always)]
    fn apply<T: Scalar>(self, a: T, b: T) -> T {
        match self {
            BroadcastOp::Add => a + b,
            BroadcastOp::Sub => a - b,
            BroadcastOp::Mul => a * b,
            BroadcastOp::Div => a / b,
        }
    }

    /// Which operands (a, b) the partial of operand `k` reads.
    fn needs(self, k: usize) -> [bool; 2] {
        match (self, k) {
            (BroadcastOp::Add | BroadcastOp::Sub, _) => [false, false],
            (BroadcastOp::Mul | BroadcastOp::Div, 0) => [false, true],
            (BroadcastOp::Mul, _) => [true, false],
            (BroadcastOp::Div, _) => [true, true],
        }
    }

    /// (∂/∂a, ∂/∂b) of `apply(a, b)`.
    #[inline(always)]
    fn partials<T: Scalar>(self, a: T, b: T) -> (T, T) {
        match self {
            BroadcastOp::Add => (T::one(), T::one()),
            BroadcastOp::Sub => (T::one(), -T::one()),
            BroadcastOp::Mul => (b, a),
            BroadcastOp::Div => (T::one() / b, -a / (b * b)),
        }
    }
}

/// `out[r, j] = a[r, a_map[j]] ⊕ b[r, b_map[j]]`: a binary op of two
/// operands broadcast within rows (`[E, 8, 1] · [E, 1, 9]`) without
/// materialising either broadcast. An operand that is not per-row has one
/// row (a constant without the row dimension), read in every row.
pub(crate) struct RowBroadcast {
    pub op: BroadcastOp,
    /// Per operand, the column it reads for each output column.
    pub maps: [Vec<u32>; 2],
    /// Per operand, whether it has the output's rows (else one row); at
    /// least one has.
    pub per_row: [bool; 2],
}

impl RowBroadcast {
    fn cols(&self) -> usize {
        self.maps[0].len()
    }
}

/// How an operand of a [`RowBroadcast`] is read within a row: the loops of
/// the first two kinds are contiguous and vectorise.
#[derive(Clone, Copy, PartialEq, Debug)]
enum MapKind {
    /// Column `j` of the output reads column `j` (the operand has the
    /// output's columns).
    Same,
    /// Every output column reads the one column of the operand.
    Scalar,
    /// Any other pattern, read through the map.
    General,
}

impl MapKind {
    fn of(map: &[u32], cols: usize) -> MapKind {
        if cols == map.len() && map.iter().enumerate().all(|(j, &k)| k as usize == j) {
            MapKind::Same
        } else if cols == 1 && map.iter().all(|&k| k == 0) {
            MapKind::Scalar
        } else {
            MapKind::General
        }
    }
}

/// `o[j] = f(a[ma[j]], b[mb[j]])` for one row, with the contiguous kinds
/// as loops without index reads.
#[inline(always)]
fn broadcast_row<T: Scalar>(
    f: impl Fn(T, T) -> T,
    kinds: [MapKind; 2],
    (a, ma): (&[T], &[u32]),
    (b, mb): (&[T], &[u32]),
    o: &mut [T],
) {
    let n = o.len();
    match kinds {
        [MapKind::Same, MapKind::Same] => {
            for ((o, &x), &y) in o.iter_mut().zip(&a[..n]).zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        [MapKind::Same, MapKind::Scalar] => {
            let y = b[0];
            for (o, &x) in o.iter_mut().zip(&a[..n]) {
                *o = f(x, y);
            }
        }
        [MapKind::Scalar, MapKind::Same] => {
            let x = a[0];
            for (o, &y) in o.iter_mut().zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        _ => {
            for ((o, &ka), &kb) in o.iter_mut().zip(ma).zip(mb) {
                *o = f(a[ka as usize], b[kb as usize]);
            }
        }
    }
}

/// For each column `c` of an operand, the output columns that read it
/// (`map[j] == c`), in ascending order: `sources[starts[c]..starts[c + 1]]`.
struct ColumnSources {
    starts: Vec<u32>,
    sources: Vec<u32>,
}

impl ColumnSources {
    fn of(map: &[u32], cols: usize) -> ColumnSources {
        let mut starts = vec![0u32; cols + 1];
        for &c in map {
            starts[c as usize + 1] += 1;
        }
        for c in 0..cols {
            starts[c + 1] += starts[c];
        }
        let mut next = starts.clone();
        let mut sources = vec![0u32; map.len()];
        for (j, &c) in map.iter().enumerate() {
            sources[next[c as usize] as usize] = j as u32;
            next[c as usize] += 1;
        }
        ColumnSources { starts, sources }
    }
}

/// Adds operand `k`'s gradient within one row into `gr`: `gr[m_k[j]] +=
/// g[j] · ∂f/∂x_k(a[ma[j]], b[mb[j]])`. A general map sums each column's
/// terms (`sources`, ascending output column) in a register and adds the
/// sum once: adding term by term into memory would chain every add on the
/// store before it.
#[inline(always)]
fn broadcast_row_grad<T: Scalar>(
    partials: impl Fn(T, T) -> (T, T),
    k: usize,
    kinds: [MapKind; 2],
    (a, ma): (&[T], &[u32]),
    (b, mb): (&[T], &[u32]),
    (g, sources): (&[T], &ColumnSources),
    gr: &mut [T],
) {
    let n = g.len();
    match (k, kinds) {
        (0, [MapKind::Same, MapKind::Same]) => {
            for ((gr, &gj), (&x, &y)) in gr[..n].iter_mut().zip(g).zip(a[..n].iter().zip(&b[..n])) {
                *gr += gj * partials(x, y).0;
            }
        }
        (1, [MapKind::Same, MapKind::Same]) => {
            for ((gr, &gj), (&x, &y)) in gr[..n].iter_mut().zip(g).zip(a[..n].iter().zip(&b[..n])) {
                *gr += gj * partials(x, y).1;
            }
        }
        (0, [MapKind::Same, MapKind::Scalar]) => {
            let y = b[0];
            for ((gr, &gj), &x) in gr[..n].iter_mut().zip(g).zip(&a[..n]) {
                *gr += gj * partials(x, y).0;
            }
        }
        (1, [MapKind::Scalar, MapKind::Same]) => {
            let x = a[0];
            for ((gr, &gj), &y) in gr[..n].iter_mut().zip(g).zip(&b[..n]) {
                *gr += gj * partials(x, y).1;
            }
        }
        _ => {
            for (c, gc) in gr.iter_mut().enumerate() {
                let from =
                    &sources.sources[sources.starts[c] as usize..sources.starts[c + 1] as usize];
                let mut sum = T::zero();
                for &j in from {
                    let j = j as usize;
                    let (da, db) = partials(a[ma[j] as usize], b[mb[j] as usize]);
                    sum += g[j] * if k == 0 { da } else { db };
                }
                *gc += sum;
            }
        }
    }
}

/// One operand of a broadcast as the gradient loops read it: its values
/// (a row of zeros for an operand left unread), whether it has a row per
/// output row, and its columns.
#[derive(Clone, Copy)]
struct OperandRows<'v, T> {
    values: &'v [T],
    per_row: bool,
    cols: usize,
}

impl<'v, T: Scalar> OperandRows<'v, T> {
    #[inline(always)]
    fn row(&self, r: usize) -> &'v [T] {
        let start = if self.per_row { r * self.cols } else { 0 };
        &self.values[start..start + self.cols]
    }
}

/// Whether the maps are the outer product `out[i·nb + k] = a[i] ⊕ b[k]`.
fn is_outer(maps: &[Vec<u32>; 2], ca: usize, cb: usize) -> bool {
    maps[0].len() == ca * cb
        && cb > 0
        && (maps[0].iter().zip(&maps[1]).enumerate())
            .all(|(j, (&ka, &kb))| ka as usize == j / cb && kb as usize == j % cb)
}

/// Operand `k`'s gradient over the rows `first..` of `block` (`cols` per
/// row) for the common map kinds, each a loop of its own with the kind
/// matched once: both operands the output's columns, one a per-row
/// scalar, or an outer product. A fresh block is assigned, else added
/// into. `false` when the kinds are none of these.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn broadcast_block_grad<T: Scalar>(
    partials: &impl Fn(T, T) -> (T, T),
    k: usize,
    (kinds, outer): ([MapKind; 2], bool),
    [a, b]: [OperandRows<'_, T>; 2],
    grad_out: &[T],
    (first, block, cols): (usize, &mut [T], usize),
    fresh: bool,
) -> bool {
    let n = a.cols.max(b.cols);
    let n = if outer { a.cols * b.cols } else { n };
    let put = |dst: &mut T, v: T| {
        if fresh {
            *dst = v
        } else {
            *dst += v
        }
    };
    let rows = block.chunks_exact_mut(cols.max(1)).enumerate();
    match (k, kinds) {
        (_, [MapKind::Same, MapKind::Same]) => {
            for (i, gr) in rows {
                let r = first + i;
                let (x, y, g) = (a.row(r), b.row(r), &grad_out[r * n..(r + 1) * n]);
                let terms = gr.iter_mut().zip(g).zip(x.iter().zip(y));
                if k == 0 {
                    terms.for_each(|((d, &gj), (&x, &y))| put(d, gj * partials(x, y).0));
                } else {
                    terms.for_each(|((d, &gj), (&x, &y))| put(d, gj * partials(x, y).1));
                }
            }
        }
        (0, [MapKind::Same, MapKind::Scalar]) => {
            for (i, gr) in rows {
                let r = first + i;
                let (x, y, g) = (a.row(r), b.row(r)[0], &grad_out[r * n..(r + 1) * n]);
                for ((d, &gj), &x) in gr.iter_mut().zip(g).zip(x) {
                    put(d, gj * partials(x, y).0);
                }
            }
        }
        (1, [MapKind::Scalar, MapKind::Same]) => {
            for (i, gr) in rows {
                let r = first + i;
                let (x, y, g) = (a.row(r)[0], b.row(r), &grad_out[r * n..(r + 1) * n]);
                for ((d, &gj), &y) in gr.iter_mut().zip(g).zip(y) {
                    put(d, gj * partials(x, y).1);
                }
            }
        }
        (1, [MapKind::Same, MapKind::Scalar]) => {
            for (i, gr) in rows {
                let r = first + i;
                let (x, y, g) = (a.row(r), b.row(r)[0], &grad_out[r * n..(r + 1) * n]);
                let mut sum = T::zero();
                for (&gj, &x) in g.iter().zip(x) {
                    sum += gj * partials(x, y).1;
                }
                put(&mut gr[0], sum);
            }
        }
        (0, [MapKind::Scalar, MapKind::Same]) => {
            for (i, gr) in rows {
                let r = first + i;
                let (x, y, g) = (a.row(r)[0], b.row(r), &grad_out[r * n..(r + 1) * n]);
                let mut sum = T::zero();
                for (&gj, &y) in g.iter().zip(y) {
                    sum += gj * partials(x, y).0;
                }
                put(&mut gr[0], sum);
            }
        }
        _ if outer => {
            let nb = b.cols;
            for (i, gr) in rows {
                let r = first + i;
                let (x, y, g) = (a.row(r), b.row(r), &grad_out[r * n..(r + 1) * n]);
                if k == 0 {
                    for ((d, &x), gi) in gr.iter_mut().zip(x).zip(g.chunks_exact(nb)) {
                        let mut sum = T::zero();
                        for (&gj, &y) in gi.iter().zip(y) {
                            sum += gj * partials(x, y).0;
                        }
                        put(d, sum);
                    }
                } else {
                    if fresh {
                        gr.fill(T::zero());
                    }
                    for (&x, gi) in x.iter().zip(g.chunks_exact(nb)) {
                        for ((d, &gj), &y) in gr.iter_mut().zip(gi).zip(y) {
                            *d += gj * partials(x, y).1;
                        }
                    }
                }
            }
        }
        _ => return false,
    }
    true
}

impl RowBroadcast {
    fn forward_with<T: Scalar>(
        &self,
        f: impl Fn(T, T) -> T + Sync,
        inputs: &[&[T]],
        shapes: &[Shape],
        out: &mut [T],
    ) {
        let n = self.cols().max(1);
        let (ca, cb) = (shapes[0].2, shapes[1].2);
        let [pa, pb] = self.per_row;
        let (ma, mb) = (&self.maps[0][..], &self.maps[1][..]);
        let kinds = [MapKind::of(ma, ca), MapKind::of(mb, cb)];
        out.par_chunks_mut(n * ROWS_PER_TASK)
            .enumerate()
            .for_each(|(block, o_block)| {
                let r0 = block * ROWS_PER_TASK;
                if pa && pb && kinds == [MapKind::Same, MapKind::Same] {
                    // Both operands are the output's shape: one flat loop.
                    let len = o_block.len();
                    let (a, b) = (&inputs[0][r0 * n..], &inputs[1][r0 * n..]);
                    for ((o, &x), &y) in o_block.iter_mut().zip(&a[..len]).zip(&b[..len]) {
                        *o = f(x, y);
                    }
                    return;
                }
                for (i, o) in o_block.chunks_mut(n).enumerate() {
                    let r = r0 + i;
                    let a = &inputs[0][if pa { r * ca } else { 0 }..];
                    let b = &inputs[1][if pb { r * cb } else { 0 }..];
                    broadcast_row(&f, kinds, (a, ma), (b, mb), o);
                }
            });
    }

    fn backward_with<T: Scalar>(
        &self,
        partials: impl Fn(T, T) -> (T, T) + Sync,
        (inputs, shapes): (&[&[T]], &[Shape]),
        grad_out: &[T],
        grads: &mut [Vec<T>],
        fresh: &[bool],
    ) {
        let n = self.cols().max(1);
        let [pa, pb] = self.per_row;
        let rows = if pa { shapes[0].1 } else { shapes[1].1 };
        let (ca, cb) = (shapes[0].2, shapes[1].2);
        let (ma, mb) = (&self.maps[0][..], &self.maps[1][..]);
        let kinds = [MapKind::of(ma, ca), MapKind::of(mb, cb)];
        // An operand left unread (empty, with a non-empty shape: released
        // after the forward pass) is read by no partial that is wanted; a
        // row of zeros stands in for it in the partials nobody uses.
        let unread = |i: usize| inputs[i].is_empty() && shapes[i].1 * shapes[i].2 > 0;
        let stand_in = |i: usize, cols: usize| {
            if unread(i) {
                vec![T::zero(); cols]
            } else {
                Vec::new()
            }
        };
        let (zeros_a, zeros_b) = (stand_in(0, ca), stand_in(1, cb));
        let sources = [ColumnSources::of(ma, ca), ColumnSources::of(mb, cb)];
        let shape = (kinds, is_outer(&self.maps, ca, cb));
        let operand = |i: usize| {
            let (zeros, per_row, cols) = if i == 0 {
                (&zeros_a, pa, ca)
            } else {
                (&zeros_b, pb, cb)
            };
            if unread(i) {
                OperandRows {
                    values: &zeros[..],
                    per_row: false,
                    cols,
                }
            } else {
                OperandRows {
                    values: inputs[i],
                    per_row,
                    cols,
                }
            }
        };
        let row_grad = |k: usize, r: usize, gr: &mut [T]| {
            let a = if unread(0) {
                &zeros_a[..]
            } else {
                &inputs[0][if pa { r * ca } else { 0 }..]
            };
            let b = if unread(1) {
                &zeros_b[..]
            } else {
                &inputs[1][if pb { r * cb } else { 0 }..]
            };
            let g = &grad_out[r * n..(r + 1) * n];
            let g = (g, &sources[k]);
            broadcast_row_grad(&partials, k, kinds, (a, ma), (b, mb), g, gr);
        };
        for ((k, gk), &fresh) in grads.iter_mut().enumerate().zip(fresh) {
            // An empty buffer: this operand needs no gradient (a constant);
            // a partial that reads an unread operand is not wanted either.
            let needs = self.op.needs(k);
            if gk.is_empty() || (0..2).any(|i| needs[i] && unread(i)) {
                if fresh {
                    gk.fill(T::zero());
                }
                continue;
            }
            let (per_row, cols) = if k == 0 { (pa, ca) } else { (pb, cb) };
            if per_row {
                gk.par_chunks_mut(cols.max(1) * ROWS_PER_TASK)
                    .enumerate()
                    .for_each(|(block, g_block)| {
                        let first = block * ROWS_PER_TASK;
                        let rows = (first, &mut *g_block, cols);
                        let ops = [operand(0), operand(1)];
                        if broadcast_block_grad(&partials, k, shape, ops, grad_out, rows, fresh) {
                            return;
                        }
                        for (i, gr) in g_block.chunks_mut(cols.max(1)).enumerate() {
                            // A fresh row is zeroed where it is summed into.
                            if fresh {
                                gr.fill(T::zero());
                            }
                            row_grad(k, block * ROWS_PER_TASK + i, gr);
                        }
                    });
            } else {
                // One row read by every row: its gradient sums over them.
                if fresh {
                    gk.fill(T::zero());
                }
                for r in 0..rows {
                    row_grad(k, r, gk);
                }
            }
        }
    }
}

impl<T: Scalar> OpaqueKernel<T> for RowBroadcast {
    fn name(&self) -> &str {
        "broadcast"
    }

    // The backward adds each partial's gradient into its operand.
    fn adds_into_gradients(&self) -> bool {
        true
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        let [a, b] = inputs else {
            return Err(inputs_err("two operands"));
        };
        // Rows (and row domain) of the first per-row operand: with zero
        // edges, a one-row constant must not make the output one row.
        let (domain, rows) = if self.per_row[0] {
            (a.0, a.1)
        } else {
            (b.0, b.1)
        };
        let fits = |&(_, r, c): &Shape, map: &[u32], per_row: bool| {
            (if per_row { r == rows } else { r == 1 }) && map.iter().all(|&k| (k as usize) < c)
        };
        if !(self.per_row[0] || self.per_row[1])
            || self.maps[1].len() != self.cols()
            || !fits(a, &self.maps[0], self.per_row[0])
            || !fits(b, &self.maps[1], self.per_row[1])
        {
            return Err(inputs_err(
                "two operands of the output's rows (or one row) holding every mapped column",
            ));
        }
        Ok((domain, rows, self.cols()))
    }

    fn forward(&self, inputs: &[&[T]], shapes: &[Shape], out: &mut [T]) -> Result<(), KernelError> {
        // One loop per operation, so that each vectorises.
        match self.op {
            BroadcastOp::Add => {
                self.forward_with(|a, b| BroadcastOp::Add.apply(a, b), inputs, shapes, out)
            }
            BroadcastOp::Sub => {
                self.forward_with(|a, b| BroadcastOp::Sub.apply(a, b), inputs, shapes, out)
            }
            BroadcastOp::Mul => {
                self.forward_with(|a, b| BroadcastOp::Mul.apply(a, b), inputs, shapes, out)
            }
            BroadcastOp::Div => {
                self.forward_with(|a, b| BroadcastOp::Div.apply(a, b), inputs, shapes, out)
            }
        }
        Ok(())
    }

    /// An operand is read when the partial of an operand that needs a
    /// gradient reads it (a sum reads neither).
    fn backward_reads(&self, input: usize, wants: &[bool]) -> bool {
        (0..2).any(|k| wants.get(k) == Some(&true) && self.op.needs(k)[input])
    }

    fn backward_fresh(
        &self,
        inputs: &[&[T]],
        shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
        fresh: &[bool],
    ) -> Option<Result<(), KernelError>> {
        let (v, g) = ((inputs, shapes), grad_out);
        match self.op {
            BroadcastOp::Add => {
                self.backward_with(|a, b| BroadcastOp::Add.partials(a, b), v, g, grads, fresh)
            }
            BroadcastOp::Sub => {
                self.backward_with(|a, b| BroadcastOp::Sub.partials(a, b), v, g, grads, fresh)
            }
            BroadcastOp::Mul => {
                self.backward_with(|a, b| BroadcastOp::Mul.partials(a, b), v, g, grads, fresh)
            }
            BroadcastOp::Div => {
                self.backward_with(|a, b| BroadcastOp::Div.partials(a, b), v, g, grads, fresh)
            }
        }
        Some(Ok(()))
    }

    fn skips_unwanted_gradients(&self) -> bool {
        true
    }

    fn writes_every_output(&self) -> bool {
        true
    }
}

/// `max(x, min)` element-wise; the gradient passes where `x > min`.
pub(crate) struct ClampMin(pub f64);

impl<T: Scalar> OpaqueKernel<T> for ClampMin {
    fn name(&self) -> &str {
        "clamp_min"
    }

    fn writes_every_output(&self) -> bool {
        true
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        inputs
            .first()
            .copied()
            .ok_or_else(|| inputs_err("one input"))
    }

    fn forward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        let m = T::from_f64(self.0);
        for (o, &x) in out.iter_mut().zip(inputs[0]) {
            *o = if x > m { x } else { m };
        }
        Ok(())
    }

    // The backward adds into the gradient so far, or assigns a fresh one.
    fn adds_into_gradients(&self) -> bool {
        true
    }

    fn backward_fresh(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
        fresh: &[bool],
    ) -> Option<Result<(), KernelError>> {
        let m = T::from_f64(self.0);
        let pass = |g: T, x: T| if x > m { g } else { T::zero() };
        let gx = grads[0].iter_mut().zip(grad_out).zip(inputs[0]);
        if fresh.first() == Some(&true) {
            gx.for_each(|((gi, &g), &x)| *gi = pass(g, x));
        } else {
            gx.for_each(|((gi, &g), &x)| *gi += pass(g, x));
        }
        Some(Ok(()))
    }
}

/// torch's normalised sinc, sin(πx)/(πx), 1 at x = 0.
pub(crate) fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let y = std::f64::consts::PI * x;
        y.sin() / y
    }
}

/// Elements per block of the sinc kernels: the arguments and their sines
/// and cosines sit in three arrays on the stack.
const SINC_BLOCK: usize = 256;

/// Elements per rayon task of the sinc kernels.
const SINC_TASK: usize = 16 * SINC_BLOCK;

/// Runs `f(x, sinc x, (cos πx − sinc x)/x)` (the value and its derivative,
/// 1 and 0 at x = 0) over `x` block by block, the sines and cosines from
/// the vectorised [`ddmlip_float::sin_cos_slice`].
#[inline(always)]
fn for_each_sinc<T: Scalar>(x: &[T], mut f: impl FnMut(usize, f64, f64)) {
    let mut y = [0.0f64; SINC_BLOCK];
    let mut s = [0.0f64; SINC_BLOCK];
    let mut c = [0.0f64; SINC_BLOCK];
    for (b, xb) in x.chunks(SINC_BLOCK).enumerate() {
        let n = xb.len();
        for (yi, &xi) in y.iter_mut().zip(xb) {
            *yi = std::f64::consts::PI * xi.to_f64_lossless();
        }
        ddmlip_float::sin_cos_slice(&y[..n], &mut s[..n], &mut c[..n]);
        for (i, &xi) in xb.iter().enumerate() {
            let x = xi.to_f64_lossless();
            let (value, slope) = if x == 0.0 {
                (1.0, 0.0)
            } else {
                let v = s[i] / y[i];
                (v, (c[i] - v) / x)
            };
            f(b * SINC_BLOCK + i, value, slope);
        }
    }
}

/// Element-wise [`sinc`] (NequIP's Bessel encoding), with its exact gradient.
pub(crate) struct Sinc;

impl<T: Scalar> OpaqueKernel<T> for Sinc {
    fn name(&self) -> &str {
        "sinc"
    }

    fn writes_every_output(&self) -> bool {
        true
    }

    // The backward adds into the gradient so far, or assigns a fresh one.
    fn adds_into_gradients(&self) -> bool {
        true
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        inputs
            .first()
            .copied()
            .ok_or_else(|| inputs_err("one input"))
    }

    fn forward(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        out.par_chunks_mut(SINC_TASK)
            .zip(inputs[0].par_chunks(SINC_TASK))
            .for_each(|(o, x)| for_each_sinc(x, |i, value, _| o[i] = T::from_f64(value)));
        Ok(())
    }

    fn backward_fresh(
        &self,
        inputs: &[&[T]],
        _shapes: &[Shape],
        grad_out: &[T],
        grads: &mut [Vec<T>],
        fresh: &[bool],
    ) -> Option<Result<(), KernelError>> {
        let fresh = fresh.first() == Some(&true);
        grads[0]
            .par_chunks_mut(SINC_TASK)
            .zip(inputs[0].par_chunks(SINC_TASK))
            .zip(grad_out.par_chunks(SINC_TASK))
            .for_each(|((gx, x), g)| {
                if fresh {
                    for_each_sinc(x, |i, _, slope| gx[i] = g[i] * T::from_f64(slope));
                } else {
                    for_each_sinc(x, |i, _, slope| gx[i] += g[i] * T::from_f64(slope));
                }
            });
        Some(Ok(()))
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Flat indices (within one row, or the whole tensor when `shape` has no
/// row) of the elements a strided view `[start, start+len)` along `dim`
/// selects, in output order.
pub(crate) fn slice_map(
    shape: &[usize],
    dim: usize,
    start: usize,
    len: usize,
    step: usize,
) -> Vec<usize> {
    let mut out_shape = shape.to_vec();
    out_shape[dim] = len;
    let st = strides(shape);
    let total: usize = out_shape.iter().product();
    let ost = strides(&out_shape);
    (0..total)
        .map(|i| {
            (0..shape.len())
                .map(|d| {
                    let k = (i / ost[d]) % out_shape[d].max(1);
                    let k = if d == dim { start + k * step } else { k };
                    k * st[d]
                })
                .sum()
        })
        .collect()
}

/// Flat indices of `permute(shape, perm)` in output order.
pub(crate) fn permute_map(shape: &[usize], perm: &[usize]) -> Vec<usize> {
    let st = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let ost = strides(&out_shape);
    let total: usize = out_shape.iter().product();
    (0..total)
        .map(|i| {
            (0..perm.len())
                .map(|d| ((i / ost[d]) % out_shape[d].max(1)) * st[perm[d]])
                .sum()
        })
        .collect()
}

/// A kernel's inputs are not what it takes; `expected` says what it takes.
fn inputs_err(expected: &str) -> KernelError {
    KernelError::Inputs {
        expected: expected.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddmlip_engine::{Graph, RowDomain};
    use std::sync::Arc;

    fn values(n: usize, seed: f64) -> Vec<f64> {
        (0..n).map(|k| ((k as f64 + 1.0) * seed).sin()).collect()
    }

    /// Σ w ⊙ kernel(inputs) and its gradients w.r.t. every input.
    fn eval(
        kernel: &Arc<dyn OpaqueKernel<f64>>,
        inputs: &[(Vec<f64>, usize)],
        rows: usize,
    ) -> (f64, Vec<Vec<f64>>) {
        let mut g = Graph::<f64>::new();
        let leaves: Vec<_> = inputs
            .iter()
            .map(|(v, cols)| g.leaf(v.clone(), rows, *cols, RowDomain::Edge))
            .collect();
        let y = g.rowwise(kernel.clone(), &leaves).unwrap();
        let w = values(g.value(y).len(), 0.37);
        let loss = g.value(y).iter().zip(&w).map(|(a, b)| a * b).sum();
        let grads = g.grad(y, Some(w), &leaves).unwrap();
        (loss, grads)
    }

    /// The gradients of Σ w ⊙ (kernel(inputs) + kernel(inputs)): the
    /// second kernel's backward runs first and finds no gradient (fresh
    /// buffers), the first's then adds into what the second left.
    fn grads_of_twice(
        kernel: &Arc<dyn OpaqueKernel<f64>>,
        inputs: &[(Vec<f64>, usize)],
        rows: usize,
    ) -> Vec<Vec<f64>> {
        let mut g = Graph::<f64>::new();
        let leaves: Vec<_> = inputs
            .iter()
            .map(|(v, cols)| g.leaf(v.clone(), rows, *cols, RowDomain::Edge))
            .collect();
        let y1 = g.rowwise(kernel.clone(), &leaves).unwrap();
        let y2 = g.rowwise(kernel.clone(), &leaves).unwrap();
        let y = g.add(y1, y2).unwrap();
        let w = values(g.value(y).len(), 0.37);
        g.grad(y, Some(w), &leaves).unwrap()
    }

    /// Finite differences of the kernel's backward, and the backward adding
    /// into an accumulated gradient (twice the kernel, twice the gradient)
    /// as well as it fills a fresh one.
    fn check_gradients(
        kernel: Arc<dyn OpaqueKernel<f64>>,
        inputs: Vec<(Vec<f64>, usize)>,
        rows: usize,
    ) {
        let (_, grads) = eval(&kernel, &inputs, rows);
        let twice = grads_of_twice(&kernel, &inputs, rows);
        for (k, (once, twice)) in grads.iter().zip(&twice).enumerate() {
            for (i, (a, b)) in once.iter().zip(twice).enumerate() {
                assert!(
                    (2.0 * a - b).abs() <= 1e-14 * (1.0 + b.abs()),
                    "input {k}[{i}]: twice the kernel gives {b}, not 2 × {a}"
                );
            }
        }
        let h = 1e-6;
        for (k, (v, _)) in inputs.iter().enumerate() {
            // Perturbs element i of input k in copies of the inputs.
            #[allow(clippy::needless_range_loop)]
            for i in 0..v.len() {
                let mut plus = inputs.clone();
                plus[k].0[i] += h;
                let mut minus = inputs.clone();
                minus[k].0[i] -= h;
                let fd = (eval(&kernel, &plus, rows).0 - eval(&kernel, &minus, rows).0) / (2.0 * h);
                assert!(
                    (fd - grads[k][i]).abs() <= 1e-7 * (1.0 + fd.abs()),
                    "input {k}[{i}]: {} vs {fd}",
                    grads[k][i]
                );
            }
        }
    }

    fn operand(labels: &str, sizes: &[usize], constant: Option<Vec<f64>>) -> EinsumOperand {
        EinsumOperand {
            labels: labels.chars().collect(),
            sizes: sizes.to_vec(),
            constant,
        }
    }

    #[test]
    fn row_einsum_forward_is_the_per_row_contraction() {
        // out[r, a, c] = Σ_b x[r, a, b] · w[b, c]: a matrix product per row.
        let (rows, a, b, c) = (3, 2, 4, 5);
        let x = values(rows * a * b, 0.7);
        let w = values(b * c, 1.3);
        let k = RowEinsum::new(
            "t",
            vec![
                operand("ab", &[a, b], None),
                operand("bc", &[b, c], Some(w.clone())),
            ],
            &['a', 'c'],
        )
        .unwrap();
        let k: Arc<dyn OpaqueKernel<f64>> = Arc::new(k);
        let mut g = Graph::<f64>::new();
        let t = g.leaf(x.clone(), rows, a * b, RowDomain::Edge);
        let y = g.rowwise(k, &[t]).unwrap();
        for r in 0..rows {
            for i in 0..a {
                for j in 0..c {
                    let want: f64 = (0..b)
                        .map(|m| x[r * a * b + i * b + m] * w[m * c + j])
                        .sum();
                    let got = g.value(y)[r * a * c + i * c + j];
                    assert!((got - want).abs() < 1e-14, "{got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn row_einsum_backward_matches_finite_differences() {
        // Two per-row operands with an outer product (e3nn's `edb,eca->ecdab`).
        let k = RowEinsum::new(
            "outer",
            vec![operand("db", &[2, 3], None), operand("ca", &[2, 2], None)],
            &['c', 'd', 'a', 'b'],
        )
        .unwrap();
        let maps = k.product_maps().expect("an outer product");
        // Output (c, d, a, b) = (0, 0, a, b): column b of `db`'s row d = 0,
        // column a of `ca`'s row c = 0.
        assert_eq!(maps[0][..6], [0, 1, 2, 0, 1, 2], "(d, b) of the first");
        assert_eq!(maps[1][..6], [0, 0, 0, 1, 1, 1], "(c, a) of the second");
        check_gradients(
            Arc::new(k),
            vec![(values(12, 0.3), 6), (values(8, 0.9), 4)],
            2,
        );
        // A contraction with a constant (`dba,dabc->dc` with a weight).
        let w = values(3 * 2, 1.1);
        let k = RowEinsum::new(
            "contract",
            vec![
                operand("ba", &[2, 3], None),
                operand("ac", &[3, 2], Some(w)),
            ],
            &['c'],
        )
        .unwrap();
        check_gradients(Arc::new(k), vec![(values(12, 0.5), 6)], 2);
    }

    #[test]
    fn row_einsum_with_one_operand_is_its_matrix_and_folds_constant_labels() {
        // out[r, c] = Σ_{a,b} x[r, a] · u[a, b] · v[b, c]: the label `b`
        // lives in constants only, so M = u·v (terms merged over `b`).
        let (a, b, c) = (3, 4, 5);
        let u = values(a * b, 0.7);
        let v = values(b * c, 1.9);
        let k = RowEinsum::new(
            "chain",
            vec![
                operand("a", &[a], None),
                operand("ab", &[a, b], Some(u.clone())),
                operand("bc", &[b, c], Some(v.clone())),
            ],
            &['c'],
        )
        .unwrap();
        assert_eq!(k.coefs.len(), a * c, "one term per (a, c) pair");
        let (rows_m, cols_m, m) = k.dense_matrix().unwrap();
        assert_eq!((rows_m, cols_m), (a, c));
        for i in 0..a {
            for j in 0..c {
                let want: f64 = (0..b).map(|q| u[i * b + q] * v[q * c + j]).sum();
                assert!((m[i * c + j] - want).abs() < 1e-14);
            }
        }
        check_gradients(Arc::new(k), vec![(values(2 * a, 0.4), a)], 2);
        // A 0/1 selection (a sum over one of three labels) stays a term list.
        let k = RowEinsum::new("sum", vec![operand("abc", &[2, 3, 4], None)], &['a', 'c']).unwrap();
        assert!(k.dense_matrix().is_none());
        check_gradients(Arc::new(k), vec![(values(48, 0.2), 24)], 2);
        // Three per-row operands with a sparse constant.
        let w: Vec<f64> = (0..8)
            .map(|q| if q % 3 == 0 { 0.0 } else { q as f64 - 3.5 })
            .collect();
        let k = RowEinsum::new(
            "three",
            vec![
                operand("i", &[2], None),
                operand("j", &[2], None),
                operand("k", &[2], None),
                operand("ijk", &[2, 2, 2], Some(w)),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(k.coefs.len(), 5, "zero coefficients are dropped");
        check_gradients(
            Arc::new(k),
            vec![
                (values(6, 0.3), 2),
                (values(6, 0.8), 2),
                (values(6, 1.3), 2),
            ],
            3,
        );
    }

    #[test]
    fn row_broadcast_matches_a_direct_broadcast_and_finite_differences() {
        // [r, 2, 1] ⊕ [r, 1, 3] → [r, 2, 3].
        let a_map = vec![0, 0, 0, 1, 1, 1];
        let b_map = vec![0, 1, 2, 0, 1, 2];
        let (rows, x, y) = (3, values(6, 0.45), values(9, 0.65));
        for op in [
            BroadcastOp::Add,
            BroadcastOp::Sub,
            BroadcastOp::Mul,
            BroadcastOp::Div,
        ] {
            let k = RowBroadcast {
                op,
                maps: [a_map.clone(), b_map.clone()],
                per_row: [true, true],
            };
            let k: Arc<dyn OpaqueKernel<f64>> = Arc::new(k);
            let mut g = Graph::<f64>::new();
            let ta = g.leaf(x.clone(), rows, 2, RowDomain::Edge);
            let tb = g.leaf(y.clone(), rows, 3, RowDomain::Edge);
            let t = g.rowwise(k.clone(), &[ta, tb]).unwrap();
            for r in 0..rows {
                for i in 0..2 {
                    for j in 0..3 {
                        let (p, q) = (x[r * 2 + i], y[r * 3 + j]);
                        let want = match op {
                            BroadcastOp::Add => p + q,
                            BroadcastOp::Sub => p - q,
                            BroadcastOp::Mul => p * q,
                            BroadcastOp::Div => p / q,
                        };
                        assert_eq!(g.value(t)[r * 6 + i * 3 + j], want, "{op:?}");
                    }
                }
            }
            check_gradients(k, vec![(x.clone(), 2), (y.clone(), 3)], rows);
        }
        // A one-row second operand is read in every row; its gradient sums them.
        let k = RowBroadcast {
            op: BroadcastOp::Mul,
            maps: [a_map, b_map],
            per_row: [true, false],
        };
        let k: Arc<dyn OpaqueKernel<f64>> = Arc::new(k);
        let mut g = Graph::<f64>::new();
        let ta = g.leaf(x.clone(), rows, 2, RowDomain::Edge);
        let tb = g.leaf(y[..3].to_vec(), 1, 3, RowDomain::None);
        let t = g.rowwise(k.clone(), &[ta, tb]).unwrap();
        let w = values(rows * 6, 0.37);
        let grads = g.grad(t, Some(w.clone()), &[ta, tb]).unwrap();
        for j in 0..3 {
            let want: f64 = (0..rows)
                .flat_map(|r| (0..2).map(move |i| (r, i)))
                .map(|(r, i)| w[r * 6 + i * 3 + j] * x[r * 2 + i])
                .sum();
            assert!(
                (grads[1][j] - want).abs() < 1e-14,
                "{} vs {want}",
                grads[1][j]
            );
        }
        // No rows (no edges): no output rows, however many the constant has.
        let ta = g.leaf(Vec::new(), 0, 2, RowDomain::Edge);
        let tb = g.leaf(y[..3].to_vec(), 1, 3, RowDomain::None);
        let t = g.rowwise(k, &[ta, tb]).unwrap();
        assert_eq!(g.shape(t), (0, 6));
    }

    #[test]
    fn row_gather_and_clamp_backward_match_finite_differences() {
        // A permute of a 2×3 block and a concatenation with a second input.
        let k = RowGather {
            name: "g".into(),
            src: vec![(0, 0), (0, 3), (0, 1), (1, 1), (0, 4), (1, 0)],
        };
        check_gradients(
            Arc::new(k),
            vec![(values(12, 0.4), 6), (values(4, 0.8), 2)],
            2,
        );
        // Runs of columns (a slice, then a concatenation of two parts, one
        // of them read twice): copied run by run.
        let k = RowGather {
            name: "runs".into(),
            src: vec![(0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (0, 1), (0, 2)],
        };
        assert_eq!(k.runs().map(|r| r.len()), Some(3));
        let (x, y) = (values(12, 0.4), values(6, 0.8));
        let kernel: Arc<dyn OpaqueKernel<f64>> = Arc::new(k);
        let mut g = Graph::<f64>::new();
        let tx = g.leaf(x.clone(), 3, 4, RowDomain::Edge);
        let ty = g.leaf(y.clone(), 3, 2, RowDomain::Edge);
        let t = g.rowwise(kernel.clone(), &[tx, ty]).unwrap();
        for r in 0..3 {
            let want = [
                x[r * 4 + 1],
                x[r * 4 + 2],
                x[r * 4 + 3],
                y[r * 2],
                y[r * 2 + 1],
                x[r * 4 + 1],
                x[r * 4 + 2],
            ];
            assert_eq!(&g.value(t)[r * 7..(r + 1) * 7], &want);
        }
        check_gradients(kernel, vec![(x, 4), (y, 2)], 3);
        check_gradients(Arc::new(ClampMin(0.1)), vec![(values(8, 0.6), 4)], 2);
    }

    #[test]
    fn sinc_is_sin_pi_x_over_pi_x_and_its_backward_matches_finite_differences() {
        for x in [-1.7, -0.3, 0.25, 0.5, 1.0, 2.2] {
            let want = (std::f64::consts::PI * x).sin() / (std::f64::consts::PI * x);
            assert!((sinc(x) - want).abs() < 1e-15, "{x}");
        }
        assert_eq!(sinc(0.0), 1.0);
        assert!((sinc(1e-9) - 1.0).abs() < 1e-15);
        check_gradients(Arc::new(Sinc), vec![(values(8, 0.6), 4)], 2);
    }

    #[test]
    fn slice_and_permute_maps() {
        // shape [2, 3]: column 1 of each row; rows 0..2 step 1 of dim 0.
        assert_eq!(slice_map(&[2, 3], 1, 1, 1, 1), vec![1, 4]);
        assert_eq!(slice_map(&[4], 0, 1, 2, 2), vec![1, 3]);
        // The transpose of a 2×3 block.
        assert_eq!(permute_map(&[2, 3], &[1, 0]), vec![0, 3, 1, 4, 2, 5]);
    }
}

#[cfg(test)]
#[path = "rowops_tests.rs"]
mod broadcast_kernel_tests;
