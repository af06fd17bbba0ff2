//! Kernels in CUDA C, compiled by NVRTC for the device's own architecture
//! (real `sm_XY` CUBIN, not PTX) and cached on disk.
//!
//! Cache entries live in `$XDG_CACHE_HOME/ddmlip/kernels/` (or
//! `~/.cache/ddmlip/kernels/`), one file per (source, architecture, NVRTC
//! version, options), named by a hash of all four. An entry carries its key
//! and a checksum of its payload: a truncated or corrupt entry is compiled
//! again and overwritten, never loaded.

use crate::CudaError;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};

/// The kernels of this crate (neighbour list, Lennard-Jones, reductions).
pub const DDMLIP_KERNELS: &str = include_str!("kernels/ddmlip.cu");

/// The SevenNet kernels (edge features, fused convolution forward and
/// backward, gate, readout, forces and virial), for f64 and f32.
pub const SEVENNET_KERNELS: &str = concat!(
    include_str!("kernels/edges.cuh"),
    include_str!("kernels/sevennet.cu")
);

/// The SchNet kernels (edge geometry and Gaussians, shifted softplus, the
/// message and its backward, readout seed), for f64 and f32.
pub const SCHNET_KERNELS: &str = concat!(
    include_str!("kernels/edges.cuh"),
    include_str!("kernels/schnet.cu")
);

/// The op engine's generic kernels (element-wise maps, broadcasts, row and
/// column sums, gathers, inverse-map sums, radial bases), for f64 and f32.
pub const ENGINE_OPS_KERNELS: &str = include_str!("kernels/engine_ops.cu");

/// Options every kernel module is compiled with. `--fmad=false`: no fused
/// multiply-adds, so pair vectors and cutoff decisions round exactly as on
/// the CPU.
pub const COMPILE_OPTIONS: &[&str] = &["--fmad=false", "--std=c++17"];

const MAGIC: &[u8; 8] = b"DDMLIPK1";
const HEADER_BYTES: usize = 8 + 8 + 8 + 8;

/// 64-bit FNV-1a of `bytes`, continuing from `state` (start with
/// [`FNV_OFFSET`]). Stable across builds and platforms, unlike std's hasher.
pub fn fnv1a(state: u64, bytes: &[u8]) -> u64 {
    let mut h = state;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Initial state of [`fnv1a`].
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The cache key of a module: a hash of its source, target architecture
/// (`sm_90`), NVRTC version `(major, minor)` and compile options.
pub fn cache_key(source: &str, arch: &str, nvrtc_version: (i32, i32), options: &[&str]) -> u64 {
    let mut h = fnv1a(FNV_OFFSET, source.as_bytes());
    h = fnv1a(h, &[0]);
    h = fnv1a(h, arch.as_bytes());
    h = fnv1a(
        h,
        format!("\0{}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes(),
    );
    for o in options {
        h = fnv1a(h, &[0]);
        h = fnv1a(h, o.as_bytes());
    }
    h
}

/// The kernel cache directory: `$XDG_CACHE_HOME/ddmlip/kernels` when that
/// variable is set and absolute, else `$HOME/.cache/ddmlip/kernels`; `None`
/// when neither is known (kernels are then compiled every run).
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("ddmlip").join("kernels"))
}

/// The file of cache entry `key` in `dir`.
pub fn entry_path(dir: &Path, name: &str, key: u64) -> PathBuf {
    dir.join(format!("{name}-{key:016x}.cubin"))
}

/// The payload of cache entry `key` in `dir`, or `None` when it is absent,
/// unreadable, for another key, truncated or fails its checksum.
pub fn load_entry(dir: &Path, name: &str, key: u64) -> Option<Vec<u8>> {
    let bytes = std::fs::read(entry_path(dir, name, key)).ok()?;
    if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
        return None;
    }
    let word =
        |k: usize| -> Option<u64> { Some(u64::from_le_bytes(bytes[k..k + 8].try_into().ok()?)) };
    let (stored_key, len, checksum) = (word(8)?, word(16)?, word(24)?);
    let payload = &bytes[HEADER_BYTES..];
    if stored_key != key || payload.len() as u64 != len || fnv1a(FNV_OFFSET, payload) != checksum {
        return None;
    }
    Some(payload.to_vec())
}

/// Writes cache entry `key` (atomically: a temporary file renamed into
/// place, so a concurrent reader never sees half an entry).
pub fn store_entry(dir: &Path, name: &str, key: u64, payload: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&key.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&fnv1a(FNV_OFFSET, payload).to_le_bytes());
    bytes.extend_from_slice(payload);
    let path = entry_path(dir, name, key);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, &path)
}

/// Where a module's CUBIN came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSource {
    /// Loaded from the disk cache.
    Cache,
    /// Compiled by NVRTC in this process (and stored when the cache is writable).
    Compiled,
}

/// The NVRTC version `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::driver("nvrtcVersion", format!("{e:?}")))?;
    Ok((major, minor))
}

/// The CUBIN of `source` for `arch`, from the cache or compiled (and cached).
pub fn cubin(name: &str, source: &str, arch: &str) -> Result<(Vec<u8>, KernelSource), CudaError> {
    let key = cache_key(source, arch, nvrtc_version()?, COMPILE_OPTIONS);
    let dir = cache_dir();
    if let Some(bytes) = dir.as_deref().and_then(|d| load_entry(d, name, key)) {
        return Ok((bytes, KernelSource::Cache));
    }
    let bytes = compile_cubin(name, source, arch)?;
    if let Some(d) = dir.as_deref() {
        // An unwritable cache only costs a compile next time.
        if let Err(e) = store_entry(d, name, key, &bytes) {
            eprintln!(
                "warning: could not write the kernel cache {}: {e}",
                d.display()
            );
        }
    }
    Ok((bytes, KernelSource::Compiled))
}

/// Compiles `source` with NVRTC to a CUBIN for `arch` (e.g. `sm_90`).
pub fn compile_cubin(name: &str, source: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    use cudarc::nvrtc::{result, sys};
    let bad = |what: &str| CudaError::Compile {
        name: name.into(),
        arch: arch.into(),
        log: format!("{what} contains a NUL byte"),
    };
    let c_src = CString::new(source).map_err(|_| bad("the source"))?;
    let c_name = CString::new(format!("{name}.cu")).map_err(|_| bad("the name"))?;
    let prog = result::create_program(&c_src, Some(&c_name))
        .map_err(|e| CudaError::driver("nvrtcCreateProgram", format!("{e:?}")))?;
    let mut options: Vec<String> = vec![format!("--gpu-architecture={arch}")];
    options.extend(COMPILE_OPTIONS.iter().map(|s| s.to_string()));
    // SAFETY: `prog` is a live program; options are valid strings.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let out = match compiled {
        Err(_) => {
            // SAFETY: the log of a live program.
            let log = unsafe { result::get_program_log(prog) }
                .map(|raw| {
                    let bytes: Vec<u8> = raw
                        .iter()
                        .take_while(|&&c| c != 0)
                        .map(|&c| c as u8)
                        .collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_else(|e| format!("(no log: {e:?})"));
            Err(CudaError::Compile {
                name: name.into(),
                arch: arch.into(),
                log,
            })
        }
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: size query then a copy into a buffer of that size.
            unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(|e| CudaError::driver("nvrtcGetCUBINSize", format!("{e:?}")))
                .and_then(|()| {
                    let mut buf = vec![0u8; size];
                    unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) }
                        .result()
                        .map_err(|e| CudaError::driver("nvrtcGetCUBIN", format!("{e:?}")))?;
                    Ok(buf)
                })
        }
    };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { result::destroy_program(prog) };
    out
}
