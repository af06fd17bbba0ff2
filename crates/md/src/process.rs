//! What the kernel counts for this process (`/proc/self/stat`): CPU time
//! and minor page faults, for reports of what a run cost. `None` off Linux.

/// User + system CPU time of this process, all threads (s), from
/// `/proc/self/stat` (fields 14 and 15, in USER_HZ = 100 ticks per second on
/// Linux); `None` where unavailable.
pub fn cpu_seconds() -> Option<f64> {
    parse_stat_cpu_s(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// Minor page faults of this process so far (field 10 of `/proc/self/stat`):
/// each is a page the kernel had to map (and zero) on first touch. Threads
/// of one process take these under one lock on its memory map, so they
/// serialise thread ranks.
pub fn minor_faults() -> Option<u64> {
    parse_stat_minor_faults(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

fn parse_stat_cpu_s(stat: &str) -> Option<f64> {
    let f = stat_fields(stat)?;
    // `f` starts at field 3, so fields 14 and 15 are at 11 and 12.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn parse_stat_minor_faults(stat: &str) -> Option<u64> {
    stat_fields(stat)?.get(7)?.parse().ok()
}

/// The fields of a `/proc/<pid>/stat` line from field 3 on.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    // The command name (field 2) is parenthesised and may hold spaces.
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

/// The process counters at one moment, to difference over a stretch of a run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counters {
    cpu_s: Option<f64>,
    minor_faults: Option<u64>,
}

impl Counters {
    /// The counters now.
    pub(crate) fn now() -> Self {
        Self {
            cpu_s: cpu_seconds(),
            minor_faults: minor_faults(),
        }
    }

    /// CPU seconds and minor faults from `self` to `later`, each divided by
    /// `steps`; `None` where a reading is missing or `steps` is 0.
    pub(crate) fn per_step(&self, later: &Self, steps: u64) -> (Option<f64>, Option<f64>) {
        if steps == 0 {
            return (None, None);
        }
        let n = steps as f64;
        let cpu = self.cpu_s.zip(later.cpu_s).map(|(a, b)| (b - a) / n);
        let faults = self
            .minor_faults
            .zip(later.minor_faults)
            .map(|(a, b)| b.saturating_sub(a) as f64 / n);
        (cpu, faults)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_fields() {
        // proc(5): utime is field 14, stime field 15 (after a name with spaces).
        let s = "42 (a b) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1";
        assert_eq!(parse_stat_cpu_s(s), Some(3.0));
        // minflt is field 10.
        assert_eq!(parse_stat_minor_faults(s), Some(7));
    }

    #[test]
    fn touching_fresh_pages_counts_faults() {
        let Some(before) = minor_faults() else {
            return; // not Linux
        };
        // 64 MiB of fresh memory: at least 32 faults even with 2 MiB pages.
        let mut v: Vec<u8> = Vec::with_capacity(64 << 20);
        v.resize(64 << 20, 1);
        let after = minor_faults().unwrap_or(0);
        assert!(std::hint::black_box(&v)[12345] == 1);
        assert!(after >= before + 32, "{before} -> {after}");
    }

    #[test]
    fn per_step_divides_the_difference() {
        let a = Counters {
            cpu_s: Some(1.0),
            minor_faults: Some(100),
        };
        let b = Counters {
            cpu_s: Some(3.0),
            minor_faults: Some(160),
        };
        assert_eq!(a.per_step(&b, 4), (Some(0.5), Some(15.0)));
        assert_eq!(a.per_step(&b, 0), (None, None));
        let missing = Counters {
            cpu_s: None,
            minor_faults: None,
        };
        assert_eq!(missing.per_step(&b, 4), (None, None));
    }
}
