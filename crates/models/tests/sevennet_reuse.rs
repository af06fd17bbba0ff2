//! SevenNet's convolution declares that it writes every element of its
//! message and of its gradients, so the engine hands it recycled buffers
//! without zeroing them. An evaluator that has just evaluated another
//! system (its buffers full of that system's values) must then give the
//! same bits as a fresh evaluation: any element the kernel left unwritten
//! would carry the other system's values into the result.

use ddmlip_atoms::build::{diamond, rattle_uniform};
use ddmlip_atoms::System;
use ddmlip_engine::DType;
use ddmlip_runtime::{evaluate, EvalOptions, EvalResult, Evaluator};

fn rattled(seed: u64) -> System {
    let mut s = diamond(14, 5.43, 2);
    rattle_uniform(&mut s, 0.15, seed);
    s
}

fn same_bits(a: &EvalResult, b: &EvalResult, what: &str) {
    for name in ["energy", "forces", "stress"] {
        let (x, y) = (&a.outputs[name], &b.outputs[name]);
        assert!(!y.values.is_empty(), "{what}: no {name}");
        assert_eq!(x, y, "{what}: {name}");
    }
}

#[test]
fn recycled_unzeroed_buffers_give_a_fresh_evaluations_bits() {
    ddmlip_testkit::sevennet_checkpoint();
    let model = ddmlip_models::load_model("sevennet-0").expect("load sevennet-0");
    let (first, second) = (vec![rattled(1)], vec![rattled(2)]);
    for dtype in [DType::F64, DType::F32] {
        for ranks in [1, 2] {
            let opts = EvalOptions {
                dtype,
                ranks,
                ..Default::default()
            };
            let fresh = evaluate(model.as_ref(), &second, &opts).expect("fresh evaluation");
            let mut ev = Evaluator::new(model.as_ref(), opts.clone());
            let other = ev.evaluate(&first).expect("first system");
            // The two systems differ, so stale values would show.
            assert_ne!(other.energy(), fresh.energy());
            let reused = ev.evaluate(&second).expect("second system");
            same_bits(&reused, &fresh, &format!("{dtype}, {ranks} ranks"));
        }
    }
}
