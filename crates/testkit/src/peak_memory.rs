//! Peak heap memory of a piece of code, for tests that bound what an
//! operation allocates: a counting global allocator over the system one.
//!
//! A test binary installs it with
//! `#[global_allocator] static A: CountingAllocator = CountingAllocator;`
//! and measures with [`peak_of`]; measurements hold a lock, so tests running
//! in parallel threads of one binary do not mix.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static MEASURE: Mutex<()> = Mutex::new(());

/// The system allocator, counting the live bytes and their peak.
pub struct CountingAllocator;

// SAFETY: every call is forwarded unchanged to the system allocator, which
// upholds `GlobalAlloc`'s contract; the counters are atomics touched after
// (alloc) or after (dealloc) the forwarded call and never affect the memory.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's `layout` obligations are passed on as they are.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from `System`, with this `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

/// Runs `f` and returns its result with the peak heap memory (bytes) it
/// added above what was live when it started. Meaningful only in a binary
/// whose global allocator is [`CountingAllocator`] (else 0).
pub fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let _guard = MEASURE.lock().unwrap_or_else(|e| e.into_inner());
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}
