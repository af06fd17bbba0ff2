use crate::device::{DeviceBinary, DeviceBroadcast};
use crate::graph::NodeSpec;
use crate::ops::map_parts;
use crate::{EngineError, Graph, RowDomain, Scalar, Tensor};

/// Element-wise functions with known derivatives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    /// x·σ(x)
    Silu,
    /// Hyperbolic tangent.
    Tanh,
    /// 1/(1+e^(−x))
    Sigmoid,
    /// ln(½eˣ + ½), SchNet's activation (zero at zero).
    ShiftedSoftplus,
    /// eˣ
    Exp,
    /// Natural logarithm.
    Ln,
    /// √x (x ≥ 0).
    Sqrt,
    /// x²
    Square,
    /// 1/x
    Recip,
    /// −x
    Neg,
    /// c·x
    Scale(f64),
    /// x + c
    AddScalar(f64),
    /// x^p
    Powf(f64),
    /// Normalised SiLU as e3nn uses it: c·x·σ(x).
    ScaledSilu(f64),
    /// cos x (x in radians).
    Cos,
    /// sin x (x in radians).
    Sin,
}

impl Unary {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Unary::Silu => "silu",
            Unary::Tanh => "tanh",
            Unary::Sigmoid => "sigmoid",
            Unary::ShiftedSoftplus => "shifted_softplus",
            Unary::Exp => "exp",
            Unary::Ln => "ln",
            Unary::Sqrt => "sqrt",
            Unary::Square => "square",
            Unary::Recip => "recip",
            Unary::Neg => "neg",
            Unary::Scale(_) => "scale",
            Unary::AddScalar(_) => "add_scalar",
            Unary::Powf(_) => "powf",
            Unary::ScaledSilu(_) => "scaled_silu",
            Unary::Cos => "cos",
            Unary::Sin => "sin",
        }
    }

    #[inline]
    pub(crate) fn apply<T: Scalar>(&self, x: T) -> T {
        let one = T::one();
        match *self {
            Unary::Silu => x / (one + (-x).exp_branchless()),
            Unary::Tanh => x.tanh(),
            Unary::Sigmoid => one / (one + (-x).exp_branchless()),
            Unary::ShiftedSoftplus => softplus(x) - T::from_f64(std::f64::consts::LN_2),
            Unary::Exp => x.exp_branchless(),
            Unary::Ln => x.ln(),
            Unary::Sqrt => x.sqrt(),
            Unary::Square => x * x,
            Unary::Recip => one / x,
            Unary::Neg => -x,
            Unary::Scale(c) => T::from_f64(c) * x,
            Unary::AddScalar(c) => x + T::from_f64(c),
            Unary::Powf(p) => power(x, p),
            Unary::ScaledSilu(c) => T::from_f64(c) * x / (one + (-x).exp_branchless()),
            Unary::Cos => x.cos(),
            Unary::Sin => x.sin(),
        }
    }

    /// `dst[e] = f(src[e])`, bit for bit [`Unary::apply`], with the match
    /// hoisted out of the loop so that the common maps vectorise.
    /// Compiled for the running CPU's widest vectors (same bits: see
    /// [`crate::ops::simd`]).
    pub(crate) fn apply_slice<T: Scalar>(&self, src: &[T], dst: &mut [T]) {
        let f = *self;
        crate::ops::simd::dispatch!((f: Unary, src: &[T], dst: &mut [T]) {
            f.apply_slice_scalar(src, dst)
        })
    }

    #[inline(always)]
    fn apply_slice_scalar<T: Scalar>(&self, src: &[T], dst: &mut [T]) {
        macro_rules! each {
            ($x:ident => $e:expr) => {
                for (d, &$x) in dst.iter_mut().zip(src) {
                    *d = $e;
                }
            };
        }
        let one = T::one();
        match *self {
            Unary::Scale(c) => {
                let c = T::from_f64(c);
                each!(x => c * x)
            }
            Unary::AddScalar(c) => {
                let c = T::from_f64(c);
                each!(x => x + c)
            }
            Unary::Square => each!(x => x * x),
            Unary::Recip => each!(x => one / x),
            Unary::Neg => each!(x => -x),
            Unary::Powf(p) if p.fract() == 0.0 && p.abs() <= 16.0 => {
                let n = p as i32;
                each!(x => powi(x, n))
            }
            // The activations of the imported models: branch-free `exp`
            // inlined, so these loops vectorise.
            Unary::Silu => each!(x => x / (one + (-x).exp_branchless())),
            Unary::ScaledSilu(c) => {
                let c = T::from_f64(c);
                each!(x => c * x / (one + (-x).exp_branchless()))
            }
            Unary::Sigmoid => each!(x => one / (one + (-x).exp_branchless())),
            Unary::ShiftedSoftplus => {
                let ln2 = T::from_f64(std::f64::consts::LN_2);
                each!(x => softplus(x) - ln2)
            }
            Unary::Exp => each!(x => x.exp_branchless()),
            f => each!(x => f.apply(x)),
        }
    }

    /// `acc[e] += g[e] · f'(x[e])` (y = f(x)), bit for bit the products of
    /// [`Unary::derivative`], with the match hoisted out of the loop.
    /// Compiled for the running CPU's widest vectors (same bits: see
    /// [`crate::ops::simd`]).
    pub(crate) fn accumulate_derivative_slice<T: Scalar>(
        &self,
        x: &[T],
        y: &[T],
        g: &[T],
        acc: &mut [T],
    ) {
        let f = *self;
        crate::ops::simd::dispatch!((f: Unary, x: &[T], y: &[T], g: &[T], acc: &mut [T]) {
            f.accumulate_derivative_slice_scalar(x, y, g, acc)
        })
    }

    #[inline(always)]
    fn accumulate_derivative_slice_scalar<T: Scalar>(
        &self,
        x: &[T],
        y: &[T],
        g: &[T],
        acc: &mut [T],
    ) {
        macro_rules! each {
            ($x:ident, $y:ident => $e:expr) => {
                for (((a, &gi), &$x), &$y) in acc.iter_mut().zip(g).zip(x).zip(y) {
                    *a += gi * $e;
                }
            };
        }
        match *self {
            Unary::Scale(c) => {
                let c = T::from_f64(c);
                each!(_x, _y => c)
            }
            Unary::AddScalar(_) => each!(_x, _y => T::one()),
            Unary::Square => {
                let two = T::from_f64(2.0);
                each!(xi, _y => two * xi)
            }
            Unary::Recip => each!(_x, yi => -yi * yi),
            Unary::Silu => each!(xi, _y => {
                let s = T::one() / (T::one() + (-xi).exp_branchless());
                s * (T::one() + xi * (T::one() - s))
            }),
            Unary::ScaledSilu(c) => {
                let c = T::from_f64(c);
                each!(xi, _y => {
                    let s = T::one() / (T::one() + (-xi).exp_branchless());
                    c * s * (T::one() + xi * (T::one() - s))
                })
            }
            Unary::Sigmoid => each!(_x, yi => yi * (T::one() - yi)),
            Unary::ShiftedSoftplus => {
                each!(xi, _y => T::one() / (T::one() + (-xi).exp_branchless()))
            }
            Unary::Exp => each!(_x, yi => yi),
            Unary::Powf(p) if p.fract() == 0.0 && p.abs() <= 16.0 && (p - 1.0).abs() <= 16.0 => {
                let (c, n) = (T::from_f64(p), (p - 1.0) as i32);
                each!(xi, _y => c * powi(xi, n))
            }
            f => each!(xi, yi => f.derivative(xi, yi)),
        }
    }

    /// Whether [`Unary::derivative`] (and its slice form) reads x and y:
    /// the values the op's backward keeps.
    pub(crate) fn derivative_reads(&self) -> (bool, bool) {
        match *self {
            Unary::Silu
            | Unary::ScaledSilu(_)
            | Unary::ShiftedSoftplus
            | Unary::Ln
            | Unary::Square
            | Unary::Powf(_)
            | Unary::Cos
            | Unary::Sin => (true, false),
            Unary::Tanh | Unary::Sigmoid | Unary::Exp | Unary::Sqrt | Unary::Recip => (false, true),
            Unary::Neg | Unary::Scale(_) | Unary::AddScalar(_) => (false, false),
        }
    }

    /// dy/dx given x and y.
    #[inline]
    pub(crate) fn derivative<T: Scalar>(&self, x: T, y: T) -> T {
        let one = T::one();
        match *self {
            Unary::Silu => {
                let s = one / (one + (-x).exp_branchless());
                s * (one + x * (one - s))
            }
            Unary::ScaledSilu(c) => {
                let s = one / (one + (-x).exp_branchless());
                T::from_f64(c) * s * (one + x * (one - s))
            }
            Unary::Tanh => one - y * y,
            Unary::Sigmoid => y * (one - y),
            Unary::ShiftedSoftplus => one / (one + (-x).exp_branchless()),
            Unary::Exp => y,
            Unary::Ln => one / x,
            Unary::Sqrt => T::from_f64(0.5) / y,
            Unary::Square => T::from_f64(2.0) * x,
            Unary::Recip => -y * y,
            Unary::Neg => -one,
            Unary::Scale(c) => T::from_f64(c),
            Unary::AddScalar(_) => one,
            Unary::Powf(p) => T::from_f64(p) * power(x, p - 1.0),
            Unary::Cos => -x.sin(),
            Unary::Sin => x.cos(),
        }
    }
}

/// xᵖ; small integer exponents (e.g. the r⁻⁶ of pair potentials) by repeated
/// multiplication, which is exact to a few ulp and far cheaper than `powf`.
#[inline]
fn power<T: Scalar>(x: T, p: f64) -> T {
    if p.fract() == 0.0 && p.abs() <= 16.0 {
        powi(x, p as i32)
    } else {
        x.powf(T::from_f64(p))
    }
}

/// xⁿ by square-and-multiply from the lowest bit: the same products in the
/// same order as the runtime's `powi`, but inlined, so that loops over it
/// vectorise instead of calling out per element.
#[inline(always)]
fn powi<T: Scalar>(x: T, n: i32) -> T {
    let mut base = x;
    let mut e = n.unsigned_abs();
    let mut acc = T::one();
    loop {
        if e & 1 != 0 {
            acc *= base;
        }
        e >>= 1;
        if e == 0 {
            break;
        }
        base *= base;
    }
    if n < 0 {
        T::one() / acc
    } else {
        acc
    }
}

#[inline]
fn softplus<T: Scalar>(x: T) -> T {
    // max(x, 0) + ln(1 + e^−|x|), branch-free so that slices vectorise.
    x.softplus_branchless()
}

/// Elements per block of a binary op's gradient (a stack buffer of this
/// many values holds a block's terms before they are added in).
const GRAD_BLOCK: usize = 1024;

/// How the second operand of a binary op broadcasts against the first.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Broadcast {
    Full,
    PerRow,
    PerCol,
    Scalar,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinaryKind {
    #[inline]
    pub(crate) fn apply<T: Scalar>(self, x: T, y: T) -> T {
        match self {
            BinaryKind::Add => x + y,
            BinaryKind::Sub => x - y,
            BinaryKind::Mul => x * y,
            BinaryKind::Div => x / y,
        }
    }

    /// (∂/∂x, ∂/∂y) of `apply` at (x, y).
    #[inline]
    pub(crate) fn partials<T: Scalar>(self, x: T, y: T) -> (T, T) {
        let one = T::one();
        match self {
            BinaryKind::Add => (one, one),
            BinaryKind::Sub => (one, -one),
            BinaryKind::Mul => (y, x),
            BinaryKind::Div => (one / y, -x / (y * y)),
        }
    }
}

/// `out[i] = f(a[i], y_i)` for `out` = elements `start ..` of a
/// `cols`-column tensor, with `y_i` the element of `b` that element
/// `start + i` broadcasts from (`bc`). The broadcast and `f` are fixed for
/// the whole slice and the rows walked without a division per element, so
/// the loops vectorise; every element is the same `f(x, y)` as one at a
/// time.
#[inline(always)]
fn broadcast_zip<T: Scalar>(
    out: &mut [T],
    a: &[T],
    b: &[T],
    bc: Broadcast,
    cols: usize,
    start: usize,
    f: impl Fn(T, T) -> T,
) {
    match bc {
        Broadcast::Full => {
            let n = out.len();
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(&b[start..start + n]) {
                *o = f(x, y);
            }
        }
        Broadcast::Scalar => {
            let y = b[0];
            for (o, &x) in out.iter_mut().zip(a) {
                *o = f(x, y);
            }
        }
        Broadcast::PerCol | Broadcast::PerRow => {
            let c = cols.max(1);
            let mut i = 0;
            while i < out.len() {
                let (r, k) = ((start + i) / c, (start + i) % c);
                let len = (c - k).min(out.len() - i);
                let (o, x) = (&mut out[i..i + len], &a[i..i + len]);
                if bc == Broadcast::PerCol {
                    for ((o, &x), &y) in o.iter_mut().zip(x).zip(&b[k..k + len]) {
                        *o = f(x, y);
                    }
                } else {
                    let y = b[r];
                    for (o, &x) in o.iter_mut().zip(x) {
                        *o = f(x, y);
                    }
                }
                i += len;
            }
        }
    }
}

/// One block of a gradient: `f(g, y)` broadcast as [`broadcast_zip`]
/// does, written into `dst` (`overwrite`) or added to it. `at` is `(b,
/// broadcast, cols, first element, overwrite)`.
#[inline(always)]
fn grad_block<T: Scalar>(
    dst: &mut [T],
    g: &[T],
    (b, bc, cols, start, overwrite): (&[T], Broadcast, usize, usize, bool),
    f: impl Fn(T, T) -> T,
) {
    if overwrite {
        broadcast_zip(dst, g, b, bc, cols, start, f);
    } else {
        let mut terms = [T::zero(); GRAD_BLOCK];
        let terms = &mut terms[..dst.len()];
        broadcast_zip(terms, g, b, bc, cols, start, f);
        for (d, &x) in dst.iter_mut().zip(terms.iter()) {
            *d += x;
        }
    }
}

/// [`broadcast_zip`] over consecutive parts of `out` (rayon or work
/// sharing above the threshold), with `f` chosen by `kind` once per part.
fn binary_into<T: Scalar>(
    out: &mut [T],
    a: &[T],
    b: &[T],
    kind: BinaryKind,
    bc: Broadcast,
    cols: usize,
) {
    map_parts(out, |start, part| {
        let a = &a[start..start + part.len()];
        match kind {
            BinaryKind::Add => broadcast_zip(part, a, b, bc, cols, start, |x, y| x + y),
            BinaryKind::Sub => broadcast_zip(part, a, b, bc, cols, start, |x, y| x - y),
            BinaryKind::Mul => broadcast_zip(part, a, b, bc, cols, start, |x, y| x * y),
            BinaryKind::Div => broadcast_zip(part, a, b, bc, cols, start, |x, y| x / y),
        }
    });
}

/// The node of a binary op's output (`a`'s shape, domain and freshness,
/// the broadcast `b`'s freshness when it has Atom rows).
fn binary_spec<T: Scalar>(
    name: &str,
    (rows, cols): (usize, usize),
    na: &crate::graph::Node<T>,
    nb: &crate::graph::Node<T>,
    bc: Broadcast,
) -> NodeSpec {
    let b_fresh = nb.domain != RowDomain::Atom
        || nb.fresh
        || bc != Broadcast::Full && bc != Broadcast::PerRow;
    NodeSpec {
        op: name.to_string(),
        rows,
        cols,
        domain: na.domain,
        fresh: na.fresh && b_fresh,
        replicated: na.replicated && nb.replicated,
    }
}

impl Broadcast {
    fn on_device(self) -> DeviceBroadcast {
        match self {
            Broadcast::Full => DeviceBroadcast::Full,
            Broadcast::PerRow => DeviceBroadcast::PerRow,
            Broadcast::PerCol => DeviceBroadcast::PerCol,
            Broadcast::Scalar => DeviceBroadcast::Scalar,
        }
    }
}

impl BinaryKind {
    /// The device kernel of this op, when it has one (a quotient runs on
    /// the host).
    fn on_device(self) -> Option<DeviceBinary> {
        match self {
            BinaryKind::Add => Some(DeviceBinary::Add),
            BinaryKind::Sub => Some(DeviceBinary::Sub),
            BinaryKind::Mul => Some(DeviceBinary::Mul),
            BinaryKind::Div => None,
        }
    }
}

impl<T: Scalar> Graph<T> {
    /// Applies an element-wise function.
    pub fn unary(&mut self, x: Tensor, f: Unary) -> Result<Tensor, EngineError> {
        if let Some(backend) = self.device_for_op() {
            return self.unary_device(backend, x, f);
        }
        self.ensure_host(&[x])?;
        self.check_live(&[x])?;
        let (rows, cols) = self.shape(x);
        let n = &self.nodes[x.id];
        let xs = &n.value;
        let mut out = self.pool.for_overwrite(xs.len());
        map_parts(&mut out, |start, part| {
            f.apply_slice(&xs[start..start + part.len()], part)
        });
        let spec = NodeSpec {
            op: f.name().to_string(),
            rows,
            cols,
            domain: n.domain,
            fresh: n.fresh,
            replicated: n.replicated,
        };
        let out_id = crate::Tensor {
            id: self.nodes.len(),
        };
        let (reads_x, reads_y) = f.derivative_reads();
        let reads: Vec<Tensor> = [(reads_x, x), (reads_y, out_id)]
            .into_iter()
            .filter(|&(r, _)| r)
            .map(|(_, t)| t)
            .collect();
        self.push_op_reading(
            spec,
            out,
            &[x],
            &[],
            None,
            Box::new(move |ctx, g| {
                if !ctx.wants(x) {
                    return Ok(());
                }
                // A value the derivative does not read may be released:
                // the gradient (same length) stands in for it, unread.
                let xs = if reads_x { ctx.value(x) } else { g };
                let ys = if reads_y { ctx.value(out_id) } else { g };
                const BLOCK: usize = 1 << 12;
                ctx.accumulate_blocks(
                    x,
                    BLOCK,
                    || (),
                    |_, b, dst, overwrite| {
                        let r = b * BLOCK..b * BLOCK + dst.len();
                        if overwrite {
                            dst.fill(T::zero());
                        }
                        f.accumulate_derivative_slice(&xs[r.clone()], &ys[r.clone()], &g[r], dst);
                    },
                );
                Ok(())
            }),
            &reads,
        )
    }

    /// x·σ(x)
    pub fn silu(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        self.unary(x, Unary::Silu)
    }

    /// tanh(x)
    pub fn tanh(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        self.unary(x, Unary::Tanh)
    }

    /// σ(x)
    pub fn sigmoid(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        self.unary(x, Unary::Sigmoid)
    }

    /// ln(½eˣ + ½)
    pub fn shifted_softplus(&mut self, x: Tensor) -> Result<Tensor, EngineError> {
        self.unary(x, Unary::ShiftedSoftplus)
    }

    /// c·x
    pub fn scale(&mut self, x: Tensor, c: f64) -> Result<Tensor, EngineError> {
        self.unary(x, Unary::Scale(c))
    }

    fn binary(&mut self, a: Tensor, b: Tensor, kind: BinaryKind) -> Result<Tensor, EngineError> {
        let name = match kind {
            BinaryKind::Add => "add",
            BinaryKind::Sub => "sub",
            BinaryKind::Mul => "mul",
            BinaryKind::Div => "div",
        };
        self.check_live(&[a, b])?;
        let (ra, ca) = self.shape(a);
        let (rb, cb) = self.shape(b);
        let bc = if (rb, cb) == (ra, ca) {
            Broadcast::Full
        } else if (rb, cb) == (ra, 1) {
            Broadcast::PerRow
        } else if (rb, cb) == (1, ca) {
            Broadcast::PerCol
        } else if (rb, cb) == (1, 1) {
            Broadcast::Scalar
        } else {
            return Err(EngineError::shape(
                name,
                format!("cannot broadcast {rb}×{cb} against {ra}×{ca}"),
            ));
        };
        if let (Some(backend), Some(kind)) = (self.device_for_op(), kind.on_device()) {
            let (na, nb) = (&self.nodes[a.id], &self.nodes[b.id]);
            let spec = binary_spec(name, (ra, ca), na, nb, bc);
            return self.binary_device(backend, (a, b), kind, bc.on_device(), spec);
        }
        self.ensure_host(&[a, b])?;
        let na = &self.nodes[a.id];
        let nb = &self.nodes[b.id];
        let (av, bv) = (&na.value, &nb.value);
        let bidx = move |i: usize| -> usize {
            match bc {
                Broadcast::Full => i,
                Broadcast::PerRow => i / ca.max(1),
                Broadcast::PerCol => i % ca.max(1),
                Broadcast::Scalar => 0,
            }
        };
        let mut out = self.pool.for_overwrite(av.len());
        binary_into(&mut out, av, bv, kind, bc, ca);
        let spec = binary_spec(name, (ra, ca), na, nb, bc);
        // What the partials read: a sum none; a product each factor for
        // the other's gradient; a quotient the divisor for both, the
        // dividend for the divisor's.
        let (wants_a, wants_b) = (na.requires_grad, nb.requires_grad);
        let reads_a = wants_b && matches!(kind, BinaryKind::Mul | BinaryKind::Div);
        let reads_b = match kind {
            BinaryKind::Add | BinaryKind::Sub => false,
            BinaryKind::Mul => wants_a,
            BinaryKind::Div => wants_a || wants_b,
        };
        let reads: Vec<Tensor> = [(reads_a, a), (reads_b, b)]
            .into_iter()
            .filter(|&(r, _)| r)
            .map(|(_, t)| t)
            .collect();
        self.push_op_reading(
            spec,
            out,
            &[a, b],
            &[],
            None,
            Box::new(move |ctx, g| {
                let av = if reads_a { ctx.value(a) } else { &[] };
                let bv = if reads_b { ctx.value(b) } else { &[] };
                if ctx.wants(a) {
                    // g, g·b or g/b, broadcast as in the forward, block by
                    // block with the op chosen once per block.
                    ctx.accumulate_blocks(
                        a,
                        GRAD_BLOCK,
                        || (),
                        |_, blk, dst, overwrite| {
                            let start = blk * GRAD_BLOCK;
                            let gs = &g[start..start + dst.len()];
                            let at = (bv, bc, ca, start, overwrite);
                            match kind {
                                BinaryKind::Add | BinaryKind::Sub => {
                                    if overwrite {
                                        dst.copy_from_slice(gs);
                                    } else {
                                        for (d, &x) in dst.iter_mut().zip(gs) {
                                            *d += x;
                                        }
                                    }
                                }
                                BinaryKind::Mul => grad_block(dst, gs, at, |x, y| x * y),
                                BinaryKind::Div => grad_block(dst, gs, at, |x, y| x / y),
                            }
                        },
                    );
                }
                if ctx.wants(b) {
                    let contrib = |i: usize| -> T {
                        match kind {
                            BinaryKind::Add => g[i],
                            BinaryKind::Sub => -g[i],
                            BinaryKind::Mul => g[i] * av[i],
                            BinaryKind::Div => {
                                let y = bv[bidx(i)];
                                -g[i] * av[i] / (y * y)
                            }
                        }
                    };
                    match bc {
                        // g, −g or g·a block by block (the op chosen once per
                        // block); a quotient's divisor one element at a time.
                        Broadcast::Full if kind != BinaryKind::Div => ctx.accumulate_blocks(
                            b,
                            GRAD_BLOCK,
                            || (),
                            |_, blk, dst, overwrite| {
                                let start = blk * GRAD_BLOCK;
                                let gs = &g[start..start + dst.len()];
                                // `y` unused: g itself stands in for b.
                                let at = (gs, Broadcast::Full, 1, 0, overwrite);
                                match kind {
                                    BinaryKind::Add => grad_block(dst, gs, at, |x, _| x),
                                    BinaryKind::Sub => grad_block(dst, gs, at, |x, _| -x),
                                    _ => {
                                        let avs = &av[start..start + dst.len()];
                                        let at = (avs, Broadcast::Full, 1, 0, overwrite);
                                        grad_block(dst, gs, at, |x, y| x * y)
                                    }
                                }
                            },
                        ),
                        Broadcast::Full => ctx.accumulate_map(b, contrib),
                        Broadcast::PerRow => {
                            // Each row's terms summed in order, the op fixed
                            // outside the row's loop.
                            let c = ca.max(1);
                            let row = |r: usize| r * c..(r + 1) * c;
                            match kind {
                                BinaryKind::Add => {
                                    ctx.accumulate_map(b, |r| g[row(r)].iter().copied().sum())
                                }
                                BinaryKind::Sub => {
                                    ctx.accumulate_map(b, |r| g[row(r)].iter().map(|&x| -x).sum())
                                }
                                BinaryKind::Mul => ctx.accumulate_map(b, |r| {
                                    let (gr, ar) = (&g[row(r)], &av[row(r)]);
                                    gr.iter().zip(ar).map(|(&x, &y)| x * y).sum()
                                }),
                                BinaryKind::Div => ctx.accumulate_map(b, |r| {
                                    (0..c).map(|k| contrib(r * c + k)).sum()
                                }),
                            }
                        }
                        Broadcast::PerCol | Broadcast::Scalar => {
                            let mut gb = vec![T::zero(); rb * cb];
                            for i in 0..g.len() {
                                gb[bidx(i)] += contrib(i);
                            }
                            ctx.accumulate(b, gb);
                        }
                    }
                }
                Ok(())
            }),
            &reads,
        )
    }

    /// a + b (b may be rows×1, 1×cols or 1×1 and broadcasts).
    pub fn add(&mut self, a: Tensor, b: Tensor) -> Result<Tensor, EngineError> {
        self.binary(a, b, BinaryKind::Add)
    }

    /// a − b (broadcasting as in [`Graph::add`]).
    pub fn sub(&mut self, a: Tensor, b: Tensor) -> Result<Tensor, EngineError> {
        self.binary(a, b, BinaryKind::Sub)
    }

    /// a ⊙ b (broadcasting as in [`Graph::add`]).
    pub fn mul(&mut self, a: Tensor, b: Tensor) -> Result<Tensor, EngineError> {
        self.binary(a, b, BinaryKind::Mul)
    }

    /// a ⊘ b (broadcasting as in [`Graph::add`]).
    pub fn div(&mut self, a: Tensor, b: Tensor) -> Result<Tensor, EngineError> {
        self.binary(a, b, BinaryKind::Div)
    }
}
