//! Property test: writing a LAMMPS data file and reading it back is the
//! identity up to the rotation into LAMMPS's lower-triangular box: the same
//! species and charges, cell lengths and angles, and fractional coordinates,
//! for random (right- and left-handed) triclinic cells.

use ddmlip_atoms::lammps::{read_str, write_string};
use ddmlip_atoms::{to_fractional, Cell, Column, System};
use proptest::collection::vec;
use proptest::prelude::*;

fn metric(m: &[[f64; 3]; 3]) -> [[f64; 3]; 3] {
    let mut g = [[0.0; 3]; 3];
    for i in 0..3 {
        for j in 0..3 {
            g[i][j] = (0..3).map(|k| m[i][k] * m[j][k]).sum();
        }
    }
    g
}

fn system() -> impl Strategy<Value = (System, bool)> {
    let cell = vec(-8.0f64..8.0, 9).prop_filter_map("well-conditioned cell", |v| {
        let m = [[v[0], v[1], v[2]], [v[3], v[4], v[5]], [v[6], v[7], v[8]]];
        let cell = Cell::new(m);
        // Keep the heights well away from zero so fractional coordinates
        // are not dominated by the conditioning of the inverse.
        ((0..3).all(|k| cell.height(k) > 1.0)).then_some(cell)
    });
    (cell, 1usize..12, any::<bool>()).prop_flat_map(|(cell, n, charged)| {
        (
            Just(cell),
            vec(-1.5f64..2.5, n * 3),
            vec(
                prop_oneof![Just(1u32), Just(8), Just(26), Just(79), Just(92)],
                n,
            ),
            vec(-2.0f64..2.0, n),
            Just(charged),
        )
            .prop_map(|(cell, frac, numbers, charges, charged)| {
                let positions = frac
                    .chunks(3)
                    .map(|f| cell.to_cartesian([f[0], f[1], f[2]]))
                    .collect();
                let mut s = System::new(positions, numbers, Some(cell), [true; 3]);
                if charged {
                    s.properties
                        .arrays
                        .insert("initial_charges".into(), Column::Float(charges, 1));
                }
                (s, charged)
            })
    })
}

proptest! {
    #[test]
    fn write_then_read_is_a_rotation((original, charged) in system()) {
        let text = write_string(&original).unwrap();
        let back = read_str(&text).unwrap();
        prop_assert_eq!(&back.numbers, &original.numbers);
        prop_assert_eq!(back.pbc, [true; 3]);
        let (cell, cell_back) = (original.cell.unwrap(), back.cell.unwrap());
        let m = cell_back.matrix;
        prop_assert_eq!([m[0][1], m[0][2], m[1][2]], [0.0; 3]);
        prop_assert!(m[0][0] > 0.0 && m[1][1] > 0.0 && m[2][2] > 0.0);
        // Same lengths and angles: the metric tensors agree.
        let (g, g_back) = (metric(&cell.matrix), metric(&m));
        for i in 0..3 {
            for j in 0..3 {
                prop_assert!((g[i][j] - g_back[i][j]).abs() < 1e-11 * 64.0, "{:?} vs {:?}", g, g_back);
            }
        }
        let (inv, inv_back) = (cell.inverse().unwrap(), cell_back.inverse().unwrap());
        for (p, q) in original.positions.iter().zip(&back.positions) {
            let (f, f_back) = (to_fractional(&inv, *p), to_fractional(&inv_back, *q));
            for k in 0..3 {
                prop_assert!((f[k] - f_back[k]).abs() < 1e-12, "{:?} vs {:?}", f, f_back);
            }
        }
        prop_assert_eq!(
            back.properties.arrays.get("initial_charges"),
            if charged { original.properties.arrays.get("initial_charges") } else { None }
        );
    }
}
