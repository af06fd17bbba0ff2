//! Fused element-wise expressions: a chain of unary and binary maps over
//! same-shaped tensors evaluated in one pass over memory.
//!
//! Per-edge chains (a pair potential's `r ↦ 4ε[(σ/r)¹² − (σ/r)⁶]`, cutoff
//! envelopes) are memory-bound when every step is its own op: each step
//! reads and writes a full per-edge array forward and again backward. A
//! [`Pointwise`] expression keeps the intermediates in registers of a small
//! block instead; its backward recomputes them per block and runs the
//! reverse sweep there, so only the inputs, the output and their gradients
//! touch memory.

use super::elementwise::{BinaryKind, Unary};
use super::PAR_THRESHOLD;
use crate::graph::NodeSpec;
use crate::{EngineError, Graph, Scalar, Tensor};
use rayon::prelude::*;

/// Elements evaluated together: the registers of one block (at most
/// [`Pointwise::MAX_STEPS`] × `BLOCK` values) stay in L1.
pub(crate) const BLOCK: usize = 64;

/// A value of a [`Pointwise`] expression under construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg(u16);

#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    Input(u16),
    Constant(f64),
    Unary(Unary, u16),
    Binary(BinaryKind, u16, u16),
}

/// A scalar function of `n_inputs` same-shaped tensors, written step by step
/// and applied element-wise by [`Graph::pointwise`]; the last step is the
/// result. Forward values are bit for bit those of the same steps as
/// separate ops; gradients agree to rounding.
#[derive(Clone, Debug)]
pub struct Pointwise {
    pub(crate) name: String,
    pub(crate) n_inputs: usize,
    pub(crate) steps: Vec<Step>,
}

impl Pointwise {
    /// Most steps (inputs included) an expression may have.
    pub const MAX_STEPS: usize = 48;

    /// An expression named `name` (shown in traces as `pointwise:<name>`)
    /// over `n_inputs` inputs, which are its first registers.
    pub fn new(name: &str, n_inputs: usize) -> Self {
        Self {
            name: name.to_string(),
            n_inputs,
            steps: (0..n_inputs).map(|k| Step::Input(k as u16)).collect(),
        }
    }

    /// Register of input `k` (`k < n_inputs`; otherwise a register that
    /// [`Graph::pointwise`] rejects).
    pub fn input(&self, k: usize) -> Reg {
        Reg(if k < self.n_inputs {
            k as u16
        } else {
            u16::MAX
        })
    }

    fn push(&mut self, s: Step) -> Reg {
        self.steps.push(s);
        Reg((self.steps.len() - 1).min(u16::MAX as usize) as u16)
    }

    /// The constant `c`.
    pub fn constant(&mut self, c: f64) -> Reg {
        self.push(Step::Constant(c))
    }

    /// `f(a)`.
    pub fn unary(&mut self, a: Reg, f: Unary) -> Reg {
        self.push(Step::Unary(f, a.0))
    }

    /// `a + b`.
    pub fn add(&mut self, a: Reg, b: Reg) -> Reg {
        self.push(Step::Binary(BinaryKind::Add, a.0, b.0))
    }

    /// `a − b`.
    pub fn sub(&mut self, a: Reg, b: Reg) -> Reg {
        self.push(Step::Binary(BinaryKind::Sub, a.0, b.0))
    }

    /// `a · b`.
    pub fn mul(&mut self, a: Reg, b: Reg) -> Reg {
        self.push(Step::Binary(BinaryKind::Mul, a.0, b.0))
    }

    /// `a / b`.
    pub fn div(&mut self, a: Reg, b: Reg) -> Reg {
        self.push(Step::Binary(BinaryKind::Div, a.0, b.0))
    }

    /// Checks the expression before it is applied: at least one input, at
    /// most [`Self::MAX_STEPS`] steps, every operand an earlier step.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.n_inputs == 0 {
            return Err("an expression needs at least one input".into());
        }
        if self.steps.len() > Self::MAX_STEPS {
            return Err(format!(
                "{} steps, more than the {} a fused expression holds",
                self.steps.len(),
                Self::MAX_STEPS
            ));
        }
        for (k, s) in self.steps.iter().enumerate() {
            let earlier = |r: u16| (r as usize) < k;
            let ok = match *s {
                Step::Input(j) => (j as usize) < self.n_inputs,
                Step::Constant(_) => true,
                Step::Unary(_, a) => earlier(a),
                Step::Binary(_, a, b) => earlier(a) && earlier(b),
            };
            if !ok {
                return Err(format!("step {k} reads a later or missing register"));
            }
        }
        Ok(())
    }

    /// Fills `regs[k][..len]` with step k's values at elements
    /// `start..start + len`.
    fn forward_block<T: Scalar>(
        &self,
        inputs: &[&[T]],
        start: usize,
        len: usize,
        regs: &mut [[T; BLOCK]],
    ) {
        for (k, step) in self.steps.iter().enumerate() {
            let (done, rest) = regs.split_at_mut(k);
            let dst = &mut rest[0][..len];
            match *step {
                Step::Input(j) => dst.copy_from_slice(&inputs[j as usize][start..start + len]),
                Step::Constant(c) => dst.fill(T::from_f64(c)),
                Step::Unary(f, a) => f.apply_slice(&done[a as usize][..len], dst),
                Step::Binary(kind, a, b) => {
                    let (xa, xb) = (&done[a as usize][..len], &done[b as usize][..len]);
                    for ((d, &x), &y) in dst.iter_mut().zip(xa).zip(xb) {
                        *d = kind.apply(x, y);
                    }
                }
            }
        }
    }

    /// Reverse sweep over one block whose forward registers are in `regs`:
    /// `adj[k]` ends as ∂(Σ g·out)/∂(step k); returns nothing, the caller
    /// reads the input steps' adjoints.
    fn backward_block<T: Scalar>(
        &self,
        g: &[T],
        len: usize,
        regs: &[[T; BLOCK]],
        adj: &mut [[T; BLOCK]],
    ) {
        let n = self.steps.len();
        for a in adj.iter_mut().take(n) {
            a[..len].fill(T::zero());
        }
        adj[n - 1][..len].copy_from_slice(g);
        let mut own = [T::zero(); BLOCK];
        for k in (0..n).rev() {
            own[..len].copy_from_slice(&adj[k][..len]);
            match self.steps[k] {
                Step::Input(_) | Step::Constant(_) => {}
                Step::Unary(f, a) => f.accumulate_derivative_slice(
                    &regs[a as usize][..len],
                    &regs[k][..len],
                    &own[..len],
                    &mut adj[a as usize][..len],
                ),
                Step::Binary(kind, a, b) => {
                    let (x, y) = (&regs[a as usize], &regs[b as usize]);
                    for e in 0..len {
                        let (ga, gb) = kind.partials(x[e], y[e]);
                        adj[a as usize][e] += own[e] * ga;
                        adj[b as usize][e] += own[e] * gb;
                    }
                }
            }
        }
    }
}

/// Registers of one block: one row of [`BLOCK`] values per step.
pub(crate) type Registers<T> = Vec<[T; BLOCK]>;

/// What one task needs for the gradient of an expression with respect to
/// one input: forward registers, their adjoints, and the steps that read
/// that input. Made once per task, not per block.
pub(crate) struct GradScratch<T> {
    regs: Registers<T>,
    adj: Registers<T>,
    input_steps: Vec<usize>,
}

impl Pointwise {
    /// Fresh registers for this expression.
    pub(crate) fn registers<T: Scalar>(&self) -> Registers<T> {
        vec![[T::zero(); BLOCK]; self.steps.len()]
    }

    /// Scratch for the gradient with respect to input `j`.
    pub(crate) fn grad_scratch<T: Scalar>(&self, j: usize) -> GradScratch<T> {
        GradScratch {
            regs: self.registers(),
            adj: self.registers(),
            input_steps: (0..self.steps.len())
                .filter(|&k| matches!(self.steps[k], Step::Input(i) if i as usize == j))
                .collect(),
        }
    }

    /// The result at the `x.len() ≤ BLOCK` elements of a one-input
    /// expression, as [`Graph::pointwise`] computes it.
    pub(crate) fn eval_one<'r, T: Scalar>(&self, x: &[T], regs: &'r mut Registers<T>) -> &'r [T] {
        let len = x.len();
        self.forward_block(&[x], 0, len, regs);
        &regs[self.steps.len() - 1][..len]
    }

    /// `dst[e] = g[e] · f'(x[e])` for a one-input expression (scratch from
    /// `grad_scratch(0)`), the values [`Graph::pointwise`]'s gradient gives.
    pub(crate) fn grad_one<T: Scalar>(
        &self,
        x: &[T],
        g: &[T],
        scratch: &mut GradScratch<T>,
        dst: &mut [T],
    ) {
        self.input_grads(&[x], 0, g, scratch, |e, v| dst[e] = v);
    }

    /// The gradient with respect to one input at elements `start..start +
    /// g.len()` of `inputs`, handed to `put(e, value)` element by element.
    fn input_grads<T: Scalar>(
        &self,
        inputs: &[&[T]],
        start: usize,
        g: &[T],
        scratch: &mut GradScratch<T>,
        mut put: impl FnMut(usize, T),
    ) {
        let len = g.len();
        let GradScratch {
            regs,
            adj,
            input_steps,
        } = scratch;
        self.forward_block(inputs, start, len, regs);
        self.backward_block(g, len, regs, adj);
        // The input's adjoint: the sum over the steps that read it.
        (0..len).for_each(|e| put(e, input_steps.iter().map(|&k| adj[k][e]).sum()));
    }
}

impl<T: Scalar> Graph<T> {
    /// Applies `expr` element by element to `inputs` (all the same shape);
    /// one op in the tape, one pass over memory forward and one per input
    /// backward. Values equal those of the same steps as separate ops.
    ///
    /// Errors: an expression with no input, more than
    /// [`Pointwise::MAX_STEPS`] steps or an operand that is not an earlier
    /// step; a number of inputs other than the expression's; inputs of
    /// different shapes.
    pub fn pointwise(
        &mut self,
        inputs: &[Tensor],
        expr: &Pointwise,
    ) -> Result<Tensor, EngineError> {
        self.ensure_host(inputs)?;
        let op = format!("pointwise:{}", expr.name);
        expr.check().map_err(|m| EngineError::shape(&op, m))?;
        if inputs.len() != expr.n_inputs {
            return Err(EngineError::shape(
                &op,
                format!(
                    "expression takes {} inputs, got {}",
                    expr.n_inputs,
                    inputs.len()
                ),
            ));
        }
        let (rows, cols) = self.shape(inputs[0]);
        for &t in &inputs[1..] {
            let s = self.shape(t);
            if s != (rows, cols) {
                return Err(EngineError::shape(
                    &op,
                    format!("inputs are {rows}×{cols} and {}×{}", s.0, s.1),
                ));
            }
        }
        let n_steps = expr.steps.len();
        let mut out = self.pool.for_overwrite(rows * cols);
        {
            let values: Vec<&[T]> = inputs
                .iter()
                .map(|t| self.nodes[t.id].value.as_slice())
                .collect();
            let block = |regs: &mut Registers<T>, (b, dst): (usize, &mut [T])| {
                expr.forward_block(&values, b * BLOCK, dst.len(), regs);
                dst.copy_from_slice(&regs[n_steps - 1][..dst.len()]);
            };
            let init = || expr.registers();
            if out.len() >= PAR_THRESHOLD {
                out.par_chunks_mut(BLOCK)
                    .enumerate()
                    .for_each_init(init, block);
            } else {
                let mut regs = init();
                out.chunks_mut(BLOCK)
                    .enumerate()
                    .for_each(|c| block(&mut regs, c));
            }
        }
        let first = &self.nodes[inputs[0].id];
        let spec = NodeSpec {
            op,
            rows,
            cols,
            domain: first.domain,
            fresh: inputs.iter().all(|t| self.nodes[t.id].fresh),
            replicated: inputs.iter().all(|t| self.nodes[t.id].replicated),
        };
        let ins = inputs.to_vec();
        let expr = expr.clone();
        self.push_op(
            spec,
            out,
            inputs,
            &[],
            None,
            Box::new(move |ctx, g| {
                let values: Vec<&[T]> = ins.iter().map(|&t| ctx.value(t)).collect();
                for (j, &t) in ins.iter().enumerate() {
                    if !ctx.wants(t) {
                        continue;
                    }
                    let init = || expr.grad_scratch(j);
                    ctx.accumulate_blocks(t, BLOCK, init, |scratch, b, dst, overwrite| {
                        let start = b * BLOCK;
                        let g = &g[start..start + dst.len()];
                        expr.input_grads(&values, start, g, scratch, |e, v| {
                            if overwrite {
                                dst[e] = v;
                            } else {
                                dst[e] += v;
                            }
                        });
                    });
                }
                Ok(())
            }),
        )
    }
}
