//! Where the SevenNet-0 checkpoint lives on disk.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::CheckpointError;

/// Environment variable that overrides the checkpoint location.
pub const CHECKPOINT_ENV: &str = "DDMLIP_SEVENNET_CHECKPOINT";

/// File name of the SevenNet-0 checkpoint inside `<cache>/sevennet-0/`.
pub const SEVENNET_FILE_NAME: &str = "checkpoint_sevennet_0.pth";

/// Treats an unset or empty variable alike, as the shell's `${VAR:-...}` does.
fn non_empty(v: Option<OsString>) -> Option<OsString> {
    v.filter(|s| !s.is_empty())
}

/// The ddmlip cache directory from the given environment values:
/// `$DDMLIP_CACHE_DIR`, else `$XDG_CACHE_HOME/ddmlip`, else
/// `$HOME/.cache/ddmlip` (relative `.cache/ddmlip` when even HOME is unset).
/// Empty values count as unset. Same rule as `scripts/fetch-sevennet.sh`.
pub fn cache_dir_from(
    ddmlip_cache_dir: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> PathBuf {
    if let Some(dir) = non_empty(ddmlip_cache_dir) {
        return PathBuf::from(dir);
    }
    if let Some(xdg) = non_empty(xdg_cache_home) {
        return PathBuf::from(xdg).join("ddmlip");
    }
    let mut base = non_empty(home).map(PathBuf::from).unwrap_or_default();
    base.push(".cache");
    base.push("ddmlip");
    base
}

/// The cache path the fetch script writes to:
/// `${DDMLIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ddmlip}/sevennet-0/checkpoint_sevennet_0.pth`.
/// The file need not exist.
pub fn default_sevennet_checkpoint_path() -> PathBuf {
    cache_dir_from(
        std::env::var_os("DDMLIP_CACHE_DIR"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
    .join("sevennet-0")
    .join(SEVENNET_FILE_NAME)
}

/// Locates the SevenNet-0 checkpoint: `$DDMLIP_SEVENNET_CHECKPOINT` if set
/// (it must then name an existing file), else the cache path of
/// [`default_sevennet_checkpoint_path`]. The content is not verified here.
///
/// Errors: [`CheckpointError::EnvPathMissing`] or
/// [`CheckpointError::NotFound`], whose messages say how to fetch the file.
pub fn find_sevennet_checkpoint() -> Result<PathBuf, CheckpointError> {
    if let Some(path) = non_empty(std::env::var_os(CHECKPOINT_ENV)) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(CheckpointError::EnvPathMissing { path })
        };
    }
    let path = default_sevennet_checkpoint_path();
    if path.is_file() {
        Ok(path)
    } else {
        Err(CheckpointError::NotFound { searched: path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn cache_dir_follows_the_shell_rule() {
        assert_eq!(
            cache_dir_from(os("/c"), os("/x"), os("/h")),
            PathBuf::from("/c")
        );
        assert_eq!(
            cache_dir_from(None, os("/x"), os("/h")),
            PathBuf::from("/x/ddmlip")
        );
        assert_eq!(
            cache_dir_from(os(""), os(""), os("/h")),
            PathBuf::from("/h/.cache/ddmlip")
        );
        assert_eq!(
            cache_dir_from(None, None, None),
            PathBuf::from(".cache/ddmlip")
        );
    }

    #[test]
    fn not_found_message_says_how_to_fetch() {
        let msg = CheckpointError::NotFound {
            searched: PathBuf::from("x"),
        }
        .to_string();
        assert!(msg.contains("bash scripts/fetch-sevennet.sh"), "{msg}");
        assert!(msg.contains(CHECKPOINT_ENV), "{msg}");
    }
}
