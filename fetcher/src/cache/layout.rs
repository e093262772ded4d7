//! Where the cache keeps what (the tree is drawn in the module docs of [`super`]): the default
//! root, realm names, the marker of an installed package and its journal, the CAS and the
//! shared trees. Names only; nothing here writes.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{FetchError, Result};
use crate::index::Package;

/// The default cache root: `$XDG_CACHE_HOME/sigma-supervise`, else `~/.cache/sigma-supervise`.
pub fn default_cache_root() -> PathBuf {
    match default_cache_base() {
        (base, true) => base.join("sigma-supervise"),
        (home, false) => home.join(".cache").join("sigma-supervise"),
    }
}

/// [`default_cache_root`] if it may be made: not when it lies in a home directory that does
/// not exist (a service account's `/nonexistent`), which a run must never create on the
/// host. `XDG_CACHE_HOME` itself is made when missing, as the XDG spec asks.
pub fn default_cache_root_if_home() -> Option<PathBuf> {
    match default_cache_base() {
        (base, true) => Some(base.join("sigma-supervise")),
        (home, false) if home.is_dir() => Some(home.join(".cache").join("sigma-supervise")),
        (_, false) => None,
    }
}

/// `($XDG_CACHE_HOME, true)` when it is set, else `($HOME, false)`.
fn default_cache_base() -> (PathBuf, bool) {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return (PathBuf::from(x), true);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    (PathBuf::from(home), false)
}

pub(super) fn check_realm(realm: &str) -> Result<()> {
    let ok = !realm.is_empty()
        && !realm.starts_with('.')
        && realm.len() <= 128
        && realm
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(FetchError::invalid(
            format!("realm {realm:?}"),
            "realm names use letters, digits, '.', '_', '-' and do not start with '.'",
        ))
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Marker {
    pub(super) package: String,
    pub(super) version: String,
    pub(super) archive_sha256: String,
    pub(super) entries: Vec<String>,
}

/// Name of the boot stamp under the cache root (see the module docs).
pub(super) const UNSYNCED: &str = "unsynced";

/// Whether every file of `pkg` is in the content store `cas`: installing it needs no download.
pub(super) fn stored(cas: &Path, pkg: &Package) -> bool {
    pkg.files
        .iter()
        .all(|f| cas_has(&cas.join(&f.sha256), f.size))
}

fn cas_has(path: &Path, size: u64) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == size)
}

/// Where the store keeps the shared, read-only tree of the package whose archive has this
/// sha256 (see [`ensure_tree`](super::ensure_tree)).
pub fn tree_dir(root: &Path, archive_sha256: &str) -> PathBuf {
    root.join("trees").join(archive_sha256)
}

/// `<realm>/state/<pkg>.installed`: the package is complete in the realm's lib dir.
pub(super) fn marker_path(realm_dir: &Path, pkg: &str) -> PathBuf {
    realm_dir.join("state").join(format!("{pkg}.installed"))
}

/// `<realm>/state/<pkg>.pending`: the entries an install is renaming into the lib dir.
pub(super) fn pending_path(realm_dir: &Path, pkg: &str) -> PathBuf {
    realm_dir.join("state").join(format!("{pkg}.pending"))
}
