//! What the kernel says about this process (`/proc/self/status`,
//! `/proc/self/stat`): peak memory, CPU time, page faults. `None` off Linux.

/// A `Key:   123 kB` line of `/proc/self/status`, in KiB; `None` where the
/// file or line is missing (non-Linux systems).
pub fn read_status_kib(key: &str) -> Option<u64> {
    parse_status_kib(&std::fs::read_to_string("/proc/self/status").ok()?, key)
}

/// User + system CPU time of this process, all threads (s), from
/// `/proc/self/stat` (fields 14 and 15, in USER_HZ = 100 ticks per second on
/// Linux); `None` where unavailable.
pub fn process_cpu_s() -> Option<f64> {
    parse_stat_cpu_s(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

fn parse_stat_cpu_s(stat: &str) -> Option<f64> {
    let f = stat_fields(stat)?;
    // `f` starts at field 3, so fields 14 and 15 are at 11 and 12.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Minor page faults of this process so far (field 10 of `/proc/self/stat`):
/// each is a page the kernel had to map (and zero) on first touch.
pub fn process_minor_faults() -> Option<u64> {
    parse_stat_minor_faults(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

fn parse_stat_minor_faults(stat: &str) -> Option<u64> {
    stat_fields(stat)?.get(7)?.parse().ok()
}

/// The fields of a `/proc/<pid>/stat` line from field 3 on.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    // The command name (field 2) is parenthesised and may hold spaces.
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_parse_in_kib() {
        let s = "Name:\tddmlip\nVmHWM:\t  123456 kB\nVmRSS:\t    1000 kB\n";
        assert_eq!(parse_status_kib(s, "VmHWM:"), Some(123456));
        assert_eq!(parse_status_kib(s, "VmRSS:"), Some(1000));
        assert_eq!(parse_status_kib(s, "VmPeak:"), None);
    }

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
        let Some(before) = process_minor_faults() else {
            return; // not Linux
        };
        // 64 MiB of fresh memory: at least 32 faults even with 2 MiB pages.
        let mut v: Vec<u8> = Vec::with_capacity(64 << 20);
        v.resize(64 << 20, 1);
        let after = process_minor_faults().unwrap_or(0);
        assert!(std::hint::black_box(&v)[12345] == 1);
        assert!(after >= before + 32, "{before} -> {after}");
    }

    #[test]
    fn own_status_peak_is_at_least_current() {
        // On Linux the high-water mark in one reading is never below the
        // resident set of that same reading.
        if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
            let hwm = parse_status_kib(&s, "VmHWM:").unwrap();
            let rss = parse_status_kib(&s, "VmRSS:").unwrap();
            assert!(hwm >= rss && rss > 0);
        }
    }
}
