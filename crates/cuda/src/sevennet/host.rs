//! The host-side description of a SevenNet for the GPU kernels, built in f64
//! from `ddmlip-e3nn`'s types and testable without a GPU: dense matrices of
//! the irreps linears, the tensor-product path tables, the gate tables, the
//! row chunks of the fused convolution and the memory estimate.

use crate::CudaError;
use ddmlip_e3nn::conv::TpPath;
use ddmlip_e3nn::sevennet::{Readout, SelfConnection, SevenNet, SevenNetWeights};
use ddmlip_e3nn::{Activation, CutoffFunction, E3nnError, Gate};

/// Ints per path in the kernels' path table (`N_PATH_FIELDS` in `sevennet.cu`).
pub const PATH_FIELDS: usize = 10;
/// Ints per input range in the kernels' range table (`N_RANGE_FIELDS`).
pub const RANGE_FIELDS: usize = 6;
/// Largest number of Bessel functions the edge kernel takes (`freqs[16]`).
pub const MAX_BASIS: usize = 16;
/// Largest spherical-harmonic degree of the kernels.
pub const MAX_LMAX_SH: usize = 3;

fn unsupported(what: impl Into<String>) -> CudaError {
    CudaError::Input(format!(
        "this SevenNet checkpoint cannot run on the GPU yet: {}; use --device cpu",
        what.into()
    ))
}

fn e3nn(e: E3nnError) -> CudaError {
    CudaError::Input(e.to_string())
}

/// An affine map `y = x·matrix + bias` as a dense row-major matrix
/// (`dim_in × dim_out`) and a bias row (`dim_out`), read off a linear
/// function by evaluating it on the zero row and the unit rows.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseAffine {
    /// Input width.
    pub dim_in: usize,
    /// Output width.
    pub dim_out: usize,
    /// `dim_in × dim_out`, row-major.
    pub matrix: Vec<f64>,
    /// `dim_out` values; `None` when all are zero.
    pub bias: Option<Vec<f64>>,
}

impl DenseAffine {
    /// Reads the affine map `f` (`f(x, n_rows, out)` with `x` n_rows × dim_in
    /// and `out` n_rows × dim_out) off its values on `0` and on the unit rows.
    pub fn probe(
        dim_in: usize,
        dim_out: usize,
        f: impl Fn(&[f64], usize, &mut [f64]) -> Result<(), E3nnError>,
    ) -> Result<Self, CudaError> {
        let mut bias = vec![0.0; dim_out];
        f(&vec![0.0; dim_in], 1, &mut bias).map_err(e3nn)?;
        let mut identity = vec![0.0; dim_in * dim_in];
        for k in 0..dim_in {
            identity[k * dim_in + k] = 1.0;
        }
        let mut matrix = vec![0.0; dim_in * dim_out];
        f(&identity, dim_in, &mut matrix).map_err(e3nn)?;
        for row in matrix.chunks_mut(dim_out.max(1)) {
            for (m, b) in row.iter_mut().zip(&bias) {
                *m -= b;
            }
        }
        let bias = bias.iter().any(|&b| b != 0.0).then_some(bias);
        Ok(Self {
            dim_in,
            dim_out,
            matrix,
            bias,
        })
    }

    /// `x·matrix + bias` for `x` (n_rows × dim_in), on the host (for tests).
    pub fn apply(&self, x: &[f64], n_rows: usize) -> Vec<f64> {
        let mut out = vec![0.0; n_rows * self.dim_out];
        for r in 0..n_rows {
            for k in 0..self.dim_in {
                let xv = x[r * self.dim_in + k];
                for o in 0..self.dim_out {
                    out[r * self.dim_out + o] += xv * self.matrix[k * self.dim_out + o];
                }
            }
            if let Some(b) = &self.bias {
                for o in 0..self.dim_out {
                    out[r * self.dim_out + o] += b[o];
                }
            }
        }
        out
    }
}

/// The tensor-product path tables of one layer, in the layout the
/// convolution kernels read.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvTables {
    /// Number of paths.
    pub n_paths: usize,
    /// Width of the convolution input `h`.
    pub dim_in: usize,
    /// Weights per edge (columns of the radial MLP's output).
    pub dim_w: usize,
    /// Width of the message / aggregated features `A`.
    pub dim_msg: usize,
    /// Width of the SH rows.
    pub dim_sh: usize,
    /// [`PATH_FIELDS`] ints per path: d1, d3, mul, in_off, w_off, out_off,
    /// first and end nonzero, offset of its `d1 × d3` filter in a per-edge
    /// filter row, input range.
    pub paths: Vec<i32>,
    /// Per nonzero CG entry: `a·d3 + k` and the SH column `l2² + b`.
    pub nz_idx: Vec<i32>,
    /// Per nonzero CG entry: `α·C[a,b,k]`.
    pub nz_coef: Vec<f64>,
    /// Per weight column: its path.
    pub col_path: Vec<i32>,
    /// [`RANGE_FIELDS`] ints per distinct input block: in_off, mul, d1,
    /// first slot, first entry in `range_paths`, number of paths.
    pub ranges: Vec<i32>,
    /// The paths reading each input block, in path order.
    pub range_paths: Vec<i32>,
    /// Per (input block, channel) slot: its input block.
    pub slot_range: Vec<i32>,
    /// Filter values per edge (Σ d1·d3 over the paths).
    pub t_size: usize,
    /// `1 / denominator`.
    pub inv_den: f64,
}

impl ConvTables {
    /// Tables of `paths` (sorted uvu paths of a layer) over rows of widths
    /// `dim_in` (h), `dim_msg` (A) and SH degree `lmax_sh`. Refuses paths the
    /// kernels do not cover: degrees above 3, weight columns that do not tile
    /// `0..dim_w` in path order, output blocks shared by two paths, input
    /// blocks that overlap without being equal.
    pub fn new(
        paths: &[TpPath],
        dim_in: usize,
        dim_msg: usize,
        lmax_sh: usize,
        denominator: f64,
    ) -> Result<Self, CudaError> {
        if !(denominator.is_finite() && denominator != 0.0) {
            return Err(unsupported(format!("denominator {denominator}")));
        }
        let dim_sh = (lmax_sh + 1) * (lmax_sh + 1);
        let mut table = Vec::with_capacity(paths.len() * PATH_FIELDS);
        let (mut nz_idx, mut nz_coef, mut col_path) = (Vec::new(), Vec::new(), Vec::new());
        // Distinct input blocks (in_off, mul, d1), each with its paths.
        let mut ranges: Vec<((usize, usize, usize), Vec<usize>)> = Vec::new();
        let mut outs: Vec<(usize, usize)> = Vec::new();
        let mut t_size = 0;
        for (n, p) in paths.iter().enumerate() {
            let bad = |why: String| unsupported(format!("tensor-product path {n}: {why}"));
            if p.l1.max(p.l2).max(p.l3) > MAX_LMAX_SH || p.l2 > lmax_sh {
                return Err(bad("degree above the kernels' 3 or the SH degree".into()));
            }
            let (d1, d2, d3) = (2 * p.l1 + 1, 2 * p.l2 + 1, 2 * p.l3 + 1);
            if p.cg.len() != d1 * d2 * d3 {
                return Err(bad("CG tensor of the wrong size".into()));
            }
            if p.weight_offset != col_path.len() {
                return Err(bad("weight columns do not follow the path order".into()));
            }
            if p.in_offset + p.mul * d1 > dim_in || p.out_offset + p.mul * d3 > dim_msg {
                return Err(bad("block past the row width".into()));
            }
            let key = (p.in_offset, p.mul, d1);
            let range = match ranges.iter().position(|r| r.0 == key) {
                Some(r) => r,
                None => {
                    ranges.push((key, Vec::new()));
                    ranges.len() - 1
                }
            };
            ranges[range].1.push(n);
            outs.push((p.out_offset, p.mul * d3));
            let nz0 = nz_coef.len();
            for a in 0..d1 {
                for b in 0..d2 {
                    for k in 0..d3 {
                        let c = p.cg[(a * d2 + b) * d3 + k];
                        if c != 0.0 {
                            nz_idx.push((a * d3 + k) as i32);
                            nz_idx.push((p.l2 * p.l2 + b) as i32);
                            nz_coef.push(p.path_weight * c);
                        }
                    }
                }
            }
            col_path.extend(std::iter::repeat_n(n as i32, p.mul));
            table.extend([
                d1 as i32,
                d3 as i32,
                p.mul as i32,
                p.in_offset as i32,
                p.weight_offset as i32,
                p.out_offset as i32,
                nz0 as i32,
                nz_coef.len() as i32,
                t_size as i32,
                range as i32,
            ]);
            t_size += d1 * d3;
        }
        outs.sort_unstable();
        if outs.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(unsupported("two paths write the same message block"));
        }
        let mut sorted: Vec<(usize, usize, usize)> = ranges.iter().map(|r| r.0).collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0].0 + w[0].1 * w[0].2 > w[1].0) {
            return Err(unsupported("paths read overlapping input blocks"));
        }
        let (mut range_table, mut range_paths, mut slot_range) =
            (Vec::new(), Vec::new(), Vec::new());
        for (r, ((in_off, mul, d1), members)) in ranges.iter().enumerate() {
            range_table.extend([
                *in_off as i32,
                *mul as i32,
                *d1 as i32,
                slot_range.len() as i32,
                range_paths.len() as i32,
                members.len() as i32,
            ]);
            range_paths.extend(members.iter().map(|&m| m as i32));
            slot_range.extend(std::iter::repeat_n(r as i32, *mul));
        }
        Ok(Self {
            n_paths: paths.len(),
            dim_in,
            dim_w: col_path.len(),
            dim_msg,
            dim_sh,
            paths: table,
            nz_idx,
            nz_coef,
            col_path,
            ranges: range_table,
            range_paths,
            slot_range,
            t_size,
            inv_den: 1.0 / denominator,
        })
    }

    /// Number of distinct input blocks.
    pub fn n_ranges(&self) -> usize {
        self.ranges.len() / RANGE_FIELDS
    }
}

/// The gate's index tables: per output column `[kind, input column, gate
/// column, activation]` (kind 0 scalar, 1 gated) and per input column
/// `[kind, output column, partner column, count or activation]` (kind 0
/// scalar, 1 gate, 2 gated component); see `gate_fwd`/`gate_bwd` in the kernels.
#[derive(Clone, Debug, PartialEq)]
pub struct GateTables {
    /// Input width.
    pub dim_in: usize,
    /// Output width.
    pub dim_out: usize,
    /// 4 ints per output column.
    pub forward: Vec<i32>,
    /// 4 ints per input column.
    pub backward: Vec<i32>,
    /// Activation code of the gates.
    pub gate_activation: i32,
}

/// The kernels' code of an activation (0 normalised SiLU, 1 normalised tanh).
pub fn activation_code(a: Activation) -> Result<i32, CudaError> {
    match a {
        Activation::Silu => Ok(0),
        Activation::Tanh => Ok(1),
        other => Err(unsupported(format!(
            "gate activation `{}` (the GPU has silu and tanh)",
            other.name()
        ))),
    }
}

impl GateTables {
    /// Tables of `gate`.
    pub fn new(gate: &Gate) -> Result<Self, CudaError> {
        let (ns, ng) = (gate.n_scalars, gate.n_gates());
        let (dim_in, dim_out) = (gate.dim_in(), gate.dim_out());
        let mut forward = vec![0i32; 4 * dim_out];
        let mut backward = vec![0i32; 4 * dim_in];
        let mut c0 = 0;
        for &(count, act) in &gate.scalar_activations {
            let code = activation_code(act)?;
            for c in c0..c0 + count {
                forward[4 * c..4 * c + 4].copy_from_slice(&[0, c as i32, 0, code]);
                backward[4 * c..4 * c + 4].copy_from_slice(&[0, c as i32, 0, code]);
            }
            c0 += count;
        }
        if c0 != ns {
            return Err(unsupported("gate activation runs do not cover the scalars"));
        }
        let (mut gi, mut src, mut dst) = (ns, ns + ng, ns);
        for &(mul, l) in &gate.gated {
            let d = 2 * l + 1;
            for _ in 0..mul {
                backward[4 * gi..4 * gi + 4]
                    .copy_from_slice(&[1, dst as i32, src as i32, d as i32]);
                for c in 0..d {
                    let (o, i) = (dst + c, src + c);
                    forward[4 * o..4 * o + 4].copy_from_slice(&[1, i as i32, gi as i32, 0]);
                    backward[4 * i..4 * i + 4].copy_from_slice(&[2, o as i32, gi as i32, 0]);
                }
                gi += 1;
                src += d;
                dst += d;
            }
        }
        Ok(Self {
            dim_in,
            dim_out,
            forward,
            backward,
            gate_activation: activation_code(gate.gate_activation)?,
        })
    }
}

/// One interaction block for the GPU.
#[derive(Clone, Debug)]
pub struct HostLayer {
    /// Self-connection, x → gate input.
    pub self_connection: DenseAffine,
    /// Linear_1, x → h.
    pub linear_1: DenseAffine,
    /// Linear_2, A → gate input.
    pub linear_2: DenseAffine,
    /// Radial MLP widths `[n_basis, hidden…, dim_w]`.
    pub radial_widths: Vec<usize>,
    /// Radial MLP matrices (in × out, row-major) already scaled by 1/√in.
    pub radial: Vec<Vec<f64>>,
    /// Tensor-product paths.
    pub conv: ConvTables,
    /// Gate.
    pub gate: GateTables,
}

/// Radial embedding parameters of the edge kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeSetup {
    /// Bessel frequencies (1/Å).
    pub freqs: Vec<f64>,
    /// Cutoff (Å).
    pub cutoff: f64,
    /// 0: XPLOR switch, 1: polynomial envelope.
    pub envelope: i32,
    /// XPLOR switch start (Å).
    pub cutoff_on: f64,
    /// Polynomial exponent.
    pub p: f64,
    /// SH degree.
    pub lmax_sh: usize,
}

/// A SevenNet for the GPU, in f64 on the host (uploaded in the precision
/// of the evaluation by [`super::GpuSevenNet::new`]).
#[derive(Clone, Debug)]
pub struct HostModel {
    /// Atomic numbers in type-index order.
    pub species: Vec<u32>,
    /// Species embedding rows, n_species × dim₀.
    pub embedding_table: Vec<f64>,
    /// Edge features.
    pub edge: EdgeSetup,
    /// The interaction blocks.
    pub layers: Vec<HostLayer>,
    /// Readout as `e = x·v + c` (x the last block's output).
    pub readout: DenseAffine,
    /// Energy scale per type.
    pub scale: Vec<f64>,
    /// Energy shift per type (eV).
    pub shift: Vec<f64>,
}

impl HostModel {
    /// The GPU description of `weights` for modality `modal` (None for
    /// single-fidelity checkpoints). Errors name what the GPU kernels do not
    /// cover (species-wise self-connection, the fully connected readout,
    /// unnormalised SH, activations other than SiLU/tanh in the gate).
    pub fn new(weights: &SevenNetWeights, modal: Option<&str>) -> Result<Self, CudaError> {
        let net = SevenNet::<f64>::for_modal(weights, modal).map_err(e3nn)?;
        let cfg = &weights.config;
        if !net.normalize_sh {
            return Err(unsupported(
                "SH of unnormalised vectors (sevenn ≤ 0.9 checkpoints)",
            ));
        }
        if net.lmax_sh > MAX_LMAX_SH {
            return Err(unsupported(format!("SH degree {}", net.lmax_sh)));
        }
        if net.embedding.freqs.len() > MAX_BASIS {
            return Err(unsupported(format!(
                "{} radial basis functions (max {MAX_BASIS})",
                net.embedding.freqs.len()
            )));
        }
        let (envelope, cutoff_on, p) = match net.embedding.envelope {
            CutoffFunction::Xplor { cutoff_on } => (0, cutoff_on, 0.0),
            CutoffFunction::Polynomial { p } => (1, 0.0, f64::from(p)),
        };
        let edge = EdgeSetup {
            freqs: net.embedding.freqs.clone(),
            cutoff: net.embedding.cutoff,
            envelope,
            cutoff_on,
            p,
            lmax_sh: net.lmax_sh,
        };
        let mut layers = Vec::with_capacity(net.blocks.len());
        for (block, lw) in net.blocks.iter().zip(&weights.layers) {
            let (di, dg) = (block.dim_in(), block.gate.dim_in());
            let self_connection = match &block.self_connection {
                SelfConnection::Linear(l) => {
                    DenseAffine::probe(di, dg, |x, n, out| l.forward(x, n, out))?
                }
                SelfConnection::Species(_) => {
                    return Err(unsupported("the species-wise (nequip) self-connection"))
                }
            };
            let linear_1 =
                DenseAffine::probe(di, di, |x, n, out| block.linear_1.forward(x, n, out))?;
            let dm = block.conv.dim_msg();
            let linear_2 =
                DenseAffine::probe(dm, dg, |x, n, out| block.linear_2.forward(x, n, out))?;
            let widths = block.radial.widths.clone();
            if lw.radial.len() + 1 != widths.len() {
                return Err(unsupported("radial MLP weights do not match its widths"));
            }
            let radial = lw
                .radial
                .iter()
                .enumerate()
                .map(|(k, w)| {
                    let s = 1.0 / (widths[k] as f64).sqrt();
                    w.iter().map(|&v| v * s).collect()
                })
                .collect();
            let conv = ConvTables::new(&lw.paths, di, dm, cfg.lmax_sh, lw.denominator)?;
            if conv.dim_w != *widths.last().unwrap_or(&0) {
                return Err(unsupported(
                    "radial MLP output width differs from the paths' weights",
                ));
            }
            layers.push(HostLayer {
                self_connection,
                linear_1,
                linear_2,
                radial_widths: widths,
                radial,
                conv,
                gate: GateTables::new(&block.gate)?,
            });
        }
        let readout = match &net.readout {
            Readout::Linears { .. } => {
                let d = net.readout.dim_in();
                DenseAffine::probe(d, 1, |x, n, out| net.readout.forward(x, n, out))?
            }
            Readout::Mlp(_) => return Err(unsupported("the fully connected readout")),
        };
        Ok(Self {
            species: net.species().to_vec(),
            embedding_table: net.embedding_table().to_vec(),
            edge,
            layers,
            readout,
            scale: net.scale().to_vec(),
            shift: net.shift().to_vec(),
        })
    }

    /// Width of the initial node features.
    pub fn dim_node_in(&self) -> usize {
        self.layers
            .first()
            .map_or(self.readout.dim_in, |l| l.linear_1.dim_in)
    }

    /// Type index of atomic number `z`.
    pub fn type_index(&self, z: u32) -> Option<usize> {
        self.species.iter().position(|&s| s == z)
    }

    /// The largest per-row widths over the layers:
    /// (node features, gate input, message, weights per edge, hidden MLP width).
    pub fn max_widths(&self) -> [usize; 5] {
        let mut m = [self.dim_node_in(), 0, 0, 0, 0];
        for l in &self.layers {
            m[0] = m[0].max(l.linear_1.dim_in).max(l.gate.dim_out);
            m[1] = m[1].max(l.gate.dim_in);
            m[2] = m[2].max(l.conv.dim_msg);
            m[3] = m[3].max(l.conv.dim_w);
            let hidden = &l.radial_widths[1..l.radial_widths.len() - 1];
            m[4] = m[4].max(hidden.iter().copied().max().unwrap_or(0));
        }
        m
    }

    /// Device bytes of one evaluation of `n_atoms` atoms and `n_edges`
    /// edges with `bytes` per float (8 or 4) and fused chunks of up to
    /// `chunk_edges` edges: the neighbour list, per-edge features and their
    /// gradients, the sender CSR, the per-layer caches (h and the gate
    /// input of every layer), the working rows and the chunk scratch.
    pub fn memory_bytes(&self, n_atoms: u64, n_edges: u64, bytes: u64, chunk_edges: u64) -> u64 {
        let nb = self.edge.freqs.len() as u64;
        let ds = ((self.edge.lmax_sh + 1) * (self.edge.lmax_sh + 1)) as u64;
        let [dx, dg, dm, dw, dh] = self.max_widths().map(|v| v as u64);
        let n_hidden = self
            .layers
            .iter()
            .map(|l| l.radial_widths.len().saturating_sub(2))
            .max()
            .unwrap_or(0) as u64;
        // Neighbour list (u32 j, 3 × i32 S), receiver, sender list, vectors and
        // their gradient (f64), features and their gradients (T).
        let per_edge = crate::neighbors::BYTES_PER_PAIR + 4 + 4 + 2 * 24 + 2 * (nb + ds) * bytes;
        let caches: u64 = self
            .layers
            .iter()
            .map(|l| (l.linear_1.dim_in + l.gate.dim_in) as u64)
            .sum();
        // Working rows besides the caches: the forward holds x, A and the
        // block output, the backward gx, gy, gA, gh and the next gx (the
        // larger set); then energies, positions and row offsets, types,
        // forces and virials (f64).
        let per_atom = (caches + 3 * dx + dg + dm + 1) * bytes + 24 + 2 * 8 + 4 * 3 + 4 + 24 + 48;
        let dt = self.layers.iter().map(|l| l.conv.t_size).max().unwrap_or(0) as u64;
        let chunk = chunk_edges * ((2 * n_hidden + 2) * dh + 2 * dw + 2 * nb + dt) * bytes;
        n_edges * per_edge + n_atoms * per_atom + chunk
    }
}

/// Splits rows with CSR `offsets` (`n_rows + 1`) into consecutive chunks
/// `(row0, row1, pos0, pos1)` of at most `cap` positions each (a single
/// row longer than `cap` is a chunk of its own; the caller sizes its
/// scratch for the longest row too).
pub fn row_chunks(offsets: &[u64], cap: u64) -> Vec<(u32, u32, u64, u64)> {
    let n = offsets.len().saturating_sub(1);
    let mut out = Vec::new();
    let mut r0 = 0;
    while r0 < n {
        let mut r1 = r0 + 1;
        while r1 < n && offsets[r1 + 1] - offsets[r0] <= cap {
            r1 += 1;
        }
        out.push((r0 as u32, r1 as u32, offsets[r0], offsets[r1]));
        r0 = r1;
    }
    out
}

/// The longest row of CSR `offsets`.
pub fn longest_row(offsets: &[u64]) -> u64 {
    offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
}
