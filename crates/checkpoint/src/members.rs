//! The zip reader as a public API, for other PyTorch archive formats
//! (`torch.export`'s `.pt2`) that use the same stored, aligned members.

use crate::zip;
use crate::CheckpointError;
use std::ops::Range;

/// One member of a zip archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipMember {
    /// The member's full name inside the archive (`root/dir/file`).
    pub name: String,
    /// True when the member is stored (compression method 0): only stored
    /// members have a readable payload.
    pub stored: bool,
    /// Byte range of the payload in the archive bytes; within bounds and,
    /// for stored members, CRC-32 checked.
    pub payload: Range<usize>,
}

/// Why [`zip_members`] refused its input.
#[derive(Debug, thiserror::Error)]
pub enum ZipMembersError {
    /// No end-of-central-directory record: not a zip file, or truncated.
    #[error("not a zip archive: {0}")]
    NotZip(String),
    /// A zip whose structures are inconsistent (bad offsets, CRC mismatch).
    #[error(transparent)]
    Corrupt(CheckpointError),
}

/// Lists the members of an in-memory zip archive, bounds-checking every
/// length and checking every stored member's CRC-32.
pub fn zip_members(bytes: &[u8]) -> Result<Vec<ZipMember>, ZipMembersError> {
    let entries = match zip::read_entries(bytes) {
        Ok(e) => e,
        Err(zip::ZipOpenError::NotZip(reason)) => return Err(ZipMembersError::NotZip(reason)),
        Err(zip::ZipOpenError::Corrupt(e)) => return Err(ZipMembersError::Corrupt(e)),
    };
    Ok(entries
        .into_iter()
        .map(|e| ZipMember {
            stored: e.method == 0,
            payload: e.data_offset..e.data_offset + e.size,
            name: e.name,
        })
        .collect())
}
