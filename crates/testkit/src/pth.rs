//! Checkpoints with another config for bad-input tests: a PyTorch `.pth`
//! (a zip) whose pickled `data.pkl` is patched in place, its CRC-32 fields
//! rewritten so that the archive stays well-formed.

use std::path::Path;

fn u16_at(b: &[u8], o: usize) -> usize {
    u16::from_le_bytes([b[o], b[o + 1]]) as usize
}
fn u32_at(b: &[u8], o: usize) -> usize {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]) as usize
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Where `data.pkl`'s bytes lie in the archive `zip`, and the offsets of
/// every CRC field that describes them (local header, data descriptor,
/// central directory).
///
/// # Panics
/// When `zip` is not a zip archive with a `data.pkl`.
pub fn pickle_entry(zip: &[u8]) -> (std::ops::Range<usize>, Vec<usize>) {
    let eocd = (0..zip.len() - 21)
        .rev()
        .find(|&i| zip[i..i + 4] == *b"PK\x05\x06")
        .expect("end of central directory");
    let (count, mut at) = (u16_at(zip, eocd + 10), u32_at(zip, eocd + 16));
    for _ in 0..count {
        assert_eq!(&zip[at..at + 4], b"PK\x01\x02");
        let (name_len, extra, comment) = (
            u16_at(zip, at + 28),
            u16_at(zip, at + 30),
            u16_at(zip, at + 32),
        );
        let name = std::str::from_utf8(&zip[at + 46..at + 46 + name_len]).unwrap();
        if name.ends_with("data.pkl") {
            let size = u32_at(zip, at + 24);
            let local = u32_at(zip, at + 42);
            let start = local + 30 + u16_at(zip, local + 26) + u16_at(zip, local + 28);
            let mut crcs = vec![at + 16, local + 14];
            if u16_at(zip, local + 6) & 8 != 0 {
                let d = start + size;
                crcs.push(if zip[d..d + 4] == *b"PK\x07\x08" {
                    d + 4
                } else {
                    d
                });
            }
            return (start..start + size, crcs);
        }
        at += 46 + name_len + extra + comment;
    }
    panic!("no data.pkl")
}

/// Writes to `out` a copy of the checkpoint `src` whose pickle has the
/// first occurrence of `from` replaced by `to` (same length) and valid
/// CRCs: a well-formed checkpoint with another config.
///
/// # Panics
/// When `src` is not a readable zip with a `data.pkl`, the lengths differ,
/// `from` does not occur in the pickle or `out` cannot be written.
pub fn patch_pickle(src: &Path, from: &[u8], to: &[u8], out: &Path) {
    assert_eq!(from.len(), to.len());
    let mut zip = std::fs::read(src).unwrap();
    let (range, crcs) = pickle_entry(&zip);
    let pkl = &mut zip[range.clone()];
    let at = pkl
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern in the pickle");
    pkl[at..at + to.len()].copy_from_slice(to);
    let crc = crc32(&zip[range]).to_le_bytes();
    for o in crcs {
        zip[o..o + 4].copy_from_slice(&crc);
    }
    std::fs::write(out, zip).unwrap();
}
