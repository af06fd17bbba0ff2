//! Pair-list benchmark for the runtime's search path: one thread, cutoff
//! 10.2 Å (the built-in `lj`), on a periodic FCC Cu crystal of `N³`
//! conventional cells and on the local problem one of 16 ranks (4×2×2) sees
//! (its owned atoms as centres, ghosts within the cutoff as neighbours).
//!
//! Usage: `cargo run --release -p ddmlip-neighbors --example pair_bench -- [N] [RUNS]`

use ddmlip_atoms::Cell;
use ddmlip_neighbors::{pair_list_for_centers_into, NeighborOptions, PairList, PairScratch};
use std::time::Instant;
const A: f64 = 3.615;
fn rng(s: &mut u64) -> f64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}
fn fcc(n: usize) -> Vec<[f64; 3]> {
    let b = [
        [0.0, 0.0, 0.0],
        [0.0, 0.5, 0.5],
        [0.5, 0.0, 0.5],
        [0.5, 0.5, 0.0],
    ];
    let mut s = 7u64;
    let mut p = Vec::new();
    for x in 0..n {
        for y in 0..n {
            for z in 0..n {
                for q in &b {
                    p.push([
                        (x as f64 + q[0]) * A + 0.05 * (rng(&mut s) - 0.5),
                        (y as f64 + q[1]) * A + 0.05 * (rng(&mut s) - 0.5),
                        (z as f64 + q[2]) * A + 0.05 * (rng(&mut s) - 0.5),
                    ]);
                }
            }
        }
    }
    p
}
fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(37);
    let runs: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let cutoff = 10.2;
    let opts = NeighborOptions {
        cutoff,
        half: false,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let pos = fcc(n);
    let l = A * n as f64;
    let cell = Cell::new([[l, 0.0, 0.0], [0.0, l, 0.0], [0.0, 0.0, l]]);
    // Local problem of one of 16 ranks (4x2x2): owned box, then ghosts within cutoff (periodic images).
    let hi = [l / 4.0, l / 2.0, l / 2.0];
    let mut owned = Vec::new();
    let mut ghosts = Vec::new();
    for p in &pos {
        for sx in -1..=1 {
            for sy in -1..=1 {
                for sz in -1..=1 {
                    let q = [
                        p[0] + sx as f64 * l,
                        p[1] + sy as f64 * l,
                        p[2] + sz as f64 * l,
                    ];
                    let inside = (0..3).all(|k| q[k] >= 0.0 && q[k] < hi[k]);
                    let near = (0..3).all(|k| q[k] >= -cutoff && q[k] < hi[k] + cutoff);
                    if inside && sx == 0 && sy == 0 && sz == 0 {
                        owned.push(q)
                    } else if near && !inside {
                        ghosts.push(q)
                    }
                }
            }
        }
    }
    let n_owned = owned.len();
    let mut local = owned;
    local.extend(ghosts);
    for (name, positions, cell, pbc, centers) in [
        ("periodic", &pos, Some(&cell), [true; 3], pos.len()),
        ("local", &local, None, [false; 3], n_owned),
    ] {
        let mut scratch = PairScratch::default();
        let mut out = PairList::default();
        let mut times = Vec::new();
        for _ in 0..runs + 1 {
            let t = Instant::now();
            pool.install(|| {
                pair_list_for_centers_into(
                    positions,
                    cell,
                    pbc,
                    &opts,
                    centers,
                    &mut scratch,
                    &mut out,
                )
            })
            .unwrap();
            times.push(t.elapsed().as_secs_f64());
        }
        times.remove(0);
        times.sort_by(f64::total_cmp);
        let t = times[times.len() / 2];
        println!(
            "{name}: atoms {} centres {} pairs {} ({:.1}/centre): {:.4} s, {:.2} ns/pair",
            positions.len(),
            centers,
            out.len(),
            out.len() as f64 / centers as f64,
            t,
            t / out.len() as f64 * 1e9
        );
    }
}
