//! What the kernel says about this process (`/proc/self/status`,
//! `/proc/self/stat`): peak memory, CPU time, page faults (the last two from
//! `ddmlip_md::process`). `None` off Linux.

/// A `Key:   123 kB` line of `/proc/self/status`, in KiB; `None` where the
/// file or line is missing (non-Linux systems).
pub fn read_status_kib(key: &str) -> Option<u64> {
    parse_status_kib(&std::fs::read_to_string("/proc/self/status").ok()?, key)
}

pub use ddmlip_md::process::{cpu_seconds as process_cpu_s, minor_faults as process_minor_faults};

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
