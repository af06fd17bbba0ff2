// Shared by the pickle and synthetic-checkpoint tests (included with `mod`).
#![allow(dead_code)]

/// Small builder for hand-written pickle streams.
#[derive(Default)]
pub struct P(pub Vec<u8>);

impl P {
    pub fn op(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
    pub fn global(self, module: &str, name: &str) -> Self {
        self.op(b"c")
            .op(module.as_bytes())
            .op(b"\n")
            .op(name.as_bytes())
            .op(b"\n")
    }
    pub fn str(self, s: &str) -> Self {
        let len = (s.len() as u32).to_le_bytes();
        self.op(b"X").op(&len).op(s.as_bytes())
    }
    pub fn int1(self, v: u8) -> Self {
        self.op(&[b'K', v])
    }
}

/// A torch-style pickle: `{'w': _rebuild_tensor_v2(storage('0', <class>, 'cpu',
/// numel), offset 1, size (2, 2), stride (1, 2), False, OrderedDict())}`,
/// followed by a memo reference to the same tensor under key 'w_again'.
pub fn torch_style_pickle(storage_class: &str, numel: u8) -> Vec<u8> {
    P::default()
        .op(b"\x80\x02}q\x00(")
        .str("w")
        .global("torch._utils", "_rebuild_tensor_v2")
        .op(b"(")
        .op(b"(")
        .str("storage")
        .global("torch", storage_class)
        .str("0")
        .str("cpu")
        .int1(numel)
        .op(b"tQ")
        .int1(1)
        .int1(2)
        .int1(2)
        .op(b"\x86")
        .int1(1)
        .int1(2)
        .op(b"\x86\x89")
        .global("collections", "OrderedDict")
        .op(b")R")
        .op(b"tRq\x01")
        .str("w_again")
        .op(b"h\x01u.")
        .0
}

/// Writes a zip archive of *stored* entries (method 0 unless overridden),
/// as PyTorch does; enough to build synthetic checkpoints.
pub fn stored_zip(entries: &[(&str, &[u8], u16)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data, method) in entries {
        let offset = out.len() as u32;
        let header = |sig: u32, central: bool| {
            let mut h = Vec::new();
            h.extend_from_slice(&sig.to_le_bytes());
            if central {
                h.extend_from_slice(&20u16.to_le_bytes()); // version made by
            }
            h.extend_from_slice(&20u16.to_le_bytes()); // version needed
            h.extend_from_slice(&0u16.to_le_bytes()); // flags
            h.extend_from_slice(&method.to_le_bytes());
            h.extend_from_slice(&[0; 4]); // time, date
            h.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(data.len() as u32).to_le_bytes());
            h.extend_from_slice(&(name.len() as u16).to_le_bytes());
            h.extend_from_slice(&0u16.to_le_bytes()); // extra length
            if central {
                h.extend_from_slice(&[0; 6]); // comment len, disk start, internal attrs
                h.extend_from_slice(&[0; 4]); // external attrs
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
    out.extend_from_slice(&[0; 4]); // disk numbers
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}
