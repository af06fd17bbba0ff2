//! SVG picture of a partition: a projection of the system onto two Cartesian
//! axes with the cell, the domains, owned atoms and ghosts coloured per rank,
//! and a legend with per-rank counts.

use crate::{partition_health, Partition};
use ddmlip_atoms::System;
use std::fmt::Write as _;

const AXIS_NAMES: [&str; 3] = ["x", "y", "z"];
const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
/// Most markers drawn per kind (owned, ghost); beyond this every k-th is drawn
/// so that the file stays viewable.
const MAX_MARKERS: usize = 12_000;
const PLOT_SIZE: f64 = 640.0;
const MARGIN: f64 = 40.0;
const LEGEND_WIDTH: f64 = 330.0;

/// Colour of rank `r`: a ten-colour palette, then evenly spread hues.
pub fn rank_colour(rank: usize) -> String {
    if rank < PALETTE.len() {
        PALETTE[rank].to_string()
    } else {
        let hue = (rank as f64 * 137.507_764) % 360.0;
        format!("hsl({hue:.1},65%,45%)")
    }
}

/// Renders `partition` of `system` as a standalone SVG document, projected
/// onto Cartesian axes `axes = (horizontal, vertical)` (0 = x, 1 = y, 2 = z;
/// values above 2 are taken modulo 3). Owned atoms are filled circles in
/// their owner's colour (at their wrapped position); ghosts are hollow rings
/// in the colour of the rank holding them; domains are tinted outlines; the
/// cell is drawn in grey. `system` must be the system the partition was
/// built from.
pub fn render_svg(partition: &Partition, system: &System, axes: (usize, usize)) -> String {
    let (u, v) = (axes.0 % 3, axes.1 % 3);
    let health = partition_health(partition, system);
    let cell = system.cell.filter(|c| !c.is_zero());

    let locals: Vec<Vec<[f64; 3]>> = partition
        .ranks
        .iter()
        .map(|d| d.local_positions(system))
        .collect();

    // Extent of everything drawn.
    let mut lo = [f64::INFINITY; 2];
    let mut hi = [f64::NEG_INFINITY; 2];
    let mut grow = |p: [f64; 3]| {
        for (i, axis) in [u, v].into_iter().enumerate() {
            lo[i] = lo[i].min(p[axis]);
            hi[i] = hi[i].max(p[axis]);
        }
    };
    locals.iter().flatten().for_each(|&p| grow(p));
    if let Some(c) = cell {
        parallelepiped_corners(&c.matrix, [[0.0, 1.0]; 3])
            .into_iter()
            .for_each(&mut grow);
    }
    for d in &partition.ranks {
        parallelepiped_corners(&partition.frame, d.bounds_frac)
            .into_iter()
            .for_each(&mut grow);
    }
    let pad = 0.03 * (hi[0] - lo[0]).max(hi[1] - lo[1]).max(1.0);
    let (lo, hi) = ([lo[0] - pad, lo[1] - pad], [hi[0] + pad, hi[1] + pad]);
    let scale = PLOT_SIZE / (hi[0] - lo[0]).max(hi[1] - lo[1]);
    let plot_w = (hi[0] - lo[0]) * scale;
    let plot_h = (hi[1] - lo[1]) * scale;
    let to_px = |p: [f64; 3]| {
        (
            MARGIN + (p[u] - lo[0]) * scale,
            MARGIN + plot_h - (p[v] - lo[1]) * scale,
        )
    };

    let legend_rows = partition.ranks.len() + 6;
    let width = MARGIN * 2.0 + plot_w + LEGEND_WIDTH;
    let height = (MARGIN * 2.0 + plot_h).max(MARGIN + 20.0 * legend_rows as f64 + 20.0);
    let radius = (0.35 * scale).clamp(1.5, 6.0);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.1} {height:.1}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let _ = writeln!(
        s,
        r#"<text x="{MARGIN}" y="24" font-size="15" font-weight="bold">Partition {}×{}×{}, ghost width {:.2} Å, {} atoms — projection onto {}–{}</text>"#,
        partition.grid[0],
        partition.grid[1],
        partition.grid[2],
        partition.ghost_width,
        system.positions.len(),
        AXIS_NAMES[u],
        AXIS_NAMES[v]
    );

    // Domains: convex hull of the projected parallelepiped, tinted per rank.
    for d in &partition.ranks {
        let hull = convex_hull(
            parallelepiped_corners(&partition.frame, d.bounds_frac)
                .into_iter()
                .map(&to_px)
                .collect(),
        );
        let colour = rank_colour(d.rank);
        let _ = writeln!(
            s,
            r#"<polygon points="{}" fill="{colour}" fill-opacity="0.07" stroke="{colour}" stroke-width="2.2" stroke-dasharray="8,4"/>"#,
            points(&hull)
        );
    }
    // Cell edges.
    if let Some(c) = cell {
        let corner = |f: [f64; 3]| to_px(c.to_cartesian(f));
        for axis in 0..3 {
            for (a, b) in [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0)] {
                let mut f0 = [0.0; 3];
                f0[(axis + 1) % 3] = a;
                f0[(axis + 2) % 3] = b;
                let mut f1 = f0;
                f1[axis] = 1.0;
                let (p0, p1) = (corner(f0), corner(f1));
                let _ = writeln!(
                    s,
                    r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#555555" stroke-width="1.2"/>"##,
                    p0.0, p0.1, p1.0, p1.1
                );
            }
        }
    }

    // Ghosts: hollow rings, the ring radius grows with the holder's rank so
    // that copies of one atom held by several ranks stay distinguishable.
    let n_ghosts: usize = partition.ranks.iter().map(|d| d.ghosts.len()).sum();
    let ghost_stride = n_ghosts.div_ceil(MAX_MARKERS).max(1);
    let mut counter = 0usize;
    for (d, local) in partition.ranks.iter().zip(&locals) {
        let colour = rank_colour(d.rank);
        let ring = radius + 2.0 + 1.3 * (d.rank % 4) as f64;
        let _ = writeln!(
            s,
            r#"<g fill="none" stroke="{colour}" stroke-width="1.1" stroke-opacity="0.85">"#
        );
        for p in &local[d.n_owned()..] {
            counter += 1;
            if counter % ghost_stride == 0 {
                let (x, y) = to_px(*p);
                let _ = writeln!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="{ring:.1}"/>"#);
            }
        }
        let _ = writeln!(s, "</g>");
    }
    // Owned atoms: filled circles in the owner's colour.
    let owned_stride = system.positions.len().div_ceil(MAX_MARKERS).max(1);
    counter = 0;
    for (d, local) in partition.ranks.iter().zip(&locals) {
        let colour = rank_colour(d.rank);
        let _ = writeln!(
            s,
            r##"<g fill="{colour}" stroke="#222222" stroke-width="0.4">"##
        );
        for p in &local[..d.n_owned()] {
            counter += 1;
            if counter % owned_stride == 0 {
                let (x, y) = to_px(*p);
                let _ = writeln!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="{radius:.1}"/>"#);
            }
        }
        let _ = writeln!(s, "</g>");
    }
    // Axis labels.
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{} (Å) →</text>"#,
        MARGIN + plot_w / 2.0,
        MARGIN + plot_h + 28.0,
        AXIS_NAMES[u]
    );
    let _ = writeln!(
        s,
        r#"<text x="14" y="{:.1}" text-anchor="middle" transform="rotate(-90 14 {:.1})">{} (Å) →</text>"#,
        MARGIN + plot_h / 2.0,
        MARGIN + plot_h / 2.0,
        AXIS_NAMES[v]
    );

    // Legend.
    let lx = MARGIN * 1.5 + plot_w;
    let mut ly = MARGIN + 10.0;
    let _ = writeln!(
        s,
        r#"<text x="{lx:.1}" y="{ly:.1}" font-weight="bold">rank: owned / ghost / remote</text>"#
    );
    for h in &health.ranks {
        ly += 20.0;
        let colour = rank_colour(h.rank);
        let _ = writeln!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="5" fill="{colour}" stroke="#222222" stroke-width="0.4"/><circle cx="{:.1}" cy="{:.1}" r="7" fill="none" stroke="{colour}"/>"##,
            lx + 8.0,
            ly - 4.0,
            lx + 26.0,
            ly - 4.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{ly:.1}">rank {}: {} / {} / {}</text>"#,
            lx + 40.0,
            h.rank,
            h.owned,
            h.ghost,
            h.remote
        );
    }
    ly += 26.0;
    let _ = writeln!(
        s,
        r#"<text x="{lx:.1}" y="{ly:.1}">filled: owned atoms, rings: ghosts</text>"#
    );
    ly += 18.0;
    let _ = writeln!(
        s,
        r#"<text x="{lx:.1}" y="{ly:.1}">dashed: domains; grey: cell</text>"#
    );
    if owned_stride > 1 || ghost_stride > 1 {
        ly += 18.0;
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{ly:.1}">showing every {owned_stride}th atom, {ghost_stride}th ghost</text>"#
        );
    }
    ly += 18.0;
    let verdict = if health.is_healthy() {
        ("#2ca02c", "healthy split".to_string())
    } else {
        (
            "#d62728",
            format!("degenerate: {} finding(s)", health.degenerate.len()),
        )
    };
    let _ = writeln!(
        s,
        r#"<text x="{lx:.1}" y="{ly:.1}" fill="{}" font-weight="bold">{}</text>"#,
        verdict.0, verdict.1
    );
    let _ = writeln!(s, "</svg>");
    s
}

/// The 8 corners of the parallelepiped `bounds` (fractional) in `frame`.
fn parallelepiped_corners(frame: &[[f64; 3]; 3], bounds: [[f64; 2]; 3]) -> Vec<[f64; 3]> {
    let mut out = Vec::with_capacity(8);
    for &a in &bounds[0] {
        for &b in &bounds[1] {
            for &c in &bounds[2] {
                out.push(std::array::from_fn(|k| {
                    a * frame[0][k] + b * frame[1][k] + c * frame[2][k]
                }));
            }
        }
    }
    out
}

/// Convex hull (monotone chain), counter-clockwise, of a few 2-D points.
fn convex_hull(mut pts: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    pts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    pts.dedup();
    if pts.len() < 3 {
        return pts;
    }
    let cross = |o: (f64, f64), a: (f64, f64), b: (f64, f64)| {
        (a.0 - o.0) * (b.1 - o.1) - (a.1 - o.1) * (b.0 - o.0)
    };
    let mut hull: Vec<(f64, f64)> = Vec::with_capacity(2 * pts.len());
    for pass in 0..2 {
        let start = hull.len();
        let iter: Box<dyn Iterator<Item = &(f64, f64)>> = if pass == 0 {
            Box::new(pts.iter())
        } else {
            Box::new(pts.iter().rev())
        };
        for &p in iter {
            while hull.len() >= start + 2
                && cross(hull[hull.len() - 2], hull[hull.len() - 1], p) <= 0.0
            {
                hull.pop();
            }
            hull.push(p);
        }
        hull.pop();
    }
    hull
}

fn points(poly: &[(f64, f64)]) -> String {
    poly.iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition_system;
    use ddmlip_atoms::Cell;

    fn demo_system() -> System {
        let cell = Cell::new([[24.0, 0.0, 0.0], [6.0, 20.0, 0.0], [0.0, 0.0, 8.0]]);
        let mut positions = Vec::new();
        for a in 0..12 {
            for b in 0..10 {
                for c in 0..2 {
                    let f = [
                        (a as f64 + 0.3) / 12.0,
                        (b as f64 + 0.6) / 10.0,
                        (c as f64 + 0.5) / 2.0,
                    ];
                    positions.push(cell.to_cartesian(f));
                }
            }
        }
        let numbers = vec![14; positions.len()];
        System::new(positions, numbers, Some(cell), [true, true, true])
    }

    #[test]
    fn svg_draws_one_marker_per_owned_atom_and_ghost() {
        let system = demo_system();
        let part = partition_system(&system, 4, 3.0).unwrap();
        let svg = render_svg(&part, &system, (0, 1));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let n_ghosts: usize = part.ranks.iter().map(|d| d.ghosts.len()).sum();
        let legend_markers = 2 * part.ranks.len();
        assert_eq!(
            svg.matches("<circle").count(),
            system.positions.len() + n_ghosts + legend_markers
        );
        assert_eq!(svg.matches("<polygon").count(), part.ranks.len());
        assert_eq!(svg.matches("<line").count(), 12);
    }

    #[test]
    fn convex_hull_of_square_with_interior_point() {
        let hull = convex_hull(vec![
            (0.0, 0.0),
            (1.0, 0.0),
            (0.5, 0.5),
            (1.0, 1.0),
            (0.0, 1.0),
        ]);
        assert_eq!(hull.len(), 4);
        assert!(!hull.contains(&(0.5, 0.5)));
    }

    /// Writes a picture for looking at; run with `--ignored`.
    #[test]
    #[ignore]
    fn write_demo_svg() {
        let periodic = demo_system();
        let mut cluster = demo_system();
        cluster.cell = None;
        cluster.pbc = [false; 3];
        for (name, system, ranks) in [
            ("periodic", &periodic, 4),
            ("periodic8", &periodic, 8),
            ("cluster", &cluster, 6),
        ] {
            let part = partition_system(system, ranks, 3.0).unwrap();
            let path = std::env::temp_dir().join(format!("ddmlip_partition_{name}.svg"));
            std::fs::write(&path, render_svg(&part, system, (0, 1))).unwrap();
            println!("wrote {}", path.display());
        }
    }
}
