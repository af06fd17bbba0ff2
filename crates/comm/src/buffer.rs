//! Typed message payloads: borrowed for sending, owned after receiving.
//!
//! Payloads keep their element type end to end so a backend that shares
//! memory (threads) moves typed vectors without re-encoding them as bytes.

/// Element type of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemKind {
    /// `f64` elements.
    F64,
    /// `f32` elements.
    F32,
    /// `u64` elements (e.g. global atom ids).
    U64,
    /// `u32` elements.
    U32,
    /// Raw bytes.
    Bytes,
}

impl ElemKind {
    /// Size of one element in bytes.
    pub fn size_of(self) -> usize {
        match self {
            ElemKind::F64 | ElemKind::U64 => 8,
            ElemKind::F32 | ElemKind::U32 => 4,
            ElemKind::Bytes => 1,
        }
    }
}

/// A borrowed, typed send buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SendBuf<'a> {
    /// `f64` elements.
    F64(&'a [f64]),
    /// `f32` elements.
    F32(&'a [f32]),
    /// `u64` elements.
    U64(&'a [u64]),
    /// `u32` elements.
    U32(&'a [u32]),
    /// Raw bytes.
    Bytes(&'a [u8]),
}

impl SendBuf<'_> {
    /// Element type of the buffer.
    pub fn kind(&self) -> ElemKind {
        match self {
            SendBuf::F64(_) => ElemKind::F64,
            SendBuf::F32(_) => ElemKind::F32,
            SendBuf::U64(_) => ElemKind::U64,
            SendBuf::U32(_) => ElemKind::U32,
            SendBuf::Bytes(_) => ElemKind::Bytes,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            SendBuf::F64(s) => s.len(),
            SendBuf::F32(s) => s.len(),
            SendBuf::U64(s) => s.len(),
            SendBuf::U32(s) => s.len(),
            SendBuf::Bytes(s) => s.len(),
        }
    }

    /// True when the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Payload size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len() * self.kind().size_of()
    }

    /// An owned copy of the buffer.
    pub fn to_buffer(&self) -> Buffer {
        match *self {
            SendBuf::F64(s) => Buffer::F64(s.to_vec()),
            SendBuf::F32(s) => Buffer::F32(s.to_vec()),
            SendBuf::U64(s) => Buffer::U64(s.to_vec()),
            SendBuf::U32(s) => Buffer::U32(s.to_vec()),
            SendBuf::Bytes(s) => Buffer::Bytes(s.to_vec()),
        }
    }
}

/// An owned, typed message payload.
#[derive(Debug, Clone, PartialEq)]
pub enum Buffer {
    /// `f64` elements.
    F64(Vec<f64>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// Raw bytes.
    Bytes(Vec<u8>),
}

impl Buffer {
    /// Element type of the buffer.
    pub fn kind(&self) -> ElemKind {
        self.as_send().kind()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_send().len()
    }

    /// True when the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Payload size in bytes.
    pub fn byte_len(&self) -> usize {
        self.as_send().byte_len()
    }

    /// Borrows the buffer as a send buffer.
    pub fn as_send(&self) -> SendBuf<'_> {
        match self {
            Buffer::F64(v) => SendBuf::F64(v),
            Buffer::F32(v) => SendBuf::F32(v),
            Buffer::U64(v) => SendBuf::U64(v),
            Buffer::U32(v) => SendBuf::U32(v),
            Buffer::Bytes(v) => SendBuf::Bytes(v),
        }
    }
}
