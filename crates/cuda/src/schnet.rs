//! SchNet (the `schnet-demo` model) on the GPU: energy, per-atom energies,
//! forces and stress in f64 or f32, everything on the device between the
//! upload of the positions and the download of the results.
//!
//! Per evaluation: the neighbour list ([`GpuNeighborList`]); per edge the
//! vector, the Gaussians and the cosine cutoff (in f64, rounded once for
//! f32, as the CPU path does); the sender CSR. Per interaction block: the
//! filter network on all edges as two cuBLAS GEMMs around a shifted
//! softplus, the input linear, the message summed over each receiver's CSR
//! row, the output network. The readout, then the backward by hand: the
//! message's gradient per edge (filter and cutoff) and per sender row
//! (features), the filter network recomputed and differentiated, forces
//! and virials by receiver and sender CSR rows. Only the per-atom features
//! and pre-activations of each block are kept for the backward, never a
//! per-edge tensor per block. No floating-point atomics: the same bits
//! every run.

use crate::model::stress_volume;
use crate::neighbors::GpuTimings;
use crate::sevennet::halo_stage::{Exchange, HaloStage};
use crate::sevennet::{
    finish, gemm, grid_1d, per_row, upload, upload_t, zeros, Finished, GpuFloat, Kernels, RankRows,
    SenderCsr,
};
use crate::{CudaDevice, CudaError, GpuNeighborList, GpuOutput, Precision};
use cudarc::cublas::{CudaBlas, Gemm};
use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, PushKernelArg};
use ddmlip_atoms::System;
use ddmlip_models::SchNetWeights;
use std::time::Instant;

/// Most Gaussians per distance the kernels take (`SC_MAX_RBF` in schnet.cu).
pub const MAX_RBF: usize = 32;

/// `struct SchNetEdgeParams` of the kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct EdgeParams {
    centers: [f64; MAX_RBF],
    n_rbf: u32,
    _pad: u32,
    gamma: f64,
    cutoff: f64,
}

// SAFETY: plain `repr(C)` data matching `struct SchNetEdgeParams` in schnet.cu.
unsafe impl DeviceRepr for EdgeParams {}

struct SchNetKernels {
    edges: CudaFunction,
    edges_bwd: CudaFunction,
    ssp_copy: CudaFunction,
    ssp_backward: CudaFunction,
    message: CudaFunction,
    message_bwd_edge: CudaFunction,
    message_bwd_node: CudaFunction,
    add_species: CudaFunction,
    readout_seed: CudaFunction,
}

struct DeviceLayer<T> {
    filter_1: CudaSlice<T>,
    filter_1_bias: CudaSlice<T>,
    filter_2: CudaSlice<T>,
    input: CudaSlice<T>,
    output_1: CudaSlice<T>,
    output_1_bias: CudaSlice<T>,
    output_2: CudaSlice<T>,
}

struct DeviceNet<T> {
    embedding: CudaSlice<T>,
    layers: Vec<DeviceLayer<T>>,
    readout_1: CudaSlice<T>,
    readout_2: CudaSlice<T>,
    species_bias: CudaSlice<T>,
    features: usize,
    n_rbf: usize,
    edge: EdgeParams,
    k: SchNetKernels,
    sn: Kernels,
}

enum Net {
    F64(DeviceNet<f64>),
    F32(DeviceNet<f32>),
}

/// A SchNet with its weights on a CUDA device in one precision.
pub struct GpuSchNet {
    net: Net,
    cutoff: f64,
    n_species: usize,
    n_layers: usize,
    features: usize,
    n_rbf: usize,
    precision: Precision,
}

impl std::fmt::Debug for GpuSchNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSchNet")
            .field("precision", &self.precision)
            .field("layers", &self.n_layers)
            .field("features", &self.features)
            .finish()
    }
}

/// Checks that the weights' shapes agree with each other and with the
/// kernels' limits.
fn check_shapes(w: &SchNetWeights) -> Result<usize, CudaError> {
    let bad = |what: String| Err(CudaError::Input(format!("SchNet weights: {what}")));
    let (f, k) = (w.features, w.rbf_centers.len());
    let n_species = w.species_bias.len();
    if f < 2 || k == 0 || k > MAX_RBF {
        return bad(format!(
            "{f} features and {k} Gaussians (need at least 2 features and 1 to {MAX_RBF} Gaussians)"
        ));
    }
    if !(w.cutoff.is_finite() && w.cutoff > 0.0) {
        return bad(format!(
            "the cutoff must be positive and finite, got {}",
            w.cutoff
        ));
    }
    if n_species == 0 || w.embedding.len() != n_species * f {
        return bad(format!(
            "an embedding of {} values for {n_species} species × {f} features",
            w.embedding.len()
        ));
    }
    if w.readout_1.len() != f * (f / 2) || w.readout_2.len() != f / 2 {
        return bad("readout shapes do not match the features".into());
    }
    for (i, l) in w.layers.iter().enumerate() {
        let sizes = [
            (l.filter_1.len(), k * f),
            (l.filter_1_bias.len(), f),
            (l.filter_2.len(), f * f),
            (l.input.len(), f * f),
            (l.output_1.len(), f * f),
            (l.output_1_bias.len(), f),
            (l.output_2.len(), f * f),
        ];
        if sizes.iter().any(|(got, want)| got != want) {
            return bad(format!("block {i}'s shapes do not match {f} features"));
        }
    }
    Ok(n_species)
}

impl GpuSchNet {
    /// Puts the SchNet of `weights` on `device` in `precision`. Errors name
    /// inconsistent shapes; driver errors otherwise.
    pub fn new(
        device: &CudaDevice,
        weights: &SchNetWeights,
        precision: Precision,
    ) -> Result<Self, CudaError> {
        let n_species = check_shapes(weights)?;
        let net = match precision {
            Precision::F64 => Net::F64(DeviceNet::new(device, weights)?),
            Precision::F32 => Net::F32(DeviceNet::new(device, weights)?),
        };
        Ok(Self {
            net,
            cutoff: weights.cutoff,
            n_species,
            n_layers: weights.layers.len(),
            features: weights.features,
            n_rbf: weights.rbf_centers.len(),
            precision,
        })
    }

    /// The interaction cutoff (Å).
    pub fn cutoff(&self) -> f64 {
        self.cutoff
    }

    /// The precision the weights were loaded in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    fn float_bytes(&self) -> u64 {
        match self.precision {
            Precision::F64 => 8,
            Precision::F32 => 4,
        }
    }

    /// Device memory an evaluation of `n` atoms and `ne` edges holds at its
    /// fullest (bytes), besides the neighbour list.
    pub fn memory_bytes(&self, n: u64, ne: u64) -> u64 {
        let fb = self.float_bytes();
        let (f, k, l) = (
            self.features as u64,
            self.n_rbf as u64,
            self.n_layers as u64,
        );
        // Per edge: receiver and sender index, vector and its gradient (f64),
        // Gaussians and their gradients, cutoff and its gradient, and four
        // filter-wide rows (pre-activation, activation, filter, gradient
        // twice over).
        let per_edge = 4 + 4 + 24 + 24 + fb * (2 * k + 2 + 5 * f);
        // Per atom: features, two kept rows per block, the readout and a few
        // feature-wide gradients; forces and virials (f64).
        let per_atom = 8 + 8 + 8 + 72 + fb * (f * (2 * l + 8) + f / 2 * 3 + 3);
        ne * per_edge + n * per_atom
    }

    /// Evaluates `system` on `device`: energy, per-atom energies, forces,
    /// stress. Errors: elements beyond the model's species, the neighbour
    /// list's input errors, and [`CudaError::OutOfMemory`] (checked before
    /// allocating) naming how many atoms of this density would fit.
    pub fn evaluate(&self, device: &CudaDevice, system: &System) -> Result<GpuOutput, CudaError> {
        self.evaluate_rows(device, system, None)
    }

    /// One rank's part of a decomposed evaluation: `local` holds the rank's
    /// owned atoms (rows `0..rank.n_owned`) and then its ghosts (no cell).
    /// The ghosts' features come from their owners through `rank.halo`
    /// before every interaction block after the first, and their gradients
    /// go back the same way. Returns this rank's share: energy and virial
    /// summed over its owned atoms and edges, per-atom energies and forces
    /// of its owned atoms (complete), no stress.
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
        let numbers: Vec<i32> = system
            .numbers
            .iter()
            .enumerate()
            .map(|(i, &z)| {
                if (z as usize) < self.n_species {
                    Ok(z as i32)
                } else {
                    Err(CudaError::Input(format!(
                        "atom {i}: element Z={z} is beyond this model's species (Z < {})",
                        self.n_species
                    )))
                }
            })
            .collect::<Result<_, _>>()?;
        if numbers.is_empty() {
            return Err(CudaError::Input("the system has no atoms".into()));
        }
        // A rank's ghosts are senders only: their rows would compute
        // messages that the next refresh overwrites.
        let n_owned = rank.as_ref().map(|r| r.n_owned);
        let (list, neighbors_s) =
            GpuNeighborList::build_for_centers(device, system, self.cutoff, n_owned)?;
        let start = Instant::now();
        let (n, ne) = (list.n_atoms as u64, list.n_pairs as u64);
        if ne > u64::from(u32::MAX) {
            return Err(CudaError::Input(format!(
                "{ne} pairs: more than the kernels index ({})",
                u32::MAX
            )));
        }
        let estimated = self.memory_bytes(n, ne);
        device.check_fits(
            &format!("schnet-demo on {n} atoms ({ne} edges)"),
            estimated,
            n,
        )?;
        let out = match &self.net {
            Net::F64(net) => net.run(device, &list, &numbers, rank.as_mut()),
            Net::F32(net) => net.run(device, &list, &numbers, rank.as_mut()),
        }?;
        let model_s = start.elapsed().as_secs_f64();
        let stress = stress_volume(system)
            .filter(|_| rank.is_none())
            .map(|v| out.virial.map(|w| w / v));
        Ok(GpuOutput {
            energy: out.energy,
            forces: out.forces,
            stress,
            virial: out.virial,
            atomic_energies: out.atomic,
            n_pairs: list.n_pairs,
            timings: GpuTimings {
                neighbors_s,
                model_s,
            },
            peak_bytes: None,
            estimated_bytes: Some(estimated),
        })
    }
}

/// Edge-wide buffers of one block's filter network: pre-activation,
/// activation and the filter itself (edges × features each).
struct FilterRows<T> {
    pre: CudaSlice<T>,
    act: CudaSlice<T>,
    filt: CudaSlice<T>,
}

impl<T: GpuFloat> DeviceNet<T>
where
    CudaBlas: Gemm<T>,
{
    fn new(device: &CudaDevice, w: &SchNetWeights) -> Result<Self, CudaError> {
        let module = device.load_module("schnet", crate::kernels::SCHNET_KERNELS)?;
        let f = |name: &str| -> Result<CudaFunction, CudaError> {
            let full = format!("{name}_{}", T::SUFFIX);
            module
                .load_function(&full)
                .map_err(|e| CudaError::driver(format!("loading kernel {full}"), e))
        };
        let k = SchNetKernels {
            edges: f("sc_edges")?,
            edges_bwd: f("sc_edges_bwd")?,
            ssp_copy: f("sc_ssp_copy")?,
            ssp_backward: f("sc_ssp_backward")?,
            message: f("sc_message")?,
            message_bwd_edge: f("sc_message_bwd_edge")?,
            message_bwd_node: f("sc_message_bwd_node")?,
            add_species: f("sc_add_species")?,
            readout_seed: f("sc_readout_seed")?,
        };
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(DeviceLayer {
                    filter_1: upload_t(device, &l.filter_1)?,
                    filter_1_bias: upload_t(device, &l.filter_1_bias)?,
                    filter_2: upload_t(device, &l.filter_2)?,
                    input: upload_t(device, &l.input)?,
                    output_1: upload_t(device, &l.output_1)?,
                    output_1_bias: upload_t(device, &l.output_1_bias)?,
                    output_2: upload_t(device, &l.output_2)?,
                })
            })
            .collect::<Result<_, CudaError>>()?;
        let mut centers = [0.0; MAX_RBF];
        centers[..w.rbf_centers.len()].copy_from_slice(&w.rbf_centers);
        Ok(Self {
            embedding: upload_t(device, &w.embedding)?,
            layers,
            readout_1: upload_t(device, &w.readout_1)?,
            readout_2: upload_t(device, &w.readout_2)?,
            species_bias: upload_t(device, &w.species_bias)?,
            features: w.features,
            n_rbf: w.rbf_centers.len(),
            edge: EdgeParams {
                centers,
                n_rbf: w.rbf_centers.len() as u32,
                _pad: 0,
                gamma: w.rbf_gamma,
                cutoff: w.cutoff,
            },
            k,
            sn: Kernels::load::<T>(device)?,
        })
    }

    /// `out *= ssp'(x)` (`with_derivative`) or `out = ssp(x)`, `len` values.
    fn ssp(
        &self,
        device: &CudaDevice,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        len: u64,
        with_derivative: bool,
    ) -> Result<(), CudaError> {
        let (func, what) = if with_derivative {
            (&self.k.ssp_backward, "the shifted softplus backward")
        } else {
            (&self.k.ssp_copy, "the shifted softplus")
        };
        launch!(device.stream(), func, grid_1d(len, 256), what; x, out, &len)
    }

    /// `out (rows × dim) += bias`.
    fn add_bias(
        &self,
        device: &CudaDevice,
        bias: &CudaSlice<T>,
        rows: u32,
        dim: u32,
        out: &mut CudaSlice<T>,
    ) -> Result<(), CudaError> {
        launch!(device.stream(), &self.sn.add_bias, grid_1d(u64::from(rows) * u64::from(dim), 256),
            "adding a bias"; bias, &rows, &dim, out)
    }

    /// The block's filter on every edge: `pre = rbf·filter_1 + b`,
    /// `act = ssp(pre)`, `filt = act·filter_2` (the cutoff is applied where
    /// the filter is read).
    fn filter(
        &self,
        device: &CudaDevice,
        layer: &DeviceLayer<T>,
        rbf: &CudaSlice<T>,
        ne: usize,
        rows: &mut FilterRows<T>,
    ) -> Result<(), CudaError> {
        let (f, k) = (self.features, self.n_rbf);
        let blas = device.blas();
        gemm(
            blas,
            ne,
            k,
            f,
            rbf,
            &layer.filter_1,
            false,
            0.0,
            &mut rows.pre,
        )?;
        self.add_bias(
            device,
            &layer.filter_1_bias,
            ne as u32,
            f as u32,
            &mut rows.pre,
        )?;
        self.ssp(device, &rows.pre, &mut rows.act, (ne * f) as u64, false)?;
        gemm(
            blas,
            ne,
            f,
            f,
            &rows.act,
            &layer.filter_2,
            false,
            0.0,
            &mut rows.filt,
        )
    }

    fn run(
        &self,
        device: &CudaDevice,
        list: &GpuNeighborList,
        numbers: &[i32],
        mut rank: Option<&mut RankRows<'_>>,
    ) -> Result<Finished, CudaError> {
        let stream = device.stream();
        let blas = device.blas();
        let (n, ne) = (list.n_atoms, list.n_pairs);
        let (n32, ne64) = (n as u32, ne as u64);
        let n_owned = rank.as_ref().map_or(n, |r| r.n_owned);
        if n_owned > n {
            return Err(CudaError::Input(format!(
                "a rank owns {n_owned} atoms but holds only {n}"
            )));
        }
        let owned32 = n_owned as u32;
        let (f, k) = (self.features, self.n_rbf);
        let (f32_, half) = (f as u32, f / 2);
        let nf = (n * f) as u64;
        let mut stage = match rank.as_deref() {
            Some(r) => Some(HaloStage::<T>::new(device, r, n, f)?),
            None => None,
        };

        // Edge geometry and radial functions.
        let mut centers = zeros::<u32>(device, ne, "allocating edge receivers")?;
        let mut vectors = zeros::<f64>(device, 3 * ne, "allocating edge vectors")?;
        let mut rbf = zeros::<T>(device, ne * k, "allocating the Gaussians")?;
        let mut fc = zeros::<T>(device, ne, "allocating the cutoff")?;
        let basis: Vec<f64> = list.frame.basis.iter().flatten().copied().collect();
        let basis_d = upload(device, &basis)?;
        launch!(stream, &self.k.edges, grid_1d(u64::from(n32), 128), "the edge geometry";
            &list.positions, &basis_d, &list.row_start, &list.neighbors, &list.shifts, &self.edge,
            &n32, &mut centers, &mut vectors, &mut rbf, &mut fc)?;

        // Sender CSR: the edges each atom sends, ascending.
        let sender = SenderCsr::build(device, &self.sn, list)?;

        // Forward.
        let numbers_d = upload(device, numbers)?;
        let mut x = zeros::<T>(device, n * f, "allocating node features")?;
        launch!(stream, &self.sn.embed_species, grid_1d(nf, 256), "the species embedding";
            &self.embedding, &numbers_d, &n32, &f32_, &mut x)?;
        let edge_rows = |what| zeros::<T>(device, ne * f, what);
        let mut rows = FilterRows {
            pre: edge_rows("allocating filter pre-activations")?,
            act: edge_rows("allocating filter activations")?,
            filt: edge_rows("allocating filters")?,
        };
        // Per block: the input linear's output and the output network's
        // pre-activation, for the backward.
        let mut kept: Vec<(CudaSlice<T>, CudaSlice<T>)> = Vec::with_capacity(self.layers.len());
        let mut act = zeros::<T>(device, n * f, "allocating block activations")?;
        let mut agg = zeros::<T>(device, n * f, "allocating messages")?;
        for (li, layer) in self.layers.iter().enumerate() {
            // Ghost rows of a block's input are their owners' (the species
            // embedding of the first block already is).
            if let (Some(r), Some(stage)) = (rank.as_deref_mut(), stage.as_mut()) {
                if li > 0 {
                    stage.exchange(&self.sn, device, &mut x, f, r, Exchange::Refresh)?;
                }
            }
            self.filter(device, layer, &rbf, ne, &mut rows)?;
            let mut xl = zeros::<T>(device, n * f, "allocating block inputs")?;
            gemm(blas, n, f, f, &x, &layer.input, false, 0.0, &mut xl)?;
            launch!(stream, &self.k.message, grid_1d(nf, 128), "the message";
                &xl, &rows.filt, &fc, &list.row_start, &list.neighbors, &n32, &f32_, &mut agg)?;
            let mut pre = zeros::<T>(device, n * f, "allocating block pre-activations")?;
            gemm(blas, n, f, f, &agg, &layer.output_1, false, 0.0, &mut pre)?;
            self.add_bias(device, &layer.output_1_bias, n32, f32_, &mut pre)?;
            self.ssp(device, &pre, &mut act, nf, false)?;
            // x ← x + ssp(pre)·output_2.
            gemm(blas, n, f, f, &act, &layer.output_2, false, 1.0, &mut x)?;
            kept.push((xl, pre));
        }
        let mut hidden = zeros::<T>(device, n * half, "allocating the readout")?;
        gemm(
            blas,
            n,
            f,
            half,
            &x,
            &self.readout_1,
            false,
            0.0,
            &mut hidden,
        )?;
        let mut hidden_act = zeros::<T>(device, n * half, "allocating the readout")?;
        self.ssp(device, &hidden, &mut hidden_act, (n * half) as u64, false)?;
        let mut e = zeros::<T>(device, n, "allocating atomic energies")?;
        gemm(
            blas,
            n,
            half,
            1,
            &hidden_act,
            &self.readout_2,
            false,
            0.0,
            &mut e,
        )?;
        drop(hidden_act);
        let mut energies = zeros::<T>(device, n, "allocating atomic energies")?;
        launch!(stream, &self.k.add_species, grid_1d(u64::from(n32), 128), "the species offsets";
            &e, &self.species_bias, &numbers_d, &n32, &mut energies)?;
        drop(e);
        let mut totals = zeros::<f64>(device, 7, "allocating totals")?;
        {
            let mut e_out = totals.slice_mut(0..1);
            let one = 1u32;
            launch!(stream, &self.sn.column_sums, per_row(1, 256), "the energy sum";
                &energies, &owned32, &one, &mut e_out)?;
        }

        // Backward, seeded with 1 on every owned atom's energy.
        let mut g_hidden = zeros::<T>(device, n * half, "allocating readout gradients")?;
        let half32 = half as u32;
        launch!(stream, &self.k.readout_seed, grid_1d((n * half) as u64, 256), "the readout seed";
            &self.readout_2, &owned32, &n32, &half32, &mut g_hidden)?;
        self.ssp(device, &hidden, &mut g_hidden, (n * half) as u64, true)?;
        let mut gx = zeros::<T>(device, n * f, "allocating feature gradients")?;
        gemm(
            blas,
            n,
            half,
            f,
            &g_hidden,
            &self.readout_1,
            true,
            0.0,
            &mut gx,
        )?;
        drop((hidden, g_hidden, x));
        let mut grad_rbf = zeros::<T>(device, ne * k, "allocating Gaussian gradients")?;
        let mut grad_fc = zeros::<T>(device, ne, "allocating cutoff gradients")?;
        let mut g_filt = edge_rows("allocating filter gradients")?;
        let mut g_act = edge_rows("allocating filter gradients")?;
        let mut g_pre = zeros::<T>(device, n * f, "allocating block gradients")?;
        let mut g_agg = zeros::<T>(device, n * f, "allocating message gradients")?;
        let mut g_xl = zeros::<T>(device, n * f, "allocating block input gradients")?;
        for (li, (layer, (xl, pre))) in self.layers.iter().zip(kept.iter()).enumerate().rev() {
            // Output network: x_out = x_in + ssp(agg·output_1 + b)·output_2.
            gemm(blas, n, f, f, &gx, &layer.output_2, true, 0.0, &mut g_pre)?;
            self.ssp(device, pre, &mut g_pre, nf, true)?;
            gemm(
                blas,
                n,
                f,
                f,
                &g_pre,
                &layer.output_1,
                true,
                0.0,
                &mut g_agg,
            )?;
            // The message: filter and cutoff gradients per edge, input
            // gradients per sender row.
            self.filter(device, layer, &rbf, ne, &mut rows)?;
            launch!(stream, &self.k.message_bwd_edge, grid_1d(ne64 * 32, 256),
                "the message backward (edges)";
                &g_agg, xl, &rows.filt, &fc, &centers, &list.neighbors, &ne64, &f32_, &mut g_filt,
                &mut grad_fc)?;
            launch!(stream, &self.k.message_bwd_node, grid_1d(nf, 128),
                "the message backward (features)";
                &g_agg, &rows.filt, &fc, &sender.start, &sender.edges, &centers, &n32, &f32_,
                &mut g_xl)?;
            gemm(blas, n, f, f, &g_xl, &layer.input, true, 1.0, &mut gx)?;
            // The filter network, back to the Gaussians.
            gemm(
                blas,
                ne,
                f,
                f,
                &g_filt,
                &layer.filter_2,
                true,
                0.0,
                &mut g_act,
            )?;
            self.ssp(device, &rows.pre, &mut g_act, (ne * f) as u64, true)?;
            gemm(
                blas,
                ne,
                f,
                k,
                &g_act,
                &layer.filter_1,
                true,
                1.0,
                &mut grad_rbf,
            )?;
            // Ghost rows of this block's input were copies of their owners'
            // rows: their gradients belong to the owners.
            if let (Some(r), Some(stage)) = (rank.as_deref_mut(), stage.as_mut()) {
                if li > 0 {
                    stage.exchange(&self.sn, device, &mut gx, f, r, Exchange::ReverseSum)?;
                }
            }
        }
        drop((rows, g_filt, g_act, g_pre, g_agg, g_xl, gx, kept, act, agg));

        // Edge gradients, forces, virial.
        let mut grad_vec = zeros::<f64>(device, 3 * ne, "allocating edge gradients")?;
        launch!(stream, &self.k.edges_bwd, grid_1d(ne64, 128), "the edge geometry backward";
            &vectors, &grad_rbf, &grad_fc, &self.edge, &ne64, &mut grad_vec)?;
        finish(
            device,
            &self.sn,
            list,
            &sender,
            (&vectors, &grad_vec),
            &energies,
            &mut totals,
            n_owned,
            rank,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{check_shapes, MAX_RBF};
    use ddmlip_models::SchNetDemo;

    #[test]
    fn the_demo_weights_pass_and_bad_shapes_are_named() {
        let good = SchNetDemo::default().weights();
        assert_eq!(check_shapes(&good).unwrap(), 95);
        let wide = SchNetDemo {
            n_rbf: MAX_RBF + 1,
            ..SchNetDemo::default()
        };
        let e = check_shapes(&wide.weights()).unwrap_err();
        assert!(e.is_input() && e.to_string().contains("Gaussians"), "{e}");
        let mut short = good.clone();
        short.layers[1].output_2.pop();
        let e = check_shapes(&short).unwrap_err();
        assert!(e.to_string().contains("block 1"), "{e}");
        let mut embedding = good.clone();
        embedding.embedding.push(0.0);
        assert!(check_shapes(&embedding).is_err());
        let mut cutoff = good;
        cutoff.cutoff = f64::NAN;
        assert!(check_shapes(&cutoff)
            .unwrap_err()
            .to_string()
            .contains("cutoff"));
    }
}
