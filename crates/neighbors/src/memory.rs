//! How much memory one request may plan to take.
//!
//! Neighbour lists and ghost sets are sized from the geometry before they
//! are built; a request whose estimate exceeds this budget is refused with
//! the estimate in bytes instead of aborting the process when an
//! allocation fails.

use std::sync::OnceLock;

/// Budget used where the available memory cannot be read (not Linux): 16 GiB.
pub const FALLBACK_MEMORY_BUDGET: f64 = 16.0 * 1024.0 * 1024.0 * 1024.0;

/// Bytes one neighbour list or one partition may plan to allocate: the
/// memory the operating system reports as available (`MemAvailable` of
/// `/proc/meminfo`) when this is first called, else
/// [`FALLBACK_MEMORY_BUDGET`]. Read once per process, so that every rank and
/// every frame of a run applies the same limit.
pub fn memory_budget_bytes() -> f64 {
    static BUDGET: OnceLock<f64> = OnceLock::new();
    *BUDGET.get_or_init(|| available_memory_bytes().unwrap_or(FALLBACK_MEMORY_BUDGET))
}

fn available_memory_bytes() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    (kib > 0.0).then_some(kib * 1024.0)
}

/// `bytes` with a binary unit, for messages: "4.27 GiB".
pub fn format_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if !bytes.is_finite() {
        return format!("{bytes} B");
    }
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit + 1 == UNITS.len() && value >= 1024.0 {
        return format!("{bytes:.3e} B");
    }
    format!("{value:.2} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_printed_with_binary_units() {
        assert_eq!(format_bytes(512.0), "512.00 B");
        assert_eq!(format_bytes(1536.0), "1.50 KiB");
        assert_eq!(format_bytes(4574617888.0), "4.26 GiB");
        assert_eq!(format_bytes(1e30), "1.000e30 B");
    }

    #[test]
    fn the_budget_is_positive() {
        assert!(memory_budget_bytes() > 0.0);
    }
}
