//! A minimal reader for the zip container of PyTorch checkpoints.
//!
//! Why hand-written rather than the `zip` crate: PyTorch writes every entry
//! *stored* (no compression) and 64-byte aligned, so all a reader needs is
//! the central directory (with its zip64 extensions) and the local-header
//! lengths to find each payload. That is ~150 lines with no dependency, no
//! decompression code paths, and full control over bounds checking of
//! untrusted input. Compressed entries are reported as unsupported. Every
//! stored member's CRC-32 (`crc32fast`) is checked against the central
//! directory, as zip readers do, so a header that points the reader at the
//! wrong bytes, or a flipped payload byte, is an error, not a model.

use crate::CheckpointError;

const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
const EOCD_LEN: usize = 22;
const CENTRAL_LEN: usize = 46;
const LOCAL_LEN: usize = 30;

/// One archive member.
#[derive(Debug, Clone)]
pub(crate) struct ZipEntry {
    pub name: String,
    /// Compression method (0 = stored).
    pub method: u16,
    /// File offset of the first payload byte.
    pub data_offset: usize,
    /// Payload length in bytes (compressed size; equal to the size when stored).
    pub size: usize,
}

/// CRC-32 field of a central directory record.
const CENTRAL_CRC_AT: usize = 16;

/// Why an input was rejected before its central directory could be read.
pub(crate) enum ZipOpenError {
    /// No end-of-central-directory record: not a zip (or truncated).
    NotZip(String),
    /// A zip whose structures are inconsistent.
    Corrupt(CheckpointError),
}

fn corrupt(offset: usize, what: impl Into<String>) -> ZipOpenError {
    ZipOpenError::Corrupt(CheckpointError::Zip {
        offset: offset as u64,
        what: what.into(),
    })
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

fn to_usize(v: u64, at: usize, what: &str) -> Result<usize, ZipOpenError> {
    usize::try_from(v).map_err(|_| corrupt(at, format!("{what} {v} does not fit in memory")))
}

/// Lists the entries of the archive held in `bytes`.
pub(crate) fn read_entries(bytes: &[u8]) -> Result<Vec<ZipEntry>, ZipOpenError> {
    let eocd = find_eocd(bytes).ok_or_else(|| {
        let reason = if bytes.starts_with(&[0x80]) {
            "it looks like the legacy (pre-1.6) torch.save pickle format, which is not \
             supported; re-save it with a recent PyTorch"
                .to_string()
        } else if bytes.starts_with(b"PK\x03\x04") {
            "the zip has no end-of-central-directory record (the file is truncated)".to_string()
        } else {
            "not a zip archive (no end-of-central-directory record)".to_string()
        };
        ZipOpenError::NotZip(reason)
    })?;

    let mut count = u64::from(u16_at(bytes, eocd + 10).unwrap_or(0));
    let mut cd_size = u64::from(u32_at(bytes, eocd + 12).unwrap_or(0));
    let mut cd_offset = u64::from(u32_at(bytes, eocd + 16).unwrap_or(0));

    // PyTorch always writes the zip64 records; when present they are the
    // authoritative values (the classic fields may be saturated at 0xFFFF...).
    if eocd >= 20 && u32_at(bytes, eocd - 20) == Some(ZIP64_LOCATOR_SIG) {
        let loc = eocd - 20;
        let rec = u64_at(bytes, loc + 8).unwrap_or(u64::MAX);
        let rec = to_usize(rec, loc, "zip64 record offset")?;
        if u32_at(bytes, rec) != Some(ZIP64_EOCD_SIG) {
            return Err(corrupt(
                rec,
                "zip64 end-of-central-directory record missing",
            ));
        }
        match (
            u64_at(bytes, rec + 32),
            u64_at(bytes, rec + 40),
            u64_at(bytes, rec + 48),
        ) {
            (Some(n), Some(size), Some(off)) => {
                count = n;
                cd_size = size;
                cd_offset = off;
            }
            _ => {
                return Err(corrupt(
                    rec,
                    "zip64 end-of-central-directory record truncated",
                ))
            }
        }
    }

    let cd_start = to_usize(cd_offset, eocd, "central directory offset")?;
    let cd_len = to_usize(cd_size, eocd, "central directory size")?;
    let cd_end = cd_start
        .checked_add(cd_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| corrupt(eocd, "central directory lies outside the file (truncated?)"))?;
    // Each record is at least CENTRAL_LEN bytes: this bounds the count by the
    // input size before anything is allocated.
    if count > (cd_len / CENTRAL_LEN) as u64 {
        return Err(corrupt(
            eocd,
            format!("{count} entries cannot fit in a {cd_len}-byte central directory"),
        ));
    }

    let mut entries = Vec::with_capacity(count as usize);
    let mut at = cd_start;
    for _ in 0..count {
        let (entry, next) = read_central_record(bytes, at, cd_end)?;
        entries.push(entry);
        at = next;
    }
    Ok(entries)
}

/// Parses the central record at `at`; returns the entry and the offset of
/// the next record.
fn read_central_record(
    bytes: &[u8],
    at: usize,
    cd_end: usize,
) -> Result<(ZipEntry, usize), ZipOpenError> {
    let header = bytes
        .get(at..at + CENTRAL_LEN)
        .filter(|_| at + CENTRAL_LEN <= cd_end)
        .ok_or_else(|| corrupt(at, "central directory record truncated"))?;
    if u32_at(header, 0) != Some(CENTRAL_SIG) {
        return Err(corrupt(at, "bad central directory record signature"));
    }
    let field16 = |o: usize| u16_at(header, o).unwrap_or(0);
    let field32 = |o: usize| u32_at(header, o).unwrap_or(0);
    let method = field16(10);
    let crc = field32(CENTRAL_CRC_AT);
    let mut comp_size = u64::from(field32(20));
    let mut uncomp_size = u64::from(field32(24));
    let name_len = usize::from(field16(28));
    let extra_len = usize::from(field16(30));
    let comment_len = usize::from(field16(32));
    let mut local_offset = u64::from(field32(42));

    let name_start = at + CENTRAL_LEN;
    let extra_start = name_start + name_len;
    let next = extra_start + extra_len + comment_len;
    if next > cd_end {
        return Err(corrupt(
            at,
            "central directory record runs past the directory",
        ));
    }
    let name = std::str::from_utf8(&bytes[name_start..extra_start])
        .map_err(|_| corrupt(name_start, "entry name is not UTF-8"))?
        .to_string();

    // zip64 extended information: the saturated fields, in this fixed order.
    let mut e = extra_start;
    let extra_end = extra_start + extra_len;
    while e + 4 <= extra_end {
        let id = u16_at(bytes, e).unwrap_or(0);
        let len = usize::from(u16_at(bytes, e + 2).unwrap_or(0));
        let body = e + 4;
        if body + len > extra_end {
            return Err(corrupt(e, "extra field runs past its record"));
        }
        if id == 0x0001 {
            let mut p = body;
            let mut take = |field: &mut u64| {
                if *field == u64::from(u32::MAX) {
                    if p + 8 <= body + len {
                        *field = u64_at(bytes, p).unwrap_or(0);
                        p += 8;
                    } else {
                        return false;
                    }
                }
                true
            };
            if !(take(&mut uncomp_size) && take(&mut comp_size) && take(&mut local_offset)) {
                return Err(corrupt(e, "zip64 extra field too short"));
            }
        }
        e = body + len;
    }

    let local = to_usize(local_offset, at, "local header offset")?;
    if u32_at(bytes, local) != Some(LOCAL_SIG) {
        return Err(corrupt(local, format!("missing local header of `{name}`")));
    }
    let local_name = usize::from(u16_at(bytes, local + 26).unwrap_or(0));
    let local_extra = usize::from(u16_at(bytes, local + 28).unwrap_or(0));
    let data_offset = local + LOCAL_LEN + local_name + local_extra;
    let size = to_usize(comp_size, at, "entry size")?;
    if !matches!(data_offset.checked_add(size), Some(end) if end <= bytes.len()) {
        return Err(corrupt(
            local,
            format!("payload of `{name}` runs past the end of the file (truncated?)"),
        ));
    }
    if method == 0 && comp_size != uncomp_size {
        return Err(corrupt(
            at,
            format!("stored entry `{name}` has unequal sizes"),
        ));
    }
    if method == 0 {
        // Bounds were checked just above.
        let actual = crc32fast::hash(&bytes[data_offset..data_offset + size]);
        if actual != crc {
            return Err(corrupt(
                data_offset,
                format!(
                    "CRC-32 of `{name}` is {actual:08x} but the directory records {crc:08x}: \
                     the member or its local header is corrupted"
                ),
            ));
        }
    }
    Ok((
        ZipEntry {
            name,
            method,
            data_offset,
            size,
        },
        next,
    ))
}

/// Finds the end-of-central-directory record by scanning back over the
/// (at most 64 KiB) trailing comment.
fn find_eocd(bytes: &[u8]) -> Option<usize> {
    let last = bytes.len().checked_sub(EOCD_LEN)?;
    let first = last.saturating_sub(usize::from(u16::MAX));
    (first..=last).rev().find(|&at| {
        u32_at(bytes, at) == Some(EOCD_SIG)
            && u16_at(bytes, at + 20).map(usize::from) == Some(bytes.len() - at - EOCD_LEN)
    })
}
