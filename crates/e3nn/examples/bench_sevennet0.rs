//! Times SevenNet-0 forward + backward on the 960-atom NaCl fixture.
//!
//! Usage: `cargo run --release -p ddmlip-e3nn --example bench_sevennet0 -- [CHECKPOINT [FIXTURE_JSON]]`
//! (threads via `RAYON_NUM_THREADS`). Without an argument the checkpoint is
//! looked up like the fixture test does.

use ddmlip_e3nn::sevennet::{evaluate, types_from_numbers, SevenNet, SevenNetWeights, Timings};
use ddmlip_e3nn::Real;
use serde_json::Value;
use std::time::Instant;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/fixtures/sevennet0/sevennet0_public.json"
);

fn checkpoint_path() -> std::path::PathBuf {
    match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => ddmlip_checkpoint::find_sevennet_checkpoint()
            .expect("checkpoint (run scripts/fetch-sevennet.sh)"),
    }
}

fn bench<T: Real>(
    label: &str,
    w: &SevenNetWeights,
    types: &[usize],
    c: &[u32],
    nb: &[u32],
    vecs: &[[f64; 3]],
) {
    let model = SevenNet::<T>::new(w).expect("model");
    let v: Vec<[T; 3]> = vecs.iter().map(|x| x.map(T::from_f64)).collect();
    let _ = evaluate(&model, types, c, nb, &v).expect("warm-up");
    let reps = 3;
    let mut tm = Timings::default();
    let t0 = Instant::now();
    for _ in 0..reps {
        let ev = evaluate(&model, types, c, nb, &v).expect("evaluate");
        tm.edge_features += ev.timings.edge_features;
        tm.radial_mlp += ev.timings.radial_mlp;
        tm.conv += ev.timings.conv;
        tm.linear += ev.timings.linear;
        tm.other += ev.timings.other;
    }
    let per = t0.elapsed().as_secs_f64() / reps as f64;
    let n = types.len() as f64;
    let r = |x: f64| x / reps as f64 * 1e6 / n;
    println!(
        "{label}: {:.1} us/atom (total {:.3} s) | radial MLP {:.1}, TP conv {:.1}, linears {:.1}, edge features {:.1}, other {:.1} us/atom",
        per * 1e6 / n,
        per,
        r(tm.radial_mlp),
        r(tm.conv),
        r(tm.linear),
        r(tm.edge_features),
        r(tm.other)
    );
}

fn main() {
    let fixture = std::env::args()
        .nth(2)
        .unwrap_or_else(|| FIXTURE.to_string());
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).expect("fixture")).expect("json");
    let st = json["structures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "nacl_rocksalt_960")
        .expect("NaCl");
    let pos: Vec<[f64; 3]> = st["positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| [0, 1, 2].map(|k| r[k].as_f64().unwrap()))
        .collect();
    let cell: Vec<[f64; 3]> = st["cell"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| [0, 1, 2].map(|k| r[k].as_f64().unwrap()))
        .collect();
    let numbers: Vec<u32> = st["numbers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z.as_u64().unwrap() as u32)
        .collect();
    // Orthorhombic cell with every side > 2·cutoff: images −1..=1 suffice.
    let (mut c, mut nb, mut vecs) = (vec![], vec![], vec![]);
    for i in 0..pos.len() {
        for j in 0..pos.len() {
            for a in -1..=1 {
                for b in -1..=1 {
                    for cc in -1..=1 {
                        let r = [0, 1, 2].map(|k| {
                            pos[j][k]
                                + a as f64 * cell[0][k]
                                + b as f64 * cell[1][k]
                                + cc as f64 * cell[2][k]
                                - pos[i][k]
                        });
                        let d = (r[0] * r[0] + r[1] * r[1] + r[2] * r[2]).sqrt();
                        if d > 0.0 && d < 5.0 {
                            c.push(i as u32);
                            nb.push(j as u32);
                            vecs.push(r);
                        }
                    }
                }
            }
        }
    }
    println!(
        "NaCl: {} atoms, {} edges, {} threads",
        pos.len(),
        c.len(),
        rayon::current_num_threads()
    );
    let w = SevenNetWeights::from_checkpoint(checkpoint_path()).expect("weights");
    let types = types_from_numbers(&numbers).expect("types");
    bench::<f32>("f32", &w, &types, &c, &nb, &vecs);
    bench::<f64>("f64", &w, &types, &c, &nb, &vecs);
}
