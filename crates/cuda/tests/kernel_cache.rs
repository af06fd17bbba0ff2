//! The on-disk kernel cache and the device errors, checked without a GPU
//! (these run in CPU-only CI).

use ddmlip_cuda::kernels::{cache_key, entry_path, load_entry, store_entry};
use ddmlip_cuda::{CudaDevice, CudaError};

#[test]
fn a_stored_entry_loads_back_and_only_under_its_own_key() {
    let dir = tempfile::tempdir().unwrap();
    let payload: Vec<u8> = (0..10_000u32).map(|k| (k * 7 % 251) as u8).collect();
    store_entry(dir.path(), "m", 42, &payload).unwrap();
    assert_eq!(
        load_entry(dir.path(), "m", 42).as_deref(),
        Some(&payload[..])
    );
    assert_eq!(load_entry(dir.path(), "m", 43), None);
    assert_eq!(load_entry(dir.path(), "other", 42), None);
}

#[test]
fn a_corrupt_or_truncated_entry_is_a_miss_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let payload = vec![1u8, 2, 3, 4, 5, 6, 7, 8, 9];
    store_entry(dir.path(), "m", 7, &payload).unwrap();
    let path = entry_path(dir.path(), "m", 7);
    let good = std::fs::read(&path).unwrap();

    // One flipped payload byte: the checksum catches it.
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    std::fs::write(&path, &flipped).unwrap();
    assert_eq!(load_entry(dir.path(), "m", 7), None);

    // Truncated (an interrupted writer), empty, and garbage.
    for bad in [
        &good[..good.len() - 3],
        &[][..],
        &b"not a cubin at all, just text"[..],
    ] {
        std::fs::write(&path, bad).unwrap();
        assert_eq!(load_entry(dir.path(), "m", 7), None, "{bad:?}");
    }

    // Overwriting repairs it.
    store_entry(dir.path(), "m", 7, &payload).unwrap();
    assert_eq!(load_entry(dir.path(), "m", 7), Some(payload));
}

#[test]
fn the_key_changes_with_source_architecture_compiler_and_options() {
    let base = cache_key("kernel", "sm_90", (13, 0), &["--fmad=false"]);
    assert_eq!(
        base,
        cache_key("kernel", "sm_90", (13, 0), &["--fmad=false"])
    );
    for other in [
        cache_key("kernel ", "sm_90", (13, 0), &["--fmad=false"]),
        cache_key("kernel", "sm_80", (13, 0), &["--fmad=false"]),
        cache_key("kernel", "sm_90", (13, 1), &["--fmad=false"]),
        cache_key("kernel", "sm_90", (13, 0), &["--fmad=true"]),
        cache_key("kernel", "sm_90", (13, 0), &[]),
        // Boundaries between fields are part of the key.
        cache_key("kernels", "m_90", (13, 0), &["--fmad=false"]),
    ] {
        assert_ne!(base, other);
    }
}

#[test]
fn opening_a_device_gives_a_typed_error_naming_the_problem() {
    match ddmlip_cuda::device_count() {
        // No driver or toolkit (CPU-only CI): the error names the library.
        Err(e @ CudaError::LibraryNotFound { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("no CUDA") && msg.contains("--device cpu"),
                "{msg}"
            );
            let open = CudaDevice::open(0).unwrap_err();
            assert!(matches!(open, CudaError::LibraryNotFound { .. }), "{open}");
        }
        Err(e) => panic!("unexpected error from device_count: {e}"),
        Ok(0) => assert!(matches!(CudaDevice::open(0), Err(CudaError::NoDevice))),
        // A GPU machine: an index past the last device says how many exist.
        Ok(count) => {
            let e = CudaDevice::open(count + 3).unwrap_err();
            assert!(
                matches!(e, CudaError::IndexOutOfRange { index, count: c } if index == count + 3 && c == count),
                "{e}"
            );
            assert!(e.to_string().contains(&format!("has {count}")), "{e}");
        }
    }
}

#[test]
fn out_of_memory_says_how_many_atoms_would_fit() {
    let e = CudaError::OutOfMemory {
        what: "the neighbour list".into(),
        device: 0,
        needed_bytes: 200 << 30,
        free_bytes: 100 << 30,
        reserved_bytes: 20 << 30,
        atoms_that_fit: Some(512_000),
    };
    let msg = e.to_string();
    assert!(
        msg.contains("200.00 GiB") && msg.contains("100.00 GiB"),
        "{msg}"
    );
    // What is free but kept back is said, so "needs 114 GiB, 139 GiB free" is
    // not read as a contradiction.
    assert!(msg.contains("20.00 GiB stay in reserve"), "{msg}");
    assert!(msg.contains("about 512000 atoms"), "{msg}");
}
