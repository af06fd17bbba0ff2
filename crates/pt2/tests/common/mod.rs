//! Reading a fixture archive's members and writing a (modified) archive
//! back, so tests can damage one member at a time.

#![allow(dead_code)]

use std::path::PathBuf;

/// A fixture archive's path.
pub fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The members (name, payload) of a fixture archive.
pub fn members(name: &str) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(data(name)).unwrap();
    ddmlip_checkpoint::zip_members(&bytes)
        .unwrap()
        .into_iter()
        .map(|m| (m.name, bytes[m.payload].to_vec()))
        .collect()
}

/// A stored zip of `members` (CRC-32 set, no alignment).
pub fn zip(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in members {
        let crc = crc32fast::hash(data);
        let offset = out.len() as u32;
        let header = |sig: u32, central_record: bool| {
            let mut h = Vec::new();
            h.extend_from_slice(&sig.to_le_bytes());
            if central_record {
                h.extend_from_slice(&20u16.to_le_bytes()); // made by
            }
            h.extend_from_slice(&20u16.to_le_bytes()); // needed
            h.extend_from_slice(&0u16.to_le_bytes()); // flags
            h.extend_from_slice(&0u16.to_le_bytes()); // stored
            h.extend_from_slice(&0u32.to_le_bytes()); // time, date
            h.extend_from_slice(&crc.to_le_bytes());
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(name.len() as u16).to_le_bytes());
            h.extend_from_slice(&0u16.to_le_bytes()); // extra
            if central_record {
                h.extend_from_slice(&[0u8; 6]); // comment length, disk, internal attrs
                h.extend_from_slice(&0u32.to_le_bytes()); // external attrs
                h.extend_from_slice(&offset.to_le_bytes());
            }
            h.extend_from_slice(name.as_bytes());
            h
        };
        out.extend(header(0x0403_4b50, false));
        out.extend_from_slice(data);
        central.extend(header(0x0201_4b50, true));
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// `members` with the member whose name ends in `suffix` replaced by `f(payload)`.
pub fn edit(
    members: &[(String, Vec<u8>)],
    suffix: &str,
    f: impl Fn(&[u8]) -> Vec<u8>,
) -> Vec<(String, Vec<u8>)> {
    let mut hit = false;
    let out = members
        .iter()
        .map(|(n, d)| {
            if n.ends_with(suffix) {
                hit = true;
                (n.clone(), f(d))
            } else {
                (n.clone(), d.clone())
            }
        })
        .collect();
    assert!(hit, "no member ends in {suffix}");
    out
}
