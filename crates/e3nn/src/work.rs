//! Work arrays of one kernel call (a layer's node features and message
//! gradient in the kernels' layout, per-edge gradients before they go back
//! to edge order).
//!
//! They are megabytes each (SevenNet-0's message gradient at 8,000 atoms:
//! 100 MB), allocated and dropped once per call, so the system allocator
//! maps them fresh and the kernel backs them page by page on first touch:
//! about 90,000 faults of 4 KiB per evaluation there, taken by every
//! thread at once. [`zeroed`] asks for
//! transparent huge pages on such arrays (`madvise(MADV_HUGEPAGE)`, Linux),
//! so a fault brings in 2 MiB. Every element of these arrays is written,
//! so huge pages cost no memory beyond the array rounded to them.

use crate::real::Real;

/// Arrays of at least this many bytes are advised (one huge page on x86-64;
/// a smaller one holds no whole huge page).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// `len` zeros, advised for transparent huge pages when the array is at
/// least a huge page. Where the kernel declines (huge pages off, another
/// system), a plain zeroed vector.
pub(crate) fn zeroed<T: Real>(len: usize) -> Vec<T> {
    let mut v = vec![T::ZERO; len];
    advise_huge_pages(&mut v);
    v
}

fn advise_huge_pages<T>(v: &mut [T]) {
    let bytes = std::mem::size_of_val(v);
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGE_BYTES {
        const PAGE: usize = 4096;
        let p = v.as_mut_ptr() as usize;
        let (start, end) = (p.next_multiple_of(PAGE), (p + bytes) / PAGE * PAGE);
        if end > start {
            // SAFETY: `[start, end)` is whole pages inside `v`, which this
            // function borrows mutably; MADV_HUGEPAGE changes no contents
            // and no mapping, only whether the kernel may back the range
            // with huge pages. A failure (EINVAL where pages are not 4 KiB
            // or huge pages are off) leaves the range as it was.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The array is zero and, where the system offers transparent huge
    /// pages for advised ranges, its mapping is eligible for them.
    #[test]
    fn large_arrays_are_zero_and_advised() {
        let v: Vec<f32> = zeroed(8 * HUGE_PAGE_BYTES / 4);
        assert!(v.iter().all(|&x| x == 0.0));
        let small: Vec<f64> = zeroed(100);
        assert!(small.iter().all(|&x| x == 0.0));
        #[cfg(target_os = "linux")]
        {
            let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                .unwrap_or_default();
            if !(mode.contains("[madvise]") || mode.contains("[always]")) {
                return;
            }
            let middle = v.as_ptr() as usize + std::mem::size_of_val(&v[..]) / 2;
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
            let mut inside = false;
            let mut eligible = None;
            for line in smaps.lines() {
                let first = line.split_whitespace().next().unwrap_or("");
                if let Some((lo, hi)) = first.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                    {
                        inside = (lo..hi).contains(&middle);
                        continue;
                    }
                }
                if inside {
                    if let Some(rest) = line.strip_prefix("THPeligible:") {
                        eligible = rest.trim().parse::<u32>().ok();
                    }
                }
            }
            assert!(
                eligible.is_none_or(|e| e == 1),
                "advised array not eligible"
            );
        }
    }
}
