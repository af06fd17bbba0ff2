//! [`Evaluator`]: repeated evaluations of one model that keep every rank's
//! memory, and the one-shot [`evaluate`].

use crate::inputs::check_batch;
use crate::rank::RankBuffers;
use crate::single::evaluate_single;
use crate::threads::evaluate_threads;
use crate::{EvalError, EvalOptions, EvalResult, MAX_THREAD_RANKS};
use ddmlip_atoms::System;
use ddmlip_engine::{DType, Model};

/// Runs the model and returns every output, forces and stress included.
/// For repeated evaluations (MD steps, benchmarks) keep an [`Evaluator`],
/// which reuses each rank's memory between calls.
pub fn evaluate(
    model: &dyn Model,
    batch: &[System],
    opts: &EvalOptions,
) -> Result<EvalResult, EvalError> {
    Evaluator::new(model, opts.clone()).evaluate(batch)
}

/// Evaluates one model with fixed options again and again, keeping every
/// rank's tensor memory from one call to the next: after the first call a
/// step faults in no fresh pages, which is what lets many ranks share one
/// machine. The memory held is about the peak of the last call
/// ([`Evaluator::held_bytes`]); drop the evaluator to return it.
pub struct Evaluator<'m> {
    model: &'m dyn Model,
    opts: EvalOptions,
    /// One entry per rank (index = rank).
    buffers: Vec<RankBuffers>,
}

impl<'m> Evaluator<'m> {
    /// An evaluator of `model` under `opts`; nothing is checked or allocated
    /// until the first [`Evaluator::evaluate`].
    pub fn new(model: &'m dyn Model, opts: EvalOptions) -> Self {
        Self {
            model,
            opts,
            buffers: Vec::new(),
        }
    }

    /// The options every call uses.
    pub fn options(&self) -> &EvalOptions {
        &self.opts
    }

    /// Large tensors that could not reuse kept memory, over all calls and
    /// ranks so far (see [`Buffers::fresh_allocations`](ddmlip_engine::Buffers::fresh_allocations)).
    pub fn fresh_allocations(&self) -> usize {
        self.buffers
            .iter()
            .map(|b| b.f32.fresh_allocations() + b.f64.fresh_allocations())
            .sum()
    }

    /// Bytes of tensor memory kept for the next call, over all ranks.
    pub fn held_bytes(&self) -> usize {
        self.buffers
            .iter()
            .map(|b| b.f32.bytes() + b.f64.bytes())
            .sum()
    }

    /// Runs the model on `batch`: see [`evaluate`].
    pub fn evaluate(&mut self, batch: &[System]) -> Result<EvalResult, EvalError> {
        let (model, opts) = (self.model, &self.opts);
        check_batch(model, batch)?;
        if opts.ranks == 0 {
            return Err(EvalError::Input("--ranks must be at least 1".into()));
        }
        if opts.ranks > MAX_THREAD_RANKS {
            return Err(EvalError::Input(format!(
                "--ranks {} is more than the threads backend runs ({MAX_THREAD_RANKS}: one OS thread per rank); use the MPI backend for more",
                opts.ranks
            )));
        }
        // One rank without a spec is the plain single-process run.
        let single = opts.ranks == 1 && opts.spec.is_none();
        self.buffers
            .resize_with(if single { 1 } else { opts.ranks }, RankBuffers::default);
        if single {
            let held = &mut self.buffers[0];
            return ddmlip_engine::on_pool_worker(|| match opts.dtype {
                DType::F64 => evaluate_single(model, batch, opts, &mut held.f64, &mut held.pairs),
                DType::F32 => evaluate_single(model, batch, opts, &mut held.f32, &mut held.pairs),
            });
        }
        evaluate_threads(model, batch, opts, &mut self.buffers)
    }
}
