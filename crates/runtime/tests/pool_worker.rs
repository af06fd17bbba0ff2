//! A single-process evaluation started from outside any rayon pool runs on
//! a worker of the global pool (its parallel loops then run in place
//! instead of waking the pool and putting the caller to sleep once per op),
//! and gives the same result as before.

use ddmlip_engine::{
    EngineError, Graph, Model, ModelInfo, ModelInputs, ModelOutputs, SpeciesSupport,
};
use ddmlip_runtime::{evaluate, EvalOptions};
use std::sync::Mutex;

/// A built-in model that notes which rayon worker (if any) ran its forward.
struct Watched {
    inner: Box<dyn Model>,
    seen: Mutex<Vec<Option<usize>>>,
}

impl Watched {
    fn note(&self) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(rayon::current_thread_index());
        }
    }
}

impl ModelInfo for Watched {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn description(&self) -> String {
        self.inner.description()
    }
    fn cutoff(&self) -> f64 {
        self.inner.cutoff()
    }
    fn species(&self) -> SpeciesSupport {
        self.inner.species()
    }
}

impl Model for Watched {
    fn forward_f64(
        &self,
        g: &mut Graph<f64>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        self.note();
        self.inner.forward_f64(g, inputs)
    }
    fn forward_f32(
        &self,
        g: &mut Graph<f32>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        self.note();
        self.inner.forward_f32(g, inputs)
    }
}

#[test]
fn a_single_process_evaluation_runs_on_a_pool_worker_with_the_same_result() {
    let crystal = ddmlip_atoms::build::demo_copper(3);
    let opts = EvalOptions::default();
    let watched = Watched {
        inner: ddmlip_models::load_model("lj").unwrap(),
        seen: Mutex::new(Vec::new()),
    };
    // The test's own thread is no rayon worker.
    assert_eq!(rayon::current_thread_index(), None);
    let got = evaluate(&watched, std::slice::from_ref(&crystal), &opts).unwrap();
    let seen = watched.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].is_some(), "the forward ran outside the pool");

    // Inside a pool the evaluation stays on the calling worker.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let (worker, inside) = pool.install(|| {
        let r = evaluate(&watched, std::slice::from_ref(&crystal), &opts).unwrap();
        (rayon::current_thread_index(), r)
    });
    assert_eq!(watched.seen.lock().unwrap()[1], worker);

    // The plain model, evaluated directly, gives the same numbers.
    let plain = ddmlip_models::load_model("lj").unwrap();
    let want = evaluate(plain.as_ref(), std::slice::from_ref(&crystal), &opts).unwrap();
    for r in [&got, &inside] {
        assert!(want.energy().is_some_and(|e| e[0] != 0.0));
        assert_eq!(r.energy(), want.energy());
        assert_eq!(r.forces(), want.forces());
        assert_eq!(r.stress(), want.stress());
    }
}
