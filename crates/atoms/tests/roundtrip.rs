//! Property test: writing any representable batch and reading it back gives
//! bit-identical positions, cells, pbc and properties.

use ddmlip_atoms::extxyz::{read_str, write_string};
use ddmlip_atoms::{Cell, Column, InfoValue, Properties, System};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;

/// Any finite float, including subnormals and both zeros.
fn finite() -> impl Strategy<Value = f64> {
    use proptest::num::f64::{NEGATIVE, NORMAL, POSITIVE, SUBNORMAL, ZERO};
    POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO
}

/// Finite or infinite (NaN is excluded only because it is not equal to itself).
fn float() -> impl Strategy<Value = f64> {
    prop_oneof![4 => finite(), 1 => Just(f64::INFINITY), 1 => Just(f64::NEG_INFINITY)]
}

fn info_value() -> impl Strategy<Value = InfoValue> {
    prop_oneof![
        any::<i64>().prop_map(InfoValue::Int),
        float().prop_map(InfoValue::Float),
        any::<bool>().prop_map(InfoValue::Bool),
        // Any text: quotes, backslashes, brackets, control characters, non-ASCII,
        // and strings that look like numbers or booleans.
        prop_oneof![
            ".{0,12}",
            "[0-9TF .,eE+-]{0,6}",
            r#"[ "'{}\[\]=\\a_]{0,8}"#,
            "_JSON .{0,6}"
        ]
        .prop_map(InfoValue::Str),
        vec(any::<i64>(), 0..5).prop_map(InfoValue::IntArray),
        vec(float(), 0..5).prop_map(InfoValue::FloatArray),
        // An empty boolean list has no unambiguous spelling (ASE reads it as floats).
        vec(any::<bool>(), 1..5).prop_map(InfoValue::BoolArray),
    ]
}

fn info_key() -> impl Strategy<Value = String> {
    r#"[a-zA-Z_][a-z0-9_ ="'{}\[\]\\-]{0,6}"#.prop_filter("reserved or special key", |k| {
        !matches!(
            k.as_str(),
            "Lattice" | "Properties" | "pbc" | "stress" | "virial"
        ) && !k.eq_ignore_ascii_case("uid")
    })
}

fn column(n_atoms: usize) -> impl Strategy<Value = Column> {
    (1usize..4).prop_flat_map(move |width| {
        let len = n_atoms * width;
        prop_oneof![
            vec(finite(), len).prop_map(move |v| Column::Float(v, width)),
            vec(any::<i32>(), len)
                .prop_map(move |v| Column::Int(v.into_iter().map(i64::from).collect(), width)),
            vec(any::<bool>(), len).prop_map(move |v| Column::Bool(v, width)),
            vec("[!-~]{1,5}", len).prop_map(move |v| Column::Str(v, width)),
        ]
    })
}

fn system() -> impl Strategy<Value = System> {
    (0usize..6).prop_flat_map(|n| {
        let column_name =
            "[a-z][a-z0-9_.-]{0,6}".prop_filter("reserved", |s| s != "species" && s != "pos");
        (
            vec([finite(), finite(), finite()], n),
            vec(0u32..=118, n),
            proptest::option::of([
                [finite(), finite(), finite()],
                [finite(), finite(), finite()],
                [finite(), finite(), finite()],
            ]),
            any::<[bool; 3]>(),
            btree_map(info_key(), info_value(), 0..6),
            btree_map(column_name, column(n), 0..4),
        )
            .prop_map(|(positions, numbers, cell, pbc, info, arrays)| System {
                positions,
                numbers,
                cell: cell.map(Cell::new),
                pbc,
                properties: Properties { info, arrays },
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn write_then_read_is_bit_identical(frames in vec(system(), 1..4)) {
        let text = write_string(&frames).unwrap();
        let back = read_str(&text).unwrap();
        // `{:?}` prints every float in its shortest round-trip form (keeping
        // the sign of zero), so equal Debug text means bit-identical values.
        prop_assert_eq!(format!("{frames:#?}"), format!("{back:#?}"), "file:\n{}", text);
    }
}
