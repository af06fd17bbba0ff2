//! Extra per-system (`info`) and per-atom (`arrays`) data carried through IO.

use std::collections::BTreeMap;

/// A per-system value, as extended XYZ comment lines carry them.
#[derive(Debug, Clone, PartialEq)]
pub enum InfoValue {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    IntArray(Vec<i64>),
    FloatArray(Vec<f64>),
    BoolArray(Vec<bool>),
}

/// A per-atom column with `width` values per atom, stored row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    Str(Vec<String>, usize),
    Int(Vec<i64>, usize),
    Float(Vec<f64>, usize),
    Bool(Vec<bool>, usize),
}

/// Ordered per-system and per-atom properties.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Properties {
    pub info: BTreeMap<String, InfoValue>,
    pub arrays: BTreeMap<String, Column>,
}
