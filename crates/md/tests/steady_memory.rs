//! A steady MD step (no rebuild) reuses the memory of the step before: the
//! heap does not grow, and no large block is allocated fresh (a fresh
//! block is mapped and faulted in page by page, which serialises thread
//! ranks on the process's memory map). Measured with a counting global
//! allocator over all threads of the run.

mod common;

use common::{argon_topology, fcc_argon};
use ddmlip_md::{maxwell_boltzmann, run_threads, Ensemble, MdConfig, MdSink, StartState};
use ddmlip_md::{Checkpoint, Frame, MdError, StepObserver, ThermoRow};
use ddmlip_models::load_model;
use ddmlip_testkit::peak_memory::{
    large_allocations, live_bytes, CountingAllocator, LARGE_ALLOCATION,
};
use std::sync::{Arc, Mutex};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// A sink that keeps nothing, so that the run's own memory is what is
/// measured.
struct Discard;

impl MdSink for Discard {
    fn thermo(&mut self, _: &ThermoRow) -> Result<(), MdError> {
        Ok(())
    }
    fn frame(&mut self, _: &Frame, _: bool) -> Result<(), MdError> {
        Ok(())
    }
    fn checkpoint(&mut self, _: &Checkpoint) -> Result<(), MdError> {
        Ok(())
    }
}

#[test]
fn a_steady_step_allocates_no_large_block_and_does_not_grow_the_heap() {
    // 4,000 argon atoms on 2 ranks: each rank's position and gradient
    // tensors (7,500 local rows × 3 × 8 bytes) and its per-edge arrays are
    // above the large-block size, while each halo message (at most ~3,500
    // ghost rows × 24 bytes) stays below it, so a large block in a steady
    // step can only be a per-atom or per-edge array made afresh.
    let (positions, cell) = fcc_argon(10, 5.3, 0.05);
    let topology = argon_topology(positions.len());
    let momenta = maxwell_boltzmann(&topology.masses, 40.0, 3);
    let start = StartState::fresh(cell, positions, momenta);
    let model = load_model("lj").expect("lj");
    let steps = 8;
    let mut config = MdConfig::new(Ensemble::Nve, 2.0, steps);
    config.skin = 1.0;
    // (step, live bytes, large allocations so far) after each step.
    let seen: Arc<Mutex<Vec<(u64, usize, usize)>>> = Arc::default();
    let record = Arc::clone(&seen);
    config.on_step = Some(StepObserver::new(move |p| {
        let sample = (p.done, live_bytes(), large_allocations());
        record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(sample);
    }));
    let summary = run_threads(model.as_ref(), &topology, &start, &config, 2, &mut Discard)
        .unwrap_or_else(|e| panic!("md failed: {e}"));
    assert_eq!(
        summary.rebuilds, 1,
        "the test needs steps without a rebuild"
    );
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(seen.len(), steps as usize);
    // The first two steps settle the recycled memory; from the third on
    // every step finds what it needs.
    let (_, live_3, large_3) = seen[2];
    let (_, live_end, large_end) = seen[steps as usize - 1];
    assert_eq!(
        large_end - large_3,
        0,
        "steps 4..={steps} allocated {} blocks of {LARGE_ALLOCATION} bytes or more",
        large_end - large_3
    );
    // Small bookkeeping (a step's reduction, message headers) comes and
    // goes; a per-atom array kept per step would add 48 kB or more.
    let growth = live_end.saturating_sub(live_3);
    assert!(
        growth < 16 << 10,
        "the heap grew by {growth} bytes over steps 4..={steps}: {seen:?}"
    );
    // The run itself did allocate large blocks (the first build), so the
    // counter sees this run's allocations.
    assert!(large_3 > 0, "no large allocation counted at all");
}
