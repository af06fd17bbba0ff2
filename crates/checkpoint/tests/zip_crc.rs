//! Every stored zip member's CRC-32 is checked: the real SevenNet-0
//! checkpoint (written by PyTorch's zip writer, the independent reference)
//! loads, and the same file with one local header's extra-field length set
//! to 64 — which shifts where the payload is taken from — or with one
//! payload byte flipped is refused, naming the member.

mod common;

use ddmlip_checkpoint::{find_sevennet_checkpoint, Checkpoint, CheckpointError};
use std::path::PathBuf;

/// (offset of the local header, name) of every member, by scanning for
/// local header signatures (the test's own reading of the format).
fn local_headers(bytes: &[u8]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 30 <= bytes.len() {
        if bytes[at..at + 4] == *b"PK\x03\x04" {
            let name_len = u16::from_le_bytes([bytes[at + 26], bytes[at + 27]]) as usize;
            if let Some(name) = bytes.get(at + 30..at + 30 + name_len) {
                if let Ok(name) = std::str::from_utf8(name) {
                    out.push((at, name.to_string()));
                }
            }
        }
        at += 1;
    }
    out
}

fn expect_crc_error(result: Result<Checkpoint, CheckpointError>, member: &str) {
    match result {
        Err(e @ CheckpointError::Zip { .. }) => {
            let text = e.to_string();
            assert!(text.contains("CRC-32") && text.contains(member), "{text}");
        }
        Err(e) => panic!("expected a CRC error for {member}, got {e}"),
        Ok(_) => panic!("the corrupted {member} was read as valid"),
    }
}

#[test]
fn the_real_checkpoint_passes_and_a_shifted_member_is_refused() {
    let path = match find_sevennet_checkpoint() {
        Ok(p) => p,
        // The SevenNet tests fetch it; this one only reads what is there.
        Err(_) => return,
    };
    let bytes = std::fs::read(&path).unwrap();
    Checkpoint::from_bytes(path.clone(), bytes.clone()).unwrap();
    let (header, name) = local_headers(&bytes)
        .into_iter()
        .find(|(_, n)| n.contains("/data/"))
        .expect("a tensor member");
    let mut shifted = bytes.clone();
    shifted[header + 28..header + 30].copy_from_slice(&64u16.to_le_bytes());
    expect_crc_error(Checkpoint::from_bytes(path.clone(), shifted), &name);
}

#[test]
fn a_flipped_payload_byte_is_refused() {
    let pickle = common::torch_style_pickle("FloatStorage", 5);
    let storage: Vec<u8> = (0..20).collect();
    let good = common::stored_zip(&[
        ("archive/data.pkl", &pickle, 0),
        ("archive/data/0", &storage, 0),
    ]);
    Checkpoint::from_bytes(PathBuf::from("good.pth"), good.clone()).unwrap();
    let (header, _) = local_headers(&good)
        .into_iter()
        .find(|(_, n)| n == "archive/data/0")
        .unwrap();
    let mut flipped = good;
    flipped[header + 30 + "archive/data/0".len() + 5] ^= 0x40;
    expect_crc_error(
        Checkpoint::from_bytes(PathBuf::from("flipped.pth"), flipped),
        "archive/data/0",
    );
}
