//! SevenNet's own kernels as the op engine's device ops
//! ([`ddmlip_models::sevennet_device::SevenNetDevice`]): the edge features
//! from the engine's edge vectors, each layer's gate, and each layer's
//! radial MLP + tensor-product convolution on the engine's edges — the
//! fused path's kernels, reading and writing the engine's arrays in the
//! host kernels' layouts. The irreps linears run as the engine's GEMMs.
//!
//! The convolution walks the receiver rows as CSR: it takes edges sorted
//! by centre (the runtime's order); for any other order it declines and the
//! op runs on the host.

use super::{
    dev_err, grid_1d, longest_row, per_row, row_chunks, zeros, ConvParams, DeviceLayer, DeviceNet,
    GpuFloat, HostModel, Scratch, CHUNK_EDGES,
};
use crate::engine_backend::{slice, slice_mut};
use crate::{CudaDevice, CudaError};
use cudarc::cublas::{CudaBlas, Gemm};
use cudarc::driver::{CudaSlice, PushKernelArg};
use ddmlip_e3nn::BlockLayout;
use ddmlip_engine::device::{
    DeviceBackend, DeviceError, DeviceKernel, DeviceMem, DeviceMessageKernel,
};
use ddmlip_engine::ops::opaque::Shape;
use ddmlip_engine::{MessageEdges, Scalar};
use ddmlip_models::sevennet_device::{SevenNetDevice, SevenNetSource};
use std::sync::{Arc, Mutex};

fn device_err(e: CudaError) -> DeviceError {
    DeviceError(e.to_string())
}

/// A checkpoint's tables and weights on the device, by the `Arc` of its
/// weights (kept, so the address cannot be reused) and modality; `None`
/// where the GPU kernels do not cover its architecture.
pub(crate) struct NetEntry<T> {
    source: SevenNetSource,
    net: Option<Arc<DeviceNet<T>>>,
}

/// The checkpoints whose weights and tables a backend has on its GPU: each
/// built on first use, then only read (by every layer, and by every
/// evaluation of a backend kept across MD steps).
pub(crate) type SevenNetNets<T> = Arc<Mutex<Vec<NetEntry<T>>>>;

/// SevenNet's kernels on one engine backend's stream.
pub(crate) struct SevenNetOnEngine<T> {
    device: Arc<CudaDevice>,
    nets: SevenNetNets<T>,
    /// The last edges a convolution was made for (every layer of an
    /// evaluation shares them).
    edges: Mutex<Option<Arc<EngineEdges>>>,
}

impl<T: GpuFloat> SevenNetOnEngine<T>
where
    CudaBlas: Gemm<T>,
{
    /// SevenNet kernels on `device` (the engine backend's own handle, so
    /// that they queue on its stream), with the GPU's checkpoints `nets`;
    /// nothing is compiled or uploaded before first use.
    pub(crate) fn new(device: Arc<CudaDevice>, nets: SevenNetNets<T>) -> Self {
        Self {
            device,
            nets,
            edges: Mutex::new(None),
        }
    }

    fn net(&self, model: &SevenNetSource) -> Result<Option<Arc<DeviceNet<T>>>, DeviceError> {
        let mut nets = self.nets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = nets.iter().find(|e| {
            Arc::ptr_eq(&e.source.weights, &model.weights) && e.source.modal == model.modal
        }) {
            return Ok(e.net.clone());
        }
        // A checkpoint the kernels do not cover runs its ops on the host.
        let net = match HostModel::new(&model.weights, model.modal.as_deref()) {
            Ok(host) => Some(Arc::new(
                DeviceNet::<T>::new(&self.device, &host).map_err(device_err)?,
            )),
            Err(_) => None,
        };
        nets.push(NetEntry {
            source: model.clone(),
            net: net.clone(),
        });
        Ok(net)
    }

    fn edges(&self, edges: &MessageEdges<'_>) -> Result<Option<Arc<EngineEdges>>, DeviceError> {
        let mut slot = self.edges.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = slot.as_ref() {
            if e.n_rows == edges.n_rows && e.center == edges.center && e.neighbor == edges.neighbor
            {
                return Ok(Some(e.clone()));
            }
        }
        let built = EngineEdges::build(&self.device, edges).map_err(device_err)?;
        let built = built.map(Arc::new);
        *slot = built.clone();
        Ok(built)
    }
}

impl<T: GpuFloat + Scalar> SevenNetDevice<T> for SevenNetOnEngine<T>
where
    CudaBlas: Gemm<T>,
{
    fn edge_features(
        &self,
        model: &SevenNetSource,
    ) -> Result<Option<Arc<dyn DeviceKernel<T>>>, DeviceError> {
        Ok(self.net(model)?.map(|net| {
            Arc::new(EdgeRows {
                device: self.device.clone(),
                net,
            }) as Arc<dyn DeviceKernel<T>>
        }))
    }

    fn gate(
        &self,
        model: &SevenNetSource,
        layer: usize,
    ) -> Result<Option<Arc<dyn DeviceKernel<T>>>, DeviceError> {
        Ok(self
            .net(model)?
            .filter(|net| layer < net.layers.len())
            .map(|net| {
                Arc::new(LayerGate {
                    device: self.device.clone(),
                    net,
                    layer,
                }) as Arc<dyn DeviceKernel<T>>
            }))
    }

    fn convolution(
        &self,
        model: &SevenNetSource,
        layer: usize,
        layout: BlockLayout,
        edges: &MessageEdges<'_>,
    ) -> Result<Option<Arc<dyn DeviceMessageKernel<T>>>, DeviceError> {
        let Some(net) = self.net(model)?.filter(|net| layer < net.layers.len()) else {
            return Ok(None);
        };
        let Some(edges) = self.edges(edges)? else {
            return Ok(None);
        };
        let mut params = net.layers[layer].params;
        params.msg_component_major = u32::from(layout == BlockLayout::ComponentMajor);
        Ok(Some(Arc::new(LayerConvolution {
            device: self.device.clone(),
            net,
            layer,
            params,
            edges,
        })))
    }
}

/// The engine's edges as the convolution kernels walk them: receiver CSR
/// (edges sorted by centre, so edge `e` is CSR position `e`) and sender CSR
/// (each sender's edges in ascending order), with the chunks of at most
/// [`CHUNK_EDGES`] edges (or the longest row) the radial MLP runs in.
struct EngineEdges {
    n_rows: usize,
    center: Vec<u32>,
    neighbor: Vec<u32>,
    row_start: CudaSlice<u64>,
    centers: CudaSlice<u32>,
    neighbors: CudaSlice<u32>,
    sender_start: CudaSlice<u64>,
    sender_edges: CudaSlice<u32>,
    recv_chunks: Vec<(u32, u32, u64, u64)>,
    send_chunks: Vec<(u32, u32, u64, u64)>,
    cap: usize,
}

impl EngineEdges {
    /// `None` for edges the kernels cannot walk: not sorted by centre, an
    /// index out of range, none at all, or more than `u32` positions.
    fn build(device: &CudaDevice, e: &MessageEdges<'_>) -> Result<Option<Self>, CudaError> {
        let (n, ne) = (e.n_rows, e.center.len());
        let in_range = |v: &[u32]| v.iter().all(|&i| (i as usize) < n);
        if ne == 0
            || ne >= u32::MAX as usize
            || n >= u32::MAX as usize
            || e.neighbor.len() != ne
            || e.center.windows(2).any(|w| w[0] > w[1])
            || !in_range(e.center)
            || !in_range(e.neighbor)
        {
            return Ok(None);
        }
        let mut row_start = vec![0u64; n + 1];
        let mut sender_start = vec![0u64; n + 1];
        for (&c, &j) in e.center.iter().zip(e.neighbor) {
            row_start[c as usize + 1] += 1;
            sender_start[j as usize + 1] += 1;
        }
        for r in 0..n {
            row_start[r + 1] += row_start[r];
            sender_start[r + 1] += sender_start[r];
        }
        // A stable counting sort: each sender's edges in ascending order.
        let mut cursor = sender_start.clone();
        let mut sender_edges = vec![0u32; ne];
        for (edge, &j) in e.neighbor.iter().enumerate() {
            let slot = &mut cursor[j as usize];
            sender_edges[*slot as usize] = edge as u32;
            *slot += 1;
        }
        let cap = CHUNK_EDGES
            .min(ne as u64)
            .max(longest_row(&row_start))
            .max(longest_row(&sender_start))
            .max(1);
        let stream = device.stream();
        let up = |what: &'static str| dev_err(what);
        Ok(Some(Self {
            n_rows: n,
            center: e.center.to_vec(),
            neighbor: e.neighbor.to_vec(),
            row_start: stream
                .clone_htod(&row_start)
                .map_err(up("uploading the receiver offsets"))?,
            centers: stream
                .clone_htod(e.center)
                .map_err(up("uploading the edge centres"))?,
            neighbors: stream
                .clone_htod(e.neighbor)
                .map_err(up("uploading the edge neighbours"))?,
            sender_start: stream
                .clone_htod(&sender_start)
                .map_err(up("uploading the sender offsets"))?,
            sender_edges: stream
                .clone_htod(&sender_edges)
                .map_err(up("uploading the sender edges"))?,
            recv_chunks: row_chunks(&row_start, cap),
            send_chunks: row_chunks(&sender_start, cap),
            cap: cap as usize,
        }))
    }
}

/// Edge vectors → `[embedding | SH]` rows (computed in f64, rounded once).
struct EdgeRows<T> {
    device: Arc<CudaDevice>,
    net: Arc<DeviceNet<T>>,
}

impl<T: GpuFloat + Scalar> DeviceKernel<T> for EdgeRows<T> {
    fn forward(
        &self,
        _backend: &dyn DeviceBackend<T>,
        inputs: &[&DeviceMem],
        shapes: &[Shape],
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let ne = shapes[0].1 as u64;
        let width = (self.net.edge.n_basis + (self.net.edge.lmax + 1).pow(2)) as usize;
        if out.len() != ne as usize * width {
            return Err(DeviceError(format!(
                "edge features of {ne} edges need {} values, not {}",
                ne as usize * width,
                out.len()
            )));
        }
        if ne == 0 {
            return Ok(());
        }
        let vectors = slice::<T>(inputs[0])?;
        let out = slice_mut::<T>(out)?;
        launch!(self.device.stream(), &self.net.k.edge_rows, grid_1d(ne, 128), "the edge features";
            vectors, &self.net.edge, &ne, out)
        .map_err(device_err)
    }

    fn backward(
        &self,
        _backend: &dyn DeviceBackend<T>,
        inputs: &[&DeviceMem],
        shapes: &[Shape],
        g: &DeviceMem,
        _pos: usize,
    ) -> Result<Option<DeviceMem>, DeviceError> {
        let ne = shapes[0].1;
        let mut grad = zeros::<T>(&self.device, 3 * ne, "allocating edge vector gradients")
            .map_err(device_err)?;
        if ne > 0 {
            let ne64 = ne as u64;
            let (vectors, g) = (slice::<T>(inputs[0])?, slice::<T>(g)?);
            launch!(self.device.stream(), &self.net.k.edge_rows_bwd, grid_1d(ne64, 128),
                "the edge features backward"; vectors, g, &self.net.edge, &ne64, &mut grad)
            .map_err(device_err)?;
        }
        Ok(Some(DeviceMem::new(Box::new(grad), 3 * ne)))
    }
}

/// One layer's gate.
struct LayerGate<T> {
    device: Arc<CudaDevice>,
    net: Arc<DeviceNet<T>>,
    layer: usize,
}

impl<T: GpuFloat> LayerGate<T> {
    fn layer(&self) -> &DeviceLayer<T> {
        &self.net.layers[self.layer]
    }
}

impl<T: GpuFloat + Scalar> DeviceKernel<T> for LayerGate<T> {
    fn forward(
        &self,
        _backend: &dyn DeviceBackend<T>,
        inputs: &[&DeviceMem],
        shapes: &[Shape],
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let l = self.layer();
        let (n, din) = (shapes[0].1 as u32, shapes[0].2 as u32);
        let dout = l.dim_out as u32;
        if din as usize != l.dim_gate_in {
            return Err(DeviceError(format!(
                "the gate takes {} columns, not {din}",
                l.dim_gate_in
            )));
        }
        let total = u64::from(n) * u64::from(dout);
        if total == 0 {
            return Ok(());
        }
        let y = slice::<T>(inputs[0])?;
        let out = slice_mut::<T>(out)?;
        launch!(self.device.stream(), &self.net.k.gate_fwd, grid_1d(total, 256), "the gate";
            y, &l.gate_forward, &n, &din, &dout, &l.gate_activation, out)
        .map_err(device_err)
    }

    fn backward(
        &self,
        _backend: &dyn DeviceBackend<T>,
        inputs: &[&DeviceMem],
        shapes: &[Shape],
        g: &DeviceMem,
        _pos: usize,
    ) -> Result<Option<DeviceMem>, DeviceError> {
        let l = self.layer();
        let (n, din) = (shapes[0].1 as u32, shapes[0].2 as u32);
        let dout = l.dim_out as u32;
        let len = n as usize * din as usize;
        let mut gy =
            zeros::<T>(&self.device, len, "allocating gate gradients").map_err(device_err)?;
        if len > 0 {
            let (y, g) = (slice::<T>(inputs[0])?, slice::<T>(g)?);
            launch!(self.device.stream(), &self.net.k.gate_bwd, grid_1d(len as u64, 256),
                "the gate backward"; y, g, &l.gate_backward, &n, &din, &dout, &l.gate_activation, &mut gy)
            .map_err(device_err)?;
        }
        Ok(Some(DeviceMem::new(Box::new(gy), len)))
    }
}

/// One layer's radial MLP + convolution on one set of edges.
struct LayerConvolution<T> {
    device: Arc<CudaDevice>,
    net: Arc<DeviceNet<T>>,
    layer: usize,
    /// The layer's parameters with the message layout the engine asked for.
    params: ConvParams,
    edges: Arc<EngineEdges>,
}

impl<T: GpuFloat> LayerConvolution<T>
where
    CudaBlas: Gemm<T>,
{
    /// The chunk scratch of this layer's MLP and filters.
    fn scratch(&self) -> Result<Scratch<T>, CudaError> {
        let l = &self.net.layers[self.layer];
        let cap = self.edges.cap;
        let w = &l.radial_widths;
        let hidden = &w[1..w.len() - 1];
        let max_hidden = hidden.iter().copied().max().unwrap_or(0);
        let nb = self.net.edge.n_basis as usize;
        let buf = |len: usize| zeros::<T>(&self.device, len, "allocating the radial MLP scratch");
        Ok(Scratch {
            pre: hidden
                .iter()
                .map(|&h| buf(cap * h))
                .collect::<Result<_, _>>()?,
            act: hidden
                .iter()
                .map(|&h| buf(cap * h))
                .collect::<Result<_, _>>()?,
            w: buf(cap * self.params.dim_w as usize)?,
            gw: buf(cap * self.params.dim_w as usize)?,
            ga: buf(cap * max_hidden.max(nb))?,
            gb: buf(cap * max_hidden.max(nb))?,
            filt: buf(cap * self.params.t_size as usize)?,
        })
    }

    fn check(&self, h: &DeviceMem, emb: &DeviceMem, sh: &DeviceMem) -> Result<(), DeviceError> {
        let (n, ne) = (self.edges.n_rows, self.edges.center.len());
        let nb = self.net.edge.n_basis as usize;
        let want = [
            (h.len(), n * self.params.dim_in as usize, "node features"),
            (emb.len(), ne * nb, "radial embedding"),
            (
                sh.len(),
                ne * self.params.dim_sh as usize,
                "spherical harmonics",
            ),
        ];
        for (got, expected, what) in want {
            if got != expected {
                return Err(DeviceError(format!(
                    "the convolution's {what} hold {got} values, not {expected}"
                )));
            }
        }
        Ok(())
    }
}

impl<T: GpuFloat + Scalar> DeviceMessageKernel<T> for LayerConvolution<T>
where
    CudaBlas: Gemm<T>,
{
    fn forward(
        &self,
        _backend: &dyn DeviceBackend<T>,
        nodes: &[&DeviceMem],
        edges: &[&DeviceMem],
        out: &mut DeviceMem,
    ) -> Result<(), DeviceError> {
        let (&[h], &[emb, sh]) = (nodes, edges) else {
            return Err(DeviceError(
                "the convolution takes h, the embedding and the SH".into(),
            ));
        };
        self.check(h, emb, sh)?;
        let mut run = || -> Result<(), CudaError> {
            let net = &*self.net;
            let l = &net.layers[self.layer];
            let e = &*self.edges;
            let stream = self.device.stream();
            let nb = net.edge.n_basis as usize;
            let (h, emb, sh) = (
                slice::<T>(h).map_err(input_err)?,
                slice::<T>(emb).map_err(input_err)?,
                slice::<T>(sh).map_err(input_err)?,
            );
            let out = slice_mut::<T>(out).map_err(input_err)?;
            // Rows without edges, and columns no path writes, are zero.
            stream
                .memset_zeros(out)
                .map_err(dev_err("zeroing the messages"))?;
            let mut s = self.scratch()?;
            for &(r0, r1, p0, p1) in &e.recv_chunks {
                let rows = (p1 - p0) as usize;
                if rows > 0 {
                    let input = emb.slice(p0 as usize * nb..p1 as usize * nb);
                    net.mlp_forward(&self.device, l, &input, rows, &mut s)?;
                    let (jobs, no_idx) = (rows as u64 * u64::from(self.params.n_paths), 0i32);
                    launch!(stream, &net.k.filters, grid_1d(jobs, 128), "the filters";
                        &l.paths, &l.nz_idx, &l.nz_coef, sh, &e.neighbors, &no_idx,
                        &self.params, &p0, &p1, &mut s.filt)?;
                }
                launch!(stream, &net.k.conv_fwd, per_row(r1 - r0, 128), "the convolution";
                    &l.paths, &s.filt, &l.col_path, h, &s.w,
                    &e.row_start, &e.neighbors, &self.params, &r0, &r1, &p0, &mut *out)?;
            }
            Ok(())
        };
        run().map_err(device_err)
    }

    fn backward(
        &self,
        _backend: &dyn DeviceBackend<T>,
        nodes: &[&DeviceMem],
        edges: &[&DeviceMem],
        g: &DeviceMem,
        wants: &[bool],
    ) -> Result<Vec<Option<DeviceMem>>, DeviceError> {
        let (&[h], &[emb, sh]) = (nodes, edges) else {
            return Err(DeviceError(
                "the convolution takes h, the embedding and the SH".into(),
            ));
        };
        self.check(h, emb, sh)?;
        let want_h = wants.first().copied().unwrap_or(true);
        let run = || -> Result<Vec<Option<DeviceMem>>, CudaError> {
            let net = &*self.net;
            let l = &net.layers[self.layer];
            let e = &*self.edges;
            let stream = self.device.stream();
            let (n, ne) = (e.n_rows, e.center.len());
            let nb = net.edge.n_basis as usize;
            let (di, ds) = (self.params.dim_in as usize, self.params.dim_sh as usize);
            let (h, emb, sh, ga) = (
                slice::<T>(h).map_err(input_err)?,
                slice::<T>(emb).map_err(input_err)?,
                slice::<T>(sh).map_err(input_err)?,
                slice::<T>(g).map_err(input_err)?,
            );
            let mut gh = zeros::<T>(&self.device, n * di, "allocating feature gradients")?;
            let mut grad_emb = zeros::<T>(&self.device, ne * nb, "allocating embedding gradients")?;
            let mut grad_sh = zeros::<T>(&self.device, ne * ds, "allocating SH gradients")?;
            let mut s = self.scratch()?;
            let mut emb_chunk = zeros::<T>(&self.device, e.cap * nb, "allocating the MLP input")?;
            let mut gemb_chunk = zeros::<T>(
                &self.device,
                e.cap * nb,
                "allocating the MLP input gradient",
            )?;
            let nb32 = nb as u32;
            for &(r0, r1, q0, q1) in &e.send_chunks {
                let rows = (q1 - q0) as usize;
                if rows > 0 {
                    launch!(stream, &net.k.gather_rows, grid_1d(rows as u64 * nb as u64, 256),
                        "gathering embeddings"; emb, &e.sender_edges, &q0, &q1, &nb32, &mut emb_chunk)?;
                    let input = emb_chunk.slice(..rows * nb);
                    net.mlp_forward(&self.device, l, &input, rows, &mut s)?;
                    let (jobs, by_idx) = (rows as u64 * u64::from(self.params.n_paths), 1i32);
                    launch!(stream, &net.k.filters, grid_1d(jobs, 128), "the filters";
                        &l.paths, &l.nz_idx, &l.nz_coef, sh, &e.sender_edges, &by_idx,
                        &self.params, &q0, &q1, &mut s.filt)?;
                    launch!(stream, &net.k.conv_bwd_edge, grid_1d(rows as u64 * 32, 256),
                        "the convolution backward (edges)";
                        &l.paths, &l.nz_idx, &l.nz_coef, h, &s.filt, &s.w, ga, &e.sender_edges,
                        &e.centers, &e.neighbors, &self.params, &q0, &q1, &mut s.gw, &mut grad_sh)?;
                }
                if want_h {
                    launch!(stream, &net.k.conv_bwd_h, per_row(r1 - r0, 128),
                        "the convolution backward (features)";
                        &l.paths, &s.filt, &l.ranges, &l.range_paths,
                        &l.slot_range, &s.w, ga, &e.sender_start, &e.sender_edges, &e.centers,
                        &self.params, &r0, &r1, &q0, &mut gh)?;
                }
                if rows > 0 {
                    net.mlp_backward(&self.device, l, rows, &mut s, &mut gemb_chunk)?;
                    launch!(stream, &net.k.scatter_add_rows, grid_1d(rows as u64 * nb as u64, 256),
                        "adding embedding gradients";
                        &gemb_chunk, &e.sender_edges, &q0, &q1, &nb32, &mut grad_emb)?;
                }
            }
            let mem = |m: CudaSlice<T>, len: usize| Some(DeviceMem::new(Box::new(m), len));
            Ok(vec![
                if want_h { mem(gh, n * di) } else { None },
                mem(grad_emb, ne * nb),
                mem(grad_sh, ne * ds),
            ])
        };
        run().map_err(device_err)
    }
}

fn input_err(e: DeviceError) -> CudaError {
    CudaError::Input(e.0)
}
