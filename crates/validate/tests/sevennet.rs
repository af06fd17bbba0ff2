//! SevenNet-0's convolutions are fused message-passing ops: `validate` must
//! count them as the Edge → Atom scatters they are and repair a wrong prior.
//! Needs the checkpoint (`bash scripts/fetch-sevennet.sh`, run by CI setup).

use ddmlip_atoms::{Cell, System};
use ddmlip_engine::DType;
use ddmlip_spec::{GatherMode, MLIPSpec, ScatterMode};
use ddmlip_validate::{trace_and_validate, StopReason, ValidateOptions};

/// Rock-salt NaCl, 3×2×2 conventional cells (96 atoms), slightly rattled.
fn nacl96() -> System {
    let a = 5.64;
    let (nx, ny, nz) = (3, 2, 2);
    let mut positions = Vec::new();
    let mut numbers = Vec::new();
    let mut k = 0u32;
    for i in 0..nx {
        for j in 0..ny {
            for l in 0..nz {
                for (b, z) in [
                    ([0.0, 0.0, 0.0], 11),
                    ([0.5, 0.5, 0.0], 11),
                    ([0.5, 0.0, 0.5], 11),
                    ([0.0, 0.5, 0.5], 11),
                    ([0.5, 0.0, 0.0], 17),
                    ([0.0, 0.5, 0.0], 17),
                    ([0.0, 0.0, 0.5], 17),
                    ([0.5, 0.5, 0.5], 17),
                ] {
                    k += 1;
                    let jitter = 0.04 * (((k * 7919) % 13) as f64 / 6.0 - 1.0);
                    positions.push([
                        (i as f64 + b[0]) * a + jitter,
                        (j as f64 + b[1]) * a - jitter,
                        (l as f64 + b[2]) * a + 0.5 * jitter,
                    ]);
                    numbers.push(z);
                }
            }
        }
    }
    System::new(
        positions,
        numbers,
        Some(Cell::orthorhombic(
            nx as f64 * a,
            ny as f64 * a,
            nz as f64 * a,
        )),
        [true; 3],
    )
}

#[test]
fn sevennet0_is_repaired_from_a_local_local_prior() {
    let model = ddmlip_models::load_model("sevennet-0")
        .expect("the SevenNet-0 checkpoint (bash scripts/fetch-sevennet.sh)");
    let mut prior = MLIPSpec::standard_energy_model();
    prior.policy.scatter = ScatterMode::Local;
    prior.policy.gather = GatherMode::Local;
    let options = ValidateOptions {
        ranks: 2,
        prior: Some(prior),
        ..ValidateOptions::for_dtype(DType::F64)
    };
    let r = trace_and_validate(model.as_ref(), &[nacl96()], &options).unwrap();
    assert!(r.ok, "{}", r.render());
    assert_eq!(r.stop_reason, StopReason::Passed);
    assert_eq!(r.spec.policy.scatter, ScatterMode::HaloCorrection);
    let fix = r.fix_applied.clone().unwrap();
    assert!(fix.contains("5 Edge → Atom scatter(s)"), "{fix}");
    // SevenNet-0 has 5 interaction layers: 5 hops of 5 Å.
    let field = r.diagnostics.receptive_field.clone().unwrap();
    assert_eq!((field.hops, field.edge_scatters), (5, 5), "{field:?}");
    assert!(!r.attempts[0].passed);
}
