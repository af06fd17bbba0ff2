//! [`ReferenceDevice`]: a device backend whose "device" is separate host
//! memory and whose kernels are the plainest loops. It is what the tests
//! run the engine's device paths with on machines without an accelerator,
//! and the definition the accelerator backends' kernels are held to.

use super::{
    DeviceBackend, DeviceBinary, DeviceBroadcast, DeviceCsr, DeviceEdges, DeviceError, DeviceMem,
    DeviceSource, GemmShape, GeometrySource,
};
use crate::ops::{Radial, Unary};
use crate::Scalar;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A device in host memory (see the module docs), counting its transfers.
#[derive(Debug, Default)]
pub struct ReferenceDevice {
    uploads: AtomicUsize,
    downloads: AtomicUsize,
}

impl ReferenceDevice {
    /// A new device with no transfers counted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Arrays copied to the device so far (values and index arrays).
    pub fn uploads(&self) -> usize {
        self.uploads.load(Ordering::Relaxed)
    }

    /// Arrays copied back to the host so far.
    pub fn downloads(&self) -> usize {
        self.downloads.load(Ordering::Relaxed)
    }
}

/// Opens a fresh [`ReferenceDevice`] per graph.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceSource;

impl DeviceSource for ReferenceSource {
    fn name(&self) -> String {
        "reference".into()
    }

    fn open_f64(&self) -> Result<Arc<dyn DeviceBackend<f64>>, DeviceError> {
        Ok(Arc::new(ReferenceDevice::new()))
    }

    fn open_f32(&self) -> Result<Arc<dyn DeviceBackend<f32>>, DeviceError> {
        Ok(Arc::new(ReferenceDevice::new()))
    }
}

fn read<T: 'static>(m: &DeviceMem) -> Result<&Vec<T>, DeviceError> {
    m.get::<Vec<T>>()
        .ok_or_else(|| DeviceError("an array of another device or type".into()))
}

fn write<T: 'static>(m: &mut DeviceMem) -> Result<&mut Vec<T>, DeviceError> {
    m.get_mut::<Vec<T>>()
        .ok_or_else(|| DeviceError("an array of another device or type".into()))
}

/// `out[i] = v` or `out[i] += v`.
fn store<T: Scalar>(out: &mut T, v: T, accumulate: bool) {
    if accumulate {
        *out += v;
    } else {
        *out = v;
    }
}

impl<T: Scalar> DeviceBackend<T> for ReferenceDevice {
    fn name(&self) -> String {
        "reference".into()
    }

    fn alloc(&self, len: usize) -> Result<DeviceMem, DeviceError> {
        // NaN, so that an element a kernel should write and does not shows.
        Ok(DeviceMem::new(Box::new(vec![T::nan(); len]), len))
    }

    fn upload(&self, host: &[T]) -> Result<DeviceMem, DeviceError> {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        Ok(DeviceMem::new(Box::new(host.to_vec()), host.len()))
    }

    fn upload_indices(&self, host: &[u32]) -> Result<DeviceMem, DeviceError> {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        Ok(DeviceMem::new(Box::new(host.to_vec()), host.len()))
    }

    fn download(&self, mem: &DeviceMem, out: &mut [T]) -> Result<(), DeviceError> {
        self.downloads.fetch_add(1, Ordering::Relaxed);
        out.copy_from_slice(read::<T>(mem)?);
        Ok(())
    }

    fn axpy(
        &self,
        alpha: f64,
        x: &DeviceMem,
        y: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let a = T::from_f64(alpha);
        let x = read::<T>(x)?.clone();
        for (o, &v) in write::<T>(y)?.iter_mut().zip(&x) {
            store(o, a * v, accumulate);
        }
        Ok(())
    }

    fn unary(&self, f: Unary, x: &DeviceMem, out: &mut DeviceMem) -> Result<(), DeviceError> {
        let x = read::<T>(x)?.clone();
        for (o, &v) in write::<T>(out)?.iter_mut().zip(&x) {
            *o = f.apply(v);
        }
        Ok(())
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
        let (x, y, g) = (read::<T>(x)?, read::<T>(y)?, read::<T>(g)?);
        let terms: Vec<T> = (0..g.len())
            .map(|i| g[i] * f.derivative(x[i], y[i]))
            .collect();
        for (o, v) in write::<T>(out)?.iter_mut().zip(terms) {
            store(o, v, accumulate);
        }
        Ok(())
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
        let (a, b) = (read::<T>(a)?, read::<T>(b)?);
        let mut terms = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                let y = match bc {
                    DeviceBroadcast::Full => b[r * cols + c],
                    DeviceBroadcast::PerRow => b[r],
                    DeviceBroadcast::PerCol => b[c],
                    DeviceBroadcast::Scalar => b[0],
                };
                let x = a[r * cols + c];
                terms.push(match op {
                    DeviceBinary::Add => x + y,
                    DeviceBinary::Sub => x - y,
                    DeviceBinary::Mul => x * y,
                });
            }
        }
        for (o, v) in write::<T>(out)?.iter_mut().zip(terms) {
            store(o, v, accumulate);
        }
        Ok(())
    }

    fn row_sums(
        &self,
        x: &DeviceMem,
        rows: usize,
        cols: usize,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let x = read::<T>(x)?;
        let sums: Vec<T> = (0..rows)
            .map(|r| x[r * cols..(r + 1) * cols].iter().copied().sum())
            .collect();
        for (o, v) in write::<T>(out)?.iter_mut().zip(sums) {
            store(o, v, accumulate);
        }
        Ok(())
    }

    fn col_sums(
        &self,
        x: &DeviceMem,
        rows: usize,
        cols: usize,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let x = read::<T>(x)?;
        let sums: Vec<T> = (0..cols)
            .map(|c| (0..rows).map(|r| x[r * cols + c]).sum())
            .collect();
        for (o, v) in write::<T>(out)?.iter_mut().zip(sums) {
            store(o, v, accumulate);
        }
        Ok(())
    }

    fn gather_rows(
        &self,
        src: &DeviceMem,
        cols: usize,
        index: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let (src, index) = (read::<T>(src)?, read::<u32>(index)?);
        let out = write::<T>(out)?;
        for (r, &s) in index.iter().enumerate() {
            let s = s as usize;
            out[r * cols..(r + 1) * cols].copy_from_slice(&src[s * cols..(s + 1) * cols]);
        }
        Ok(())
    }

    fn sum_rows_csr(
        &self,
        src: &DeviceMem,
        cols: usize,
        csr: &DeviceCsr,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let src = read::<T>(src)?;
        let offsets = read::<u32>(&csr.offsets)?;
        let sources = csr.sources.as_ref().map(read::<u32>).transpose()?;
        let out = write::<T>(out)?;
        for t in 0..csr.targets {
            for c in 0..cols {
                let mut sum = 0.0f64;
                for k in offsets[t] as usize..offsets[t + 1] as usize {
                    let s = sources.map_or(k, |v| v[k] as usize);
                    sum += src[s * cols + c].to_f64_lossless();
                }
                store(&mut out[t * cols + c], T::from_f64(sum), accumulate);
            }
        }
        Ok(())
    }

    fn gemm(
        &self,
        s: GemmShape,
        a: &DeviceMem,
        b: &DeviceMem,
        c: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let (a, b) = (read::<T>(a)?, read::<T>(b)?);
        let at = |i: usize, p: usize| {
            if s.a_transposed {
                a[p * s.m + i]
            } else {
                a[i * s.k + p]
            }
        };
        let bt = |p: usize, j: usize| {
            if s.b_transposed {
                b[j * s.k + p]
            } else {
                b[p * s.n + j]
            }
        };
        let c = write::<T>(c)?;
        for i in 0..s.m {
            for j in 0..s.n {
                let v = (0..s.k).map(|p| at(i, p) * bt(p, j)).sum();
                store(&mut c[i * s.n + j], v, accumulate);
            }
        }
        Ok(())
    }

    fn upload_f64(&self, host: &[f64]) -> Result<DeviceMem, DeviceError> {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        Ok(DeviceMem::new(Box::new(host.to_vec()), host.len()))
    }

    fn edge_geometry(
        &self,
        edges: &DeviceEdges<'_>,
        source: GeometrySource<'_>,
        vectors: Option<&mut DeviceMem>,
        lengths: Option<&mut DeviceMem>,
    ) -> Result<(), DeviceError> {
        let v: Vec<[T; 3]> = edge_vectors::<T>(edges, source)?;
        if let Some(out) = vectors {
            let out = write::<T>(out)?;
            for (e, ve) in v.iter().enumerate() {
                out[3 * e..3 * e + 3].copy_from_slice(ve);
            }
        }
        if let Some(out) = lengths {
            let exact = edge_lengths_f64(edges, source)?;
            let out = write::<T>(out)?;
            for (e, ve) in v.iter().enumerate() {
                out[e] = match &exact {
                    Some(l) => T::from_f64(l[e]),
                    None => (ve[0] * ve[0] + ve[1] * ve[1] + ve[2] * ve[2]).sqrt(),
                };
            }
        }
        Ok(())
    }

    fn length_gradient_rows(
        &self,
        edges: &DeviceEdges<'_>,
        source: GeometrySource<'_>,
        g: &DeviceMem,
        lengths: &DeviceMem,
        rows: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let v = edge_vectors::<T>(edges, source)?;
        let (g, lengths) = (read::<T>(g)?, read::<T>(lengths)?);
        let out = write::<T>(rows)?;
        for (e, ve) in v.iter().enumerate() {
            let scale = if lengths[e] > T::zero() {
                g[e] / lengths[e]
            } else {
                T::zero()
            };
            for k in 0..3 {
                out[3 * e + k] = scale * ve[k];
            }
        }
        Ok(())
    }

    fn shift_outer(
        &self,
        edges: &DeviceEdges<'_>,
        rows: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let rows = read::<T>(rows)?;
        let shifts = match edges.periodic {
            Some((s, _)) => Some(read::<u32>(s)?),
            None => None,
        };
        let out = write::<T>(out)?;
        for e in 0..edges.count {
            for a in 0..3 {
                let sa = shifts.map_or(0, |s| s[3 * e + a] as i32);
                for k in 0..3 {
                    out[9 * e + 3 * a + k] = T::from_f64(f64::from(sa)) * rows[3 * e + k];
                }
            }
        }
        Ok(())
    }

    fn strain_rows(
        &self,
        x: &DeviceMem,
        eps: &DeviceMem,
        system: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let (x, eps, system) = (read::<T>(x)?, read::<T>(eps)?, read::<u32>(system)?);
        let out = write::<T>(out)?;
        for (r, &s) in system.iter().enumerate() {
            let e = &eps[9 * s as usize..9 * s as usize + 9];
            for k in 0..3 {
                let mut v = x[3 * r + k];
                for m in 0..3 {
                    v += x[3 * r + m] * e[3 * m + k];
                }
                out[3 * r + k] = v;
            }
        }
        Ok(())
    }

    fn strain_rows_grad(
        &self,
        eps: &DeviceMem,
        system: &DeviceMem,
        g: &DeviceMem,
        out: &mut DeviceMem,
        accumulate: bool,
    ) -> Result<(), DeviceError> {
        let (eps, system, g) = (read::<T>(eps)?, read::<u32>(system)?, read::<T>(g)?);
        let out = write::<T>(out)?;
        for (r, &s) in system.iter().enumerate() {
            let e = &eps[9 * s as usize..9 * s as usize + 9];
            for m in 0..3 {
                let mut v = g[3 * r + m];
                for k in 0..3 {
                    v += g[3 * r + k] * e[3 * m + k];
                }
                store(&mut out[3 * r + m], v, accumulate);
            }
        }
        Ok(())
    }

    fn row_outer(
        &self,
        x: &DeviceMem,
        g: &DeviceMem,
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let (x, g) = (read::<T>(x)?, read::<T>(g)?);
        let out = write::<T>(out)?;
        for r in 0..x.len() / 3 {
            for m in 0..3 {
                for k in 0..3 {
                    out[9 * r + 3 * m + k] = x[3 * r + m] * g[3 * r + k];
                }
            }
        }
        Ok(())
    }

    fn radial(
        &self,
        f: &Radial,
        d: &DeviceMem,
        values: &mut DeviceMem,
        derivatives: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let k = f.width();
        let d = read::<T>(d)?.clone();
        let (mut v64, mut d64) = (vec![0.0; k], vec![0.0; k]);
        let mut vals = Vec::with_capacity(d.len() * k);
        let mut ders = Vec::with_capacity(d.len() * k);
        for &x in &d {
            f.eval(x.to_f64_lossless(), &mut v64, &mut d64);
            vals.extend(v64.iter().map(|&v| T::from_f64(v)));
            ders.extend(d64.iter().map(|&v| T::from_f64(v)));
        }
        write::<T>(values)?.copy_from_slice(&vals);
        write::<T>(derivatives)?.copy_from_slice(&ders);
        Ok(())
    }

    fn zero(&self, mem: &mut DeviceMem) -> Result<(), DeviceError> {
        write::<T>(mem)?.fill(T::ZERO);
        Ok(())
    }

    fn copy_cols(
        &self,
        rows: usize,
        width: usize,
        (src, src_cols, src_col0): (&DeviceMem, usize, usize),
        (dst, dst_cols, dst_col0): (&mut DeviceMem, usize, usize),
    ) -> Result<(), DeviceError> {
        super::check_column_copy(width, (src_cols, src_col0), (dst_cols, dst_col0))?;
        let src = read::<T>(src)?;
        let dst = write::<T>(dst)?;
        for r in 0..rows {
            let s = &src[r * src_cols + src_col0..r * src_cols + src_col0 + width];
            dst[r * dst_cols + dst_col0..r * dst_cols + dst_col0 + width].copy_from_slice(s);
        }
        Ok(())
    }
}

/// Edge vectors in the host's order of operations: in `U`, then rounded
/// to `T` (`U` = f64 for exact sources).
fn vectors_in<U: Scalar, T: Scalar>(
    edges: &DeviceEdges<'_>,
    positions: &[U],
    cell: Option<&[U]>,
) -> Result<Vec<[T; 3]>, DeviceError> {
    let (c, n) = (read::<u32>(edges.center)?, read::<u32>(edges.neighbor)?);
    let periodic = match edges.periodic {
        Some((s, sys)) => Some((read::<u32>(s)?, read::<u32>(sys)?)),
        None => None,
    };
    let mut out = Vec::with_capacity(edges.count);
    for e in 0..edges.count {
        let (i, j) = (3 * c[e] as usize, 3 * n[e] as usize);
        let mut v = [
            positions[j] - positions[i],
            positions[j + 1] - positions[i + 1],
            positions[j + 2] - positions[i + 2],
        ];
        if let (Some((shifts, systems)), Some(cell)) = (periodic, cell) {
            let base = 9 * systems[e] as usize;
            for a in 0..3 {
                let sa = shifts[3 * e + a] as i32;
                if sa != 0 {
                    for k in 0..3 {
                        v[k] += U::from_f64(f64::from(sa)) * cell[base + 3 * a + k];
                    }
                }
            }
        }
        out.push(v.map(|x| T::from_f64(x.to_f64_lossless())));
    }
    Ok(out)
}

/// [`vectors_in`] for `source`.
fn edge_vectors<T: Scalar>(
    edges: &DeviceEdges<'_>,
    source: GeometrySource<'_>,
) -> Result<Vec<[T; 3]>, DeviceError> {
    if source.exact {
        let cell = source.cell.map(read::<f64>).transpose()?;
        vectors_in::<f64, T>(edges, read::<f64>(source.positions)?, cell.map(|c| &c[..]))
    } else {
        let cell = source.cell.map(read::<T>).transpose()?;
        vectors_in::<T, T>(edges, read::<T>(source.positions)?, cell.map(|c| &c[..]))
    }
}

/// The f64 lengths of an exact source's f64 vectors; `None` otherwise.
fn edge_lengths_f64(
    edges: &DeviceEdges<'_>,
    source: GeometrySource<'_>,
) -> Result<Option<Vec<f64>>, DeviceError> {
    if !source.exact {
        return Ok(None);
    }
    let v = edge_vectors::<f64>(edges, source)?;
    Ok(Some(
        v.iter()
            .map(|v| (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt())
            .collect(),
    ))
}
