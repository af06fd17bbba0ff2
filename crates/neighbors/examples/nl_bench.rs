//! Neighbour-list benchmark: writes each input system as extended XYZ (so
//! `bench/neighbors/compare_vesin.py` times vesin on the very same numbers),
//! then times `neighbor_list` (full and half lists, cutoff 5 Å) on 1 and 2
//! threads, with a fresh list per call and with a reused list
//! (`neighbor_list_into`). Each call is timed by the wall clock and by the
//! CPU time of the whole process (all threads), which a machine shared with
//! other jobs inflates far less than the wall clock.
//!
//! Usage: `cargo run --release -p ddmlip-neighbors --example nl_bench -- OUT_DIR [RUNS] [NAME_FILTER]`
//! Writes `OUT_DIR/<system>.xyz` and `OUT_DIR/ddmlip_times.tsv`.

use ddmlip_atoms::Cell;
use ddmlip_neighbors::{neighbor_list, neighbor_list_into, NeighborList, NeighborOptions};
use std::fmt::Write as _;
use std::time::Instant;

const CUTOFF: f64 = 5.0;
const CU_A: f64 = 3.615;
/// Liquid copper near melting: 8.0 g/cm³ → 0.0758 atoms/Å³.
const LIQUID_DENSITY: f64 = 8.0 / 63.546 * 0.602_214_076;

/// SplitMix64, so the liquid is reproducible without an RNG crate.
struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Input {
    name: String,
    cell: [[f64; 3]; 3],
    positions: Vec<[f64; 3]>,
}

fn fcc(repeats: usize) -> Input {
    let basis = [
        [0.0, 0.0, 0.0],
        [0.0, 0.5, 0.5],
        [0.5, 0.0, 0.5],
        [0.5, 0.5, 0.0],
    ];
    let mut positions = Vec::new();
    for x in 0..repeats {
        for y in 0..repeats {
            for z in 0..repeats {
                for b in &basis {
                    positions.push([
                        (x as f64 + b[0]) * CU_A,
                        (y as f64 + b[1]) * CU_A,
                        (z as f64 + b[2]) * CU_A,
                    ]);
                }
            }
        }
    }
    let l = CU_A * repeats as f64;
    Input {
        name: format!("fcc_cu_{repeats}x{repeats}x{repeats}"),
        cell: [[l, 0.0, 0.0], [0.0, l, 0.0], [0.0, 0.0, l]],
        positions,
    }
}

fn liquid(n: usize, seed: u64) -> Input {
    let l = (n as f64 / LIQUID_DENSITY).cbrt();
    let mut rng = Rng(seed);
    let positions = (0..n)
        .map(|_| [l * rng.uniform(), l * rng.uniform(), l * rng.uniform()])
        .collect();
    Input {
        name: format!("liquid_cu_{}k", n / 1000),
        cell: [[l, 0.0, 0.0], [0.0, l, 0.0], [0.0, 0.0, l]],
        positions,
    }
}

/// Writes extended XYZ and replaces the in-memory numbers by the values the
/// file holds, so both programs see bit-identical input.
fn write_xyz(input: &mut Input, path: &std::path::Path) -> std::io::Result<()> {
    let fmt = |x: f64| format!("{x:.10}");
    let mut text = String::with_capacity(input.positions.len() * 64);
    let lattice: Vec<String> = input.cell.iter().flatten().map(|&x| fmt(x)).collect();
    let _ = writeln!(text, "{}", input.positions.len());
    let _ = writeln!(
        text,
        "Lattice=\"{}\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"",
        lattice.join(" ")
    );
    for p in &mut input.positions {
        let s: Vec<String> = p.iter().map(|&x| fmt(x)).collect();
        let _ = writeln!(text, "Cu {} {} {}", s[0], s[1], s[2]);
        for (x, s) in p.iter_mut().zip(&s) {
            *x = s.parse().unwrap_or(*x);
        }
    }
    for row in &mut input.cell {
        for x in row.iter_mut() {
            *x = fmt(*x).parse().unwrap_or(*x);
        }
    }
    std::fs::write(path, text)
}

/// CPU time consumed so far by all threads of this process (s).
fn process_cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    if rc == 0 {
        t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
    } else {
        f64::NAN
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let out_dir = std::path::PathBuf::from(args.get(1).map(String::as_str).unwrap_or("bench_out"));
    let runs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(7);
    std::fs::create_dir_all(&out_dir)?;
    let mut inputs = vec![fcc(10), fcc(20), fcc(40), liquid(30_000, 12345)];
    // Optional third argument: only systems whose name contains it (for profiling).
    if let Some(only) = args.get(3) {
        inputs.retain(|input| input.name.contains(only.as_str()));
    }

    let mut tsv =
        String::from("system\tatoms\tpairs\tkind\tmode\tthreads\tmedian_s\tmedian_cpu_s\n");
    println!(
        "{:<18} {:>8} {:>5} {:>10} {:>12} {:>12} {:>12} {:>12}",
        "system",
        "atoms",
        "kind",
        "pairs",
        "fresh 1t ms",
        "fresh 2t ms",
        "reuse 1t ms",
        "reuse 2t ms"
    );
    for input in &mut inputs {
        write_xyz(input, &out_dir.join(format!("{}.xyz", input.name)))?;
        let cell = Cell::new(input.cell);
        for kind in ["full", "half"] {
            let opts = NeighborOptions {
                cutoff: CUTOFF,
                half: kind == "half",
            };
            let mut row = Vec::new();
            let mut pairs = 0;
            // "fresh": a new list per call; "reuse": `neighbor_list_into` with one
            // list kept across calls, as an MD loop (and vesin's own buffers) would.
            for mode in ["fresh", "reuse"] {
                for threads in [1, 2] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()?;
                    let mut kept = NeighborList::default();
                    let mut times = Vec::with_capacity(runs + 1);
                    let mut cpu_times = Vec::with_capacity(runs + 1);
                    for _ in 0..runs + 1 {
                        let start = Instant::now();
                        let cpu_start = process_cpu_seconds();
                        if mode == "fresh" {
                            let list = pool.install(|| {
                                neighbor_list(&input.positions, Some(&cell), [true; 3], &opts)
                            })?;
                            times.push(start.elapsed().as_secs_f64());
                            cpu_times.push(process_cpu_seconds() - cpu_start);
                            pairs = list.len();
                        } else {
                            pool.install(|| {
                                neighbor_list_into(
                                    &input.positions,
                                    Some(&cell),
                                    [true; 3],
                                    &opts,
                                    &mut kept,
                                )
                            })?;
                            times.push(start.elapsed().as_secs_f64());
                            cpu_times.push(process_cpu_seconds() - cpu_start);
                            pairs = kept.len();
                        }
                    }
                    // The first call is a warm-up.
                    times.remove(0);
                    cpu_times.remove(0);
                    let t = median(times);
                    let _ = writeln!(
                        tsv,
                        "{}\t{}\t{}\t{}\t{}\t{}\t{:.6}\t{:.6}",
                        input.name,
                        input.positions.len(),
                        pairs,
                        kind,
                        mode,
                        threads,
                        t,
                        median(cpu_times)
                    );
                    row.push(t);
                }
            }
            println!(
                "{:<18} {:>8} {:>5} {:>10} {:>12.1} {:>12.1} {:>12.1} {:>12.1}",
                input.name,
                input.positions.len(),
                kind,
                pairs,
                row[0] * 1e3,
                row[1] * 1e3,
                row[2] * 1e3,
                row[3] * 1e3
            );
        }
    }
    std::fs::write(out_dir.join("ddmlip_times.tsv"), tsv)?;
    Ok(())
}
