//! One interaction block's kernels in precision `T` (self-connection,
//! Linears, fused radial MLP and convolution, gate), forward and backward.

use super::*;

/// A Linear of the network: with the modality's one-hot as extra input
/// when `modal_input`, plain otherwise, plus e3nn's bias on the `0e`
/// outputs when `bias` is not empty.
#[allow(clippy::too_many_arguments)]
pub(crate) fn network_linear<T: Real>(
    irreps_in: &Irreps,
    irreps_out: &Irreps,
    flat: &[f64],
    bias: &[f64],
    modal_input: bool,
    n_modals: usize,
    modal: Option<usize>,
) -> Result<AffineLinear<T>, E3nnError> {
    let linear = match (modal_input, modal) {
        (true, Some(m)) => AffineLinear::with_modal(irreps_in, irreps_out, flat, n_modals, m),
        (true, None) => Err(E3nnError::Config(
            "a modality input without a modality".into(),
        )),
        (false, _) => AffineLinear::plain(irreps_in, irreps_out, flat),
    }?;
    linear.add_scalar_bias(bias)
}

/// The self-connection term of an interaction block, x → gate_in.
#[derive(Clone, Debug)]
pub enum SelfConnection<T> {
    /// An e3nn Linear of x.
    Linear(IrrepsLinear<T>),
    /// The tensor product of x with the species one-hot (one Linear per species).
    Species(SpeciesLinear<T>),
}

impl<T: Real> SelfConnection<T> {
    /// `out` (N × dim gate_in, overwritten) from `x` (N × dim_in); `types`
    /// (N type indices) pick the species Linear and are ignored by `Linear`.
    pub fn forward(&self, x: &[T], types: &[usize], out: &mut [T]) -> Result<(), E3nnError> {
        match self {
            Self::Linear(l) => l.forward(x, types.len(), out),
            Self::Species(s) => s.forward(x, types, out),
        }
    }

    /// Gradient w.r.t. x (N × dim_in, overwritten) from `grad_out`.
    pub fn backward(
        &self,
        grad_out: &[T],
        types: &[usize],
        grad_x: &mut [T],
    ) -> Result<(), E3nnError> {
        match self {
            Self::Linear(l) => l.backward(grad_out, types.len(), grad_x),
            Self::Species(s) => s.backward(grad_out, types, grad_x),
        }
    }
}

/// One interaction block's kernels in precision `T`.
#[derive(Clone, Debug)]
pub struct InteractionBlock<T> {
    /// sc = SelfConnection(x [, species]), x → gate_in.
    pub self_connection: SelfConnection<T>,
    /// h = Linear_1(x) [+ modality row], x → x.
    pub linear_1: AffineLinear<T>,
    /// Per-edge TP weights from the radial embedding.
    pub radial: RadialMlp<T>,
    /// Tensor-product paths of the convolution.
    pub conv: ConvPaths<T>,
    /// Message divisor.
    pub denominator: f64,
    /// y = Linear_2(A) [+ modality row] + sc, simplified message irreps → gate_in.
    pub linear_2: AffineLinear<T>,
    /// Gate producing the block output.
    pub gate: Gate,
    /// Degree of the edge spherical harmonics the convolution reads.
    pub lmax_sh: usize,
}

/// Values of a block's forward that its backward needs.
#[derive(Clone, Debug)]
pub struct BlockCache<T> {
    /// Linear_1 output (N × dim_x_in), the features the convolution reads.
    pub h: Vec<T>,
    /// Gate input (N × dim_gate_in).
    pub y: Vec<T>,
}

/// Wall time spent per kind of work (seconds), for profiling.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// Edge embedding and spherical harmonics, forward and backward.
    pub edge_features: f64,
    /// Radial MLP GEMMs run on their own. The blocks run the radial MLP
    /// inside the fused convolution kernels, so it is counted under `conv`.
    pub radial_mlp: f64,
    /// Tensor-product convolution forward and backward (with the fused radial MLP).
    pub conv: f64,
    /// Linears (self-connection, Linear_1, Linear_2, readout), forward and backward.
    pub linear: f64,
    /// Gates and the rest.
    pub other: f64,
}

pub(crate) fn timed<R>(slot: &mut f64, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    *slot += t.elapsed().as_secs_f64();
    r
}

impl<T: Real> InteractionBlock<T> {
    pub(crate) fn new(
        w: &LayerWeights,
        c: &SevenNetConfig,
        modal: Option<usize>,
    ) -> Result<Self, E3nnError> {
        let dim_w: usize = w.paths.iter().map(|p| p.mul).sum();
        let (_, gate) = gate_layout(&w.irreps_out, &c.gate_activations);
        let widths: Vec<usize> = std::iter::once(c.n_basis)
            .chain(c.radial_hidden.iter().copied())
            .chain(std::iter::once(dim_w))
            .collect();
        let n_modals = c.modals.len();
        let self_connection = match w.self_connection_kind {
            SelfConnectionKind::Linear => SelfConnection::Linear(IrrepsLinear::new(
                &w.irreps_in,
                &w.irreps_gate_in,
                &w.self_connection,
            )?),
            SelfConnectionKind::Nequip => SelfConnection::Species(SpeciesLinear::new(
                &w.irreps_in,
                c.species.len(),
                &w.irreps_gate_in,
                &w.self_connection,
            )?),
        };
        Ok(Self {
            self_connection,
            linear_1: network_linear(
                &w.irreps_in,
                &w.irreps_in,
                &w.linear_1,
                &w.linear_1_bias,
                c.modal_inputs.self_inter_intro,
                n_modals,
                modal,
            )?,
            radial: RadialMlp::new(&widths, &w.radial)?,
            conv: ConvPaths::new(
                w.irreps_in.dim(),
                c.lmax_sh,
                dim_w,
                w.irreps_msg.dim(),
                w.paths.clone(),
            )?,
            denominator: w.denominator,
            linear_2: network_linear(
                &w.irreps_msg.simplify(),
                &w.irreps_gate_in,
                &w.linear_2,
                &w.linear_2_bias,
                c.modal_inputs.self_inter_outro,
                n_modals,
                modal,
            )?,
            gate,
            lmax_sh: c.lmax_sh,
        })
    }

    /// Width of the block input rows.
    pub fn dim_in(&self) -> usize {
        self.linear_1.irreps_in().dim()
    }
    /// Width of the block output rows.
    pub fn dim_out(&self) -> usize {
        self.gate.dim_out()
    }

    /// Forward over `graph.n_rows()` rows: `x` (N × dim_in), `types` (N
    /// type indices), `emb` (E × n_basis), `sh` (E × sh_dim). Returns the
    /// block output (N × dim_out) and its cache.
    pub fn forward(
        &self,
        graph: &ConvGraph,
        x: &[T],
        types: &[usize],
        emb: &[T],
        sh: &[T],
    ) -> Result<(Vec<T>, BlockCache<T>), E3nnError> {
        self.forward_timed(graph, x, types, emb, sh, &mut Timings::default())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_timed(
        &self,
        graph: &ConvGraph,
        x: &[T],
        types: &[usize],
        emb: &[T],
        sh: &[T],
        tm: &mut Timings,
    ) -> Result<(Vec<T>, BlockCache<T>), E3nnError> {
        let n = graph.n_rows();
        check_len("block types", n, types.len())?;
        let dg = self.gate.dim_in();
        let mut sc = vec![T::ZERO; n * dg];
        let mut h = vec![T::ZERO; n * self.dim_in()];
        timed(&mut tm.linear, || -> Result<(), E3nnError> {
            self.self_connection.forward(x, types, &mut sc)?;
            self.linear_1.forward(x, n, &mut h)
        })?;
        let mut a = vec![T::ZERO; n * self.conv.dim_msg()];
        // The radial MLP runs inside the fused kernel, so its time counts as conv.
        timed(&mut tm.conv, || {
            radial_conv_forward(
                &self.conv,
                &self.radial,
                self.denominator,
                graph,
                &h,
                emb,
                sh,
                &mut a,
            )
        })?;
        let mut y = vec![T::ZERO; n * dg];
        timed(&mut tm.linear, || self.linear_2.forward(&a, n, &mut y))?;
        let mut out = vec![T::ZERO; n * self.dim_out()];
        timed(&mut tm.other, || -> Result<(), E3nnError> {
            y.par_iter_mut()
                .zip(sc.par_iter())
                .for_each(|(v, s)| *v += *s);
            self.gate.forward(&y, n, &mut out)
        })?;
        Ok((out, BlockCache { h, y }))
    }

    /// Backward: from `grad_out` (N × dim_out) returns the gradient w.r.t. the
    /// block input (N × dim_in) and **adds** into `grad_emb` (E × n_basis)
    /// and `grad_sh` (E × sh_dim). `types` as in [`Self::forward`].
    /// Recomputes the radial MLP instead of storing it.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        graph: &ConvGraph,
        types: &[usize],
        emb: &[T],
        sh: &[T],
        cache: &BlockCache<T>,
        grad_out: &[T],
        grad_emb: &mut [T],
        grad_sh: &mut [T],
    ) -> Result<Vec<T>, E3nnError> {
        self.backward_timed(
            graph,
            types,
            emb,
            sh,
            cache,
            grad_out,
            grad_emb,
            grad_sh,
            &mut Timings::default(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_timed(
        &self,
        graph: &ConvGraph,
        types: &[usize],
        emb: &[T],
        sh: &[T],
        cache: &BlockCache<T>,
        grad_out: &[T],
        grad_emb: &mut [T],
        grad_sh: &mut [T],
        tm: &mut Timings,
    ) -> Result<Vec<T>, E3nnError> {
        let (n, ne) = (graph.n_rows(), graph.n_edges());
        let (dg, di) = (self.gate.dim_in(), self.dim_in());
        check_len("block grad_emb", ne * self.radial.dim_in(), grad_emb.len())?;
        check_len("block grad_sh", ne * sh_dim(self.lmax_sh), grad_sh.len())?;
        let mut gy = vec![T::ZERO; n * dg];
        timed(&mut tm.other, || {
            self.gate.backward(&cache.y, grad_out, n, &mut gy)
        })?;
        let mut ga = vec![T::ZERO; n * self.conv.dim_msg()];
        timed(&mut tm.linear, || self.linear_2.backward(&gy, n, &mut ga))?;
        let mut gh = vec![T::ZERO; n * di];
        let mut gsh = vec![T::ZERO; grad_sh.len()];
        let mut gemb = vec![T::ZERO; grad_emb.len()];
        timed(&mut tm.conv, || {
            radial_conv_backward(
                &self.conv,
                &self.radial,
                self.denominator,
                graph,
                &cache.h,
                emb,
                sh,
                &ga,
                &mut gh,
                &mut gemb,
                &mut gsh,
            )
        })?;
        timed(&mut tm.other, || {
            grad_emb
                .par_iter_mut()
                .zip(gemb.par_iter())
                .for_each(|(a, b)| *a += *b);
            grad_sh
                .par_iter_mut()
                .zip(gsh.par_iter())
                .for_each(|(a, b)| *a += *b);
        });
        let mut gx = vec![T::ZERO; n * di];
        let mut gx_sc = vec![T::ZERO; n * di];
        timed(&mut tm.linear, || -> Result<(), E3nnError> {
            self.linear_1.backward(&gh, n, &mut gx)?;
            self.self_connection.backward(&gy, types, &mut gx_sc)
        })?;
        gx.par_iter_mut()
            .zip(gx_sc.par_iter())
            .for_each(|(a, b)| *a += *b);
        Ok(gx)
    }
}
