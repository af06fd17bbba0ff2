//! Kernels with a device side of their own ([`OpaqueKernel::device_kernel`],
//! [`MessageKernel::device_kernel`]) and column slices on the device: on the
//! reference device they give the host graph's values, gradients and trace,
//! and run where the trace says.

use ddmlip_engine::device::{
    DeviceBackend, DeviceBinary, DeviceBroadcast, DeviceCsr, DeviceError, DeviceKernel, DeviceMem,
    DeviceMessageKernel, ReferenceDevice, RowAffine,
};
use ddmlip_engine::ops::opaque::Shape;
use ddmlip_engine::{
    Graph, KernelError, MessageEdges, MessageInputs, MessageKernel, OpaqueKernel, RowDomain, Trace,
};
use std::sync::Arc;

fn rand_vec(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// `y = x·M + b` row by row, written as plain loops (the host kernel);
/// its device side is the matrix read off it by [`RowAffine::probe`].
struct Affine {
    m: Vec<f64>,
    b: Vec<f64>,
    dims: (usize, usize),
}

impl Affine {
    fn apply(&self, x: &[f64], rows: usize, out: &mut [f64]) -> Result<(), KernelError> {
        let (di, dout) = self.dims;
        for r in 0..rows {
            for o in 0..dout {
                let mut acc = self.b[o];
                for k in 0..di {
                    acc += x[r * di + k] * self.m[k * dout + o];
                }
                out[r * dout + o] = acc;
            }
        }
        Ok(())
    }
}

impl OpaqueKernel<f64> for Affine {
    fn name(&self) -> &str {
        "affine"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, KernelError> {
        Ok((inputs[0].0, inputs[0].1, self.dims.1))
    }
    fn forward(
        &self,
        inputs: &[&[f64]],
        shapes: &[Shape],
        out: &mut [f64],
    ) -> Result<(), KernelError> {
        self.apply(inputs[0], shapes[0].1, out)
    }
    fn backward(
        &self,
        _inputs: &[&[f64]],
        shapes: &[Shape],
        g: &[f64],
        grads: &mut [Vec<f64>],
    ) -> Option<Result<(), KernelError>> {
        let (di, dout) = self.dims;
        for r in 0..shapes[0].1 {
            for k in 0..di {
                grads[0][r * di + k] += (0..dout)
                    .map(|o| g[r * dout + o] * self.m[k * dout + o])
                    .sum::<f64>();
            }
        }
        Some(Ok(()))
    }
    fn device_kernel(
        &self,
        backend: &dyn DeviceBackend<f64>,
    ) -> Result<Option<Arc<dyn DeviceKernel<f64>>>, DeviceError> {
        let a = RowAffine::probe(self.dims.0, self.dims.1, |x: &[f64], n, out: &mut [f64]| {
            self.apply(x, n, out)
        })
        .map_err(|e| DeviceError(e.to_string()))?;
        Ok(Some(Arc::new(a.to_device(backend)?)))
    }
}

/// `out[i] = Σ_{e: center e = i} w_e · h[neighbour e]` (node input `h`,
/// edge input `w`, one column), on the host in loops and on the device
/// composed of the backend's gathers, products and inverse-map sums.
struct WeightedSum {
    cols: usize,
}

impl MessageKernel<f64> for WeightedSum {
    fn name(&self) -> &str {
        "weighted_sum"
    }
    fn out_cols(&self) -> usize {
        self.cols
    }
    fn forward(&self, x: &MessageInputs<'_, f64>, out: &mut [f64]) -> Result<(), KernelError> {
        let c = self.cols;
        for (e, (&i, &j)) in x.center.iter().zip(x.neighbor).enumerate() {
            for k in 0..c {
                out[i as usize * c + k] += x.edges[0][e] * x.nodes[0][j as usize * c + k];
            }
        }
        Ok(())
    }
    fn backward(
        &self,
        x: &MessageInputs<'_, f64>,
        g: &[f64],
        gn: &mut [Vec<f64>],
        ge: &mut [Vec<f64>],
    ) -> Result<(), KernelError> {
        let c = self.cols;
        for (e, (&i, &j)) in x.center.iter().zip(x.neighbor).enumerate() {
            for k in 0..c {
                let gi = g[i as usize * c + k];
                gn[0][j as usize * c + k] += x.edges[0][e] * gi;
                ge[0][e] += gi * x.nodes[0][j as usize * c + k];
            }
        }
        Ok(())
    }
    fn device_kernel(
        &self,
        backend: &dyn DeviceBackend<f64>,
        edges: &MessageEdges<'_>,
    ) -> Result<Option<Arc<dyn DeviceMessageKernel<f64>>>, DeviceError> {
        let csr = |index: &[u32]| -> Result<DeviceCsr, DeviceError> {
            let mut order: Vec<u32> = (0..index.len() as u32).collect();
            order.sort_by_key(|&e| (index[e as usize], e));
            let mut offsets = vec![0u32; edges.n_rows + 1];
            for &t in index {
                offsets[t as usize + 1] += 1;
            }
            for t in 0..edges.n_rows {
                offsets[t + 1] += offsets[t];
            }
            Ok(DeviceCsr {
                offsets: backend.upload_indices(&offsets)?,
                sources: Some(backend.upload_indices(&order)?),
                targets: edges.n_rows,
            })
        };
        Ok(Some(Arc::new(DeviceWeightedSum {
            cols: self.cols,
            n_edges: edges.center.len(),
            center: backend.upload_indices(edges.center)?,
            neighbor: backend.upload_indices(edges.neighbor)?,
            by_center: csr(edges.center)?,
            by_neighbor: csr(edges.neighbor)?,
        })))
    }
}

struct DeviceWeightedSum {
    cols: usize,
    n_edges: usize,
    center: DeviceMem,
    neighbor: DeviceMem,
    by_center: DeviceCsr,
    by_neighbor: DeviceCsr,
}

impl DeviceMessageKernel<f64> for DeviceWeightedSum {
    fn forward(
        &self,
        b: &dyn DeviceBackend<f64>,
        nodes: &[&DeviceMem],
        edges: &[&DeviceMem],
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let (ne, c) = (self.n_edges, self.cols);
        let mut hj = b.alloc(ne * c)?;
        b.gather_rows(nodes[0], c, &self.neighbor, &mut hj)?;
        let mut m = b.alloc(ne * c)?;
        b.binary(
            DeviceBinary::Mul,
            &hj,
            edges[0],
            DeviceBroadcast::PerRow,
            ne,
            c,
            &mut m,
            false,
        )?;
        b.sum_rows_csr(&m, c, &self.by_center, out, false)
    }
    fn backward(
        &self,
        b: &dyn DeviceBackend<f64>,
        nodes: &[&DeviceMem],
        edges: &[&DeviceMem],
        g: &DeviceMem,
        wants: &[bool],
    ) -> Result<Vec<Option<DeviceMem>>, DeviceError> {
        let (ne, c) = (self.n_edges, self.cols);
        let mut gi = b.alloc(ne * c)?;
        b.gather_rows(g, c, &self.center, &mut gi)?;
        let mut gh = None;
        if wants[0] {
            let mut m = b.alloc(ne * c)?;
            b.binary(
                DeviceBinary::Mul,
                &gi,
                edges[0],
                DeviceBroadcast::PerRow,
                ne,
                c,
                &mut m,
                false,
            )?;
            let mut out = b.alloc(nodes[0].len())?;
            b.sum_rows_csr(&m, c, &self.by_neighbor, &mut out, false)?;
            gh = Some(out);
        }
        let mut hj = b.alloc(ne * c)?;
        b.gather_rows(nodes[0], c, &self.neighbor, &mut hj)?;
        let mut m = b.alloc(ne * c)?;
        b.binary(
            DeviceBinary::Mul,
            &gi,
            &hj,
            DeviceBroadcast::Full,
            ne,
            c,
            &mut m,
            false,
        )?;
        let mut gw = b.alloc(ne)?;
        b.row_sums(&m, ne, c, &mut gw, false)?;
        Ok(vec![gh, Some(gw)])
    }
}

/// An energy through an affine kernel, a column slice and a message kernel
/// (edges in no particular order), with gradients of positions, edge
/// weights and a node input; on the device when asked.
fn run(device: bool) -> (Vec<f64>, Vec<Vec<f64>>, Trace) {
    let n = 12;
    let mut g = Graph::<f64>::new();
    g.enable_trace();
    if device {
        g.set_device(Arc::new(ReferenceDevice::new()));
    }
    let pos = g.leaf(rand_vec(3 * n, 1), n, 3, RowDomain::Atom);
    let affine = Arc::new(Affine {
        m: rand_vec(3 * 5, 2),
        b: rand_vec(5, 3),
        dims: (3, 5),
    });
    let y = g.rowwise(affine, &[pos]).unwrap();
    let y = g.tanh(y).unwrap();
    let h = g.slice_cols(y, 1, 4).unwrap();
    let (mut center, mut neighbor) = (Vec::new(), Vec::new());
    for e in 0..40u32 {
        center.push((e * 7 + 3) % n as u32);
        neighbor.push((e * 5 + 1) % n as u32);
    }
    let ne = center.len();
    let w = g.leaf(rand_vec(ne, 4), ne, 1, RowDomain::Edge);
    let ci = g
        .index(
            Arc::new(center),
            RowDomain::Edge,
            RowDomain::Atom,
            n,
            "edge_center",
        )
        .unwrap();
    let ni = g
        .index(
            Arc::new(neighbor),
            RowDomain::Edge,
            RowDomain::Atom,
            n,
            "edge_neighbor",
        )
        .unwrap();
    let a = g
        .message_passing(Arc::new(WeightedSum { cols: 3 }), &[h], &[w], ci, ni)
        .unwrap();
    let sq = g.mul(a, a).unwrap();
    let s = g.sum_cols(sq).unwrap();
    let sys = g
        .index(
            Arc::new(vec![0; n]),
            RowDomain::Atom,
            RowDomain::System,
            1,
            "atom_system",
        )
        .unwrap();
    let e = g.segment_sum(s, sys).unwrap();
    g.ensure_host(&[e]).unwrap();
    let energy = g.value(e).to_vec();
    let grads = g.grad(e, None, &[pos, w]).unwrap();
    (energy, grads, g.take_trace().unwrap())
}

#[test]
fn kernels_with_a_device_side_give_the_host_results() {
    let (e_host, g_host, _) = run(false);
    let (e_dev, g_dev, _) = run(true);
    let close = |a: &[f64], b: &[f64], what: &str| {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        assert!(scale > 0.0, "{what}: all zero");
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-12 * scale,
                "{what}: device {x} vs host {y}"
            );
        }
    };
    close(&e_dev, &e_host, "energy");
    close(&g_dev[0], &g_host[0], "position gradient");
    close(&g_dev[1], &g_host[1], "edge weight gradient");
}

#[test]
fn kernels_with_a_device_side_run_there_and_trace_as_on_the_host() {
    let (_, _, host) = run(false);
    let (_, _, dev) = run(true);
    assert_eq!(host.events.len(), dev.events.len());
    for (a, b) in host.events.iter().zip(&dev.events) {
        assert_eq!(
            (&a.op, &a.output, &a.handler),
            (&b.op, &b.output, &b.handler)
        );
        let scale = a.owned_sum.abs().max(1e-300);
        assert!(
            (a.owned_sum - b.owned_sum).abs() <= 1e-12 * scale.max(1.0),
            "{}",
            a.op
        );
    }
    for op in ["rowwise:affine", "slice_cols", "message:weighted_sum"] {
        let ran: Vec<_> = dev.events.iter().filter(|e| e.op == op).collect();
        assert!(!ran.is_empty(), "{op} is not traced");
        assert!(
            ran.iter().all(|e| e.device.as_deref() == Some("reference")),
            "{op} did not run on the device"
        );
    }
}

proptest::proptest! {
    /// The matrix and bias read off an affine row map are that map's (to
    /// the rounding of `b + M[k]` then `− b`), for any shape and values,
    /// and the bias is `None` exactly when it is all zero.
    #[test]
    fn a_probed_affine_map_is_the_map(
        di in 1usize..7,
        dout in 1usize..7,
        seed in 0u64..1000,
        zero_bias in proptest::bool::ANY,
    ) {
        let m = rand_vec(di * dout, seed);
        let b = if zero_bias { vec![0.0; dout] } else { rand_vec(dout, seed + 7) };
        let map = Affine { m: m.clone(), b: b.clone(), dims: (di, dout) };
        let a = RowAffine::probe(di, dout, |x: &[f64], n, out: &mut [f64]| map.apply(x, n, out)).unwrap();
        proptest::prop_assert_eq!((a.dim_in, a.dim_out), (di, dout));
        proptest::prop_assert_eq!(a.bias.is_none(), zero_bias);
        for (k, (&got, &want)) in a.matrix.iter().zip(&m).enumerate() {
            let scale = want.abs() + b[k % dout].abs();
            proptest::prop_assert!((got - want).abs() <= 2.0 * f64::EPSILON * scale, "M[{}]: {} vs {}", k, got, want);
        }
        if let Some(bias) = &a.bias {
            proptest::prop_assert_eq!(bias, &b);
        }
    }
}
