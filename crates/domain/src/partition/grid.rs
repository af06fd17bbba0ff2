//! Choice of the 3-D rank grid.

/// Factorises `n_ranks` into a 3-D grid `[n_a, n_b, n_c]` (product = `n_ranks`)
/// that minimises the total halo interface area.
///
/// `widths[k]` is the width (Å) of the region being split along axis normal
/// `k`: the cell height for a periodic axis, the extent of the atoms' bounding
/// box for a non-periodic one. A periodic axis split `n_k > 1` ways has `n_k`
/// interfaces, a non-periodic one `n_k − 1`; each interface has the area of
/// the product of the two other widths. Ties are broken towards the smallest
/// largest domain extent (compact domains), then towards splitting earlier
/// axes. `n_ranks == 0` is treated as 1. Non-finite or negative widths count
/// as zero.
pub fn choose_grid(widths: [f64; 3], periodic: [bool; 3], n_ranks: usize) -> [usize; 3] {
    let n = n_ranks.max(1);
    let widths = widths.map(|w| if w.is_finite() && w > 0.0 { w } else { 0.0 });
    let mut best: Option<([usize; 3], f64, f64)> = None;
    for a in (1..=n).rev().filter(|a| n % a == 0) {
        let rest = n / a;
        for b in (1..=rest).rev().filter(|b| rest % b == 0) {
            let grid = [a, b, rest / b];
            let cost = interface_area(widths, periodic, grid);
            let largest = (0..3)
                .map(|k| widths[k] / grid[k] as f64)
                .fold(0.0_f64, f64::max);
            let better = match best {
                None => true,
                Some((_, best_cost, best_largest)) => {
                    let tol = 1e-12 * cost.abs().max(best_cost.abs());
                    if cost < best_cost - tol {
                        true
                    } else if cost <= best_cost + tol {
                        largest < best_largest * (1.0 - 1e-12)
                    } else {
                        false
                    }
                }
            };
            if better {
                best = Some((grid, cost, largest));
            }
        }
    }
    best.map_or([n, 1, 1], |(grid, _, _)| grid)
}

/// Total area (Å²) of the internal interfaces of `grid` over a box of `widths`.
fn interface_area(widths: [f64; 3], periodic: [bool; 3], grid: [usize; 3]) -> f64 {
    (0..3)
        .map(|k| {
            let interfaces = if grid[k] <= 1 {
                0
            } else if periodic[k] {
                grid[k]
            } else {
                grid[k] - 1
            };
            interfaces as f64 * widths[(k + 1) % 3] * widths[(k + 2) % 3]
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent brute force: every ordered triple, minimal interface area
    /// computed directly from the definition.
    fn brute_force_min_area(widths: [f64; 3], periodic: [bool; 3], n: usize) -> f64 {
        let mut best = f64::INFINITY;
        for a in 1..=n {
            for b in 1..=n {
                for c in 1..=n {
                    if a * b * c != n {
                        continue;
                    }
                    let mut area = 0.0;
                    for (k, &nk) in [a, b, c].iter().enumerate() {
                        if nk > 1 {
                            let cuts = if periodic[k] { nk } else { nk - 1 };
                            area += cuts as f64 * widths[(k + 1) % 3] * widths[(k + 2) % 3];
                        }
                    }
                    best = best.min(area);
                }
            }
        }
        best
    }

    #[test]
    fn grid_multiplies_to_n_and_is_optimal() {
        let cases = [
            ([10.0, 10.0, 10.0], [true; 3]),
            ([40.0, 10.0, 10.0], [true; 3]),
            ([10.0, 25.0, 7.0], [true, true, false]),
            ([3.0, 50.0, 9.0], [false; 3]),
        ];
        for (widths, periodic) in cases {
            for n in 1..=24 {
                let g = choose_grid(widths, periodic, n);
                assert_eq!(g[0] * g[1] * g[2], n);
                let area = interface_area(widths, periodic, g);
                let best = brute_force_min_area(widths, periodic, n);
                assert!(
                    (area - best).abs() <= 1e-9 * best.max(1.0),
                    "{widths:?} {n}: {area} vs {best}"
                );
            }
        }
    }

    #[test]
    fn long_axis_is_split_first() {
        assert_eq!(choose_grid([40.0, 10.0, 10.0], [true; 3], 2), [2, 1, 1]);
        assert_eq!(choose_grid([10.0, 10.0, 40.0], [true; 3], 4), [1, 1, 4]);
        assert_eq!(choose_grid([10.0, 10.0, 10.0], [true; 3], 8), [2, 2, 2]);
    }

    #[test]
    fn flat_axis_is_never_split_when_avoidable() {
        let g = choose_grid([20.0, 20.0, 0.0], [false; 3], 4);
        assert_eq!(g[2], 1);
    }
}
