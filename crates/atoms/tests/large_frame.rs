//! Throughput check on a million-atom frame (run with
//! `cargo test -p ddmlip-atoms --release --test large_frame -- --ignored --nocapture`).

use ddmlip_atoms::extxyz::{read_str, write_string};
use ddmlip_atoms::{Cell, System};
use std::time::Instant;

/// CPU time of this thread in seconds (Linux `schedstat`), so that the
/// numbers mean something on a loaded machine; `None` elsewhere.
fn thread_cpu_s() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some(ns * 1e-9)
}

/// Runs `f`, returning its result, wall seconds and thread CPU seconds.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (cpu0, wall0) = (thread_cpu_s(), Instant::now());
    let out = f();
    let wall = wall0.elapsed().as_secs_f64();
    let cpu = match (cpu0, thread_cpu_s()) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    (out, wall, cpu)
}

#[test]
#[ignore = "timing run; use --release"]
fn million_atom_frame_reads_quickly() {
    let n = 1_000_000;
    let mut system = System::new(
        (0..n)
            .map(|i| {
                [
                    i as f64 * 0.123456789,
                    (i % 997) as f64 * 1.1,
                    (i % 31) as f64 / 7.0,
                ]
            })
            .collect(),
        (0..n).map(|i| [1, 8, 14, 29][i % 4]).collect(),
        Some(Cell::orthorhombic(100.0, 100.0, 100.0)),
        [true; 3],
    );
    let positions_only = write_string(std::slice::from_ref(&system)).unwrap();
    let (frames, wall, cpu) = timed(|| read_str(&positions_only).unwrap());
    println!("{n} atoms, species + positions only: read {wall:.3} s wall, {cpu:.3} s CPU");
    assert_eq!(frames[0].positions, system.positions);

    system.set_forces(
        &(0..n)
            .map(|i| [i as f64 / 3.0, -0.5, 1e-3])
            .collect::<Vec<_>>(),
    );
    system.set_energy(-1.0);

    let (text, write_wall, write_cpu) =
        timed(|| write_string(std::slice::from_ref(&system)).unwrap());
    let (frames, read_wall, read_cpu) = timed(|| read_str(&text).unwrap());
    println!(
        "{n} atoms with forces, {} MB: write {write_wall:.3} s wall / {write_cpu:.3} s CPU, read {read_wall:.3} s wall / {read_cpu:.3} s CPU",
        text.len() / 1_000_000
    );
    assert_eq!(frames[0].positions, system.positions);
    assert_eq!(frames[0].forces(), system.forces());
}
