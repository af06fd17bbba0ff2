//! Small periodic crystals for examples, tests and benchmarks, and the
//! seeded generator that rattles them reproducibly.
//!
//! ```
//! use ddmlip_atoms::build::{fcc, rattle_uniform};
//!
//! let mut cu = fcc(29, 3.615, 2); // 2×2×2 conventional cells of copper
//! assert_eq!(cu.len(), 32);
//! rattle_uniform(&mut cu, 0.05, 7);
//! assert!(cu.is_periodic());
//! ```

use crate::{Cell, System};

/// SplitMix64: a tiny, well-known generator; the same seed gives the same
/// numbers on every platform.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), 52 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// Standard normal (Box–Muller on two uniforms in (0, 1]; the sine
    /// branch is discarded).
    pub fn gaussian(&mut self) -> f64 {
        let u1 = 0.5 * (1.0 - self.uniform());
        let u2 = 0.5 * (1.0 + self.uniform());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Conventional FCC basis in fractional coordinates.
const FCC_BASIS: [[f64; 3]; 4] = [
    [0.0, 0.0, 0.0],
    [0.5, 0.5, 0.0],
    [0.5, 0.0, 0.5],
    [0.0, 0.5, 0.5],
];

/// The FCC basis in the order the diamond builder visits it.
const DIAMOND_FCC: [[f64; 3]; 4] = [
    [0.0, 0.0, 0.0],
    [0.0, 0.5, 0.5],
    [0.5, 0.0, 0.5],
    [0.5, 0.5, 0.0],
];

/// Lattice points of `n[0] × n[1] × n[2]` conventional cubic cells of side
/// `a` (Å): for every cell (i, j, k) in row-major order, every basis point
/// in order.
fn cubic_lattice(a: f64, n: [usize; 3], basis: &[[f64; 3]]) -> Vec<[f64; 3]> {
    let mut positions = Vec::with_capacity(basis.len() * n[0] * n[1] * n[2]);
    for i in 0..n[0] {
        for j in 0..n[1] {
            for k in 0..n[2] {
                for b in basis {
                    positions.push([
                        (i as f64 + b[0]) * a,
                        (j as f64 + b[1]) * a,
                        (k as f64 + b[2]) * a,
                    ]);
                }
            }
        }
    }
    positions
}

fn periodic_box(positions: Vec<[f64; 3]>, z: u32, a: f64, n: [usize; 3]) -> System {
    let numbers = vec![z; positions.len()];
    System::new(
        positions,
        numbers,
        Some(Cell::orthorhombic(
            n[0] as f64 * a,
            n[1] as f64 * a,
            n[2] as f64 * a,
        )),
        [true; 3],
    )
}

/// Element `z` on an FCC lattice: `n³` conventional cells of side `a` (Å),
/// `4·n³` atoms, periodic along all three axes, box side `n·a`.
pub fn fcc(z: u32, a: f64, n: usize) -> System {
    fcc_box(z, a, [n; 3])
}

/// Element `z` on an FCC lattice: `n[0] × n[1] × n[2]` conventional cells
/// of side `a` (Å), periodic along all three axes (an orthorhombic box).
pub fn fcc_box(z: u32, a: f64, n: [usize; 3]) -> System {
    periodic_box(cubic_lattice(a, n, &FCC_BASIS), z, a, n)
}

/// Element `z` on a diamond lattice: `n³` conventional cells of side `a`
/// (Å), `8·n³` atoms (each FCC point and its (¼,¼,¼) partner), periodic.
pub fn diamond(z: u32, a: f64, n: usize) -> System {
    let basis: Vec<[f64; 3]> = DIAMOND_FCC
        .iter()
        .flat_map(|b| [0.0, 0.25].map(|off| [b[0] + off, b[1] + off, b[2] + off]))
        .collect();
    periodic_box(cubic_lattice(a, [n; 3], &basis), z, a, [n; 3])
}

/// Displaces every coordinate by `amplitude · u`, `u` uniform in [-1, 1)
/// from [`SplitMix64::new(seed)`](SplitMix64::new), atom by atom, x y z.
pub fn rattle_uniform(sys: &mut System, amplitude: f64, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    for p in &mut sys.positions {
        for x in p.iter_mut() {
            *x += amplitude * rng.uniform();
        }
    }
}

/// Displaces every coordinate by a normal deviate of standard deviation
/// `sigma` (Å) from [`SplitMix64::new(seed)`](SplitMix64::new), like ASE's
/// `rattle(sigma)` though not the same random numbers.
pub fn rattle_gaussian(sys: &mut System, sigma: f64, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    for p in &mut sys.positions {
        for x in p.iter_mut() {
            *x += sigma * rng.gaussian();
        }
    }
}

/// The demo crystal: FCC copper (a = 3.615 Å), `n³` conventional cells,
/// every coordinate displaced uniformly by up to ±0.05 Å (seed 2024).
/// `ddmlip demo` evaluates it.
pub fn demo_copper(n: usize) -> System {
    let mut sys = fcc(29, 3.615, n);
    rattle_uniform(&mut sys, 0.05, 2024);
    sys
}

/// Diamond silicon (a = 5.43 Å), `n³` conventional cells, every coordinate
/// displaced by a normal deviate of 0.05 Å (seed 12345). `ddmlip bench
/// model --crystal si` evaluates it.
pub fn rattled_silicon(n: usize) -> System {
    let mut sys = diamond(14, 5.43, n);
    rattle_gaussian(&mut sys, 0.05, 12345);
    sys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fcc_nearest_neighbours_are_a_over_root_two() {
        let sys = fcc(29, 3.615, 2);
        let want = 3.615 / 2f64.sqrt();
        // Every atom of a perfect FCC crystal has 12 neighbours at a/√2.
        for i in 0..sys.len() {
            let mut close = 0;
            for j in 0..sys.len() {
                for s in 0..27 {
                    let shift = [
                        (s / 9) as f64 - 1.0,
                        ((s / 3) % 3) as f64 - 1.0,
                        (s % 3) as f64 - 1.0,
                    ];
                    let d: f64 = (0..3)
                        .map(|k| sys.positions[j][k] + shift[k] * 7.23 - sys.positions[i][k])
                        .map(|x| x * x)
                        .sum::<f64>()
                        .sqrt();
                    if (d - want).abs() < 1e-9 {
                        close += 1;
                    }
                }
            }
            assert_eq!(close, 12, "atom {i}");
        }
    }

    #[test]
    fn diamond_has_eight_atoms_per_cell_and_bonds_of_a_root_three_over_four() {
        let sys = diamond(14, 5.43, 1);
        assert_eq!(sys.len(), 8);
        let bond = 5.43 * 3f64.sqrt() / 4.0;
        let d = |i: usize, j: usize| -> f64 {
            (0..3)
                .map(|k| sys.positions[i][k] - sys.positions[j][k])
                .map(|x| x * x)
                .sum::<f64>()
                .sqrt()
        };
        // Each FCC point and its (¼,¼,¼) partner are bonded.
        for p in 0..4 {
            assert!((d(2 * p, 2 * p + 1) - bond).abs() < 1e-12);
        }
    }

    #[test]
    fn rattles_have_the_requested_spread() {
        let mut sys = fcc(29, 3.615, 6);
        let before = sys.positions.clone();
        rattle_gaussian(&mut sys, 0.05, 1);
        let d: Vec<f64> = sys
            .positions
            .iter()
            .flatten()
            .zip(before.iter().flatten())
            .map(|(a, b)| a - b)
            .collect();
        let n = d.len() as f64;
        let mean = d.iter().sum::<f64>() / n;
        let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 0.005, "mean {mean}");
        assert!((sd - 0.05).abs() < 0.005, "sd {sd}");
        let mut sys = fcc(29, 3.615, 6);
        rattle_uniform(&mut sys, 0.05, 1);
        let worst = sys
            .positions
            .iter()
            .flatten()
            .zip(before.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 0.05 && worst > 0.045, "{worst}");
    }

    #[test]
    fn same_seed_same_numbers() {
        let (mut a, mut b) = (SplitMix64::new(9), SplitMix64::new(9));
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(
            SplitMix64::new(9).next_u64(),
            SplitMix64::new(10).next_u64()
        );
    }

    #[test]
    fn rattled_silicon_has_the_diamond_shells() {
        // Ideal diamond with a = 5.43 Å: 4 neighbours at a·√3/4 = 2.351 Å,
        // then 12 at a/√2 = 3.840 Å; the rattle (σ = 0.05 Å per coordinate)
        // moves distances by a few σ at most.
        let n = 3;
        let sys = rattled_silicon(n);
        assert_eq!(sys.len(), 8 * n * n * n);
        assert!(sys.numbers.iter().all(|&z| z == 14));
        let len = 5.43 * n as f64;
        let mut counts = [0usize; 2];
        for (i, p) in sys.positions.iter().enumerate() {
            for (j, q) in sys.positions.iter().enumerate() {
                if i == j {
                    continue;
                }
                let mut d2 = 0.0;
                for ax in 0..3 {
                    let mut d = q[ax] - p[ax];
                    d -= len * (d / len).round();
                    d2 += d * d;
                }
                let d = d2.sqrt();
                if d < 3.0 {
                    counts[0] += 1;
                    assert!((d - 5.43 * 3f64.sqrt() / 4.0).abs() < 0.4, "d = {d}");
                } else if d < 4.2 {
                    counts[1] += 1;
                }
            }
        }
        assert_eq!(counts[0], 4 * sys.len());
        assert_eq!(counts[1], 12 * sys.len());
    }
}
