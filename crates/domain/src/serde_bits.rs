//! Serde helpers that write `f64`s as their IEEE-754 bit patterns: exact
//! through JSON, and infinite values survive. Use them with
//! `#[serde(with = "...")]`.

/// One `f64` as its bit pattern.
pub mod scalar_bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes `v` as its bit pattern.
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        v.to_bits().serialize(s)
    }

    /// Reads an `f64` from its bit pattern.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(f64::from_bits(u64::deserialize(d)?))
    }
}

/// `f64`s as bit patterns.
pub mod vec_bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes each of `v` as its bit pattern.
    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        v.iter()
            .map(|x| x.to_bits())
            .collect::<Vec<u64>>()
            .serialize(s)
    }

    /// Reads `f64`s from their bit patterns.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Ok(Vec::<u64>::deserialize(d)?
            .into_iter()
            .map(f64::from_bits)
            .collect())
    }
}
