//! What a realm holds, read from local files only (no network, no threads): whether every
//! package of its snapshot is installed, and which packages are.

use std::path::Path;

use super::files::{identity, write_renamed};
use super::layout::{check_realm, Marker};
use super::recovery::needs_recovery;
use crate::error::{FetchError, Result};
use crate::index::Index;

/// The number of packages of realm `realm` under `root` if its index snapshot exists and every
/// package in it is completely installed (each marker naming the snapshot's archive), else
/// `None`: then nothing is left to fetch, and the realm's lib dir can be handed to a target as
/// it is. Reads only local files (no network, no threads).
///
/// The answer is remembered in `<realm>/complete`, keyed by the identity (inode, size, change
/// and modification times) of the snapshot (written once, by rename) and of every marker, so a
/// warm start reads a directory and a few inodes' metadata and one small file, not the whole
/// index and every marker's file list (~3 ms for numpy). An incomplete realm is remembered as
/// such (`packages -`) under the same key: a marker added or changed is a new key.
pub fn realm_complete(root: &Path, realm: &str) -> Result<Option<usize>> {
    check_realm(realm)?;
    // Markers written before a crash are trusted only after RealmCache::open checked them.
    if needs_recovery(root)? {
        return Ok(None);
    }
    let realm_dir = root.join("realms").join(realm);
    let path = realm_dir.join("index.json");
    let key = complete_key(&realm_dir);
    let stamp = realm_dir.join("complete");
    if let Some(k) = &key {
        if let Ok(s) = std::fs::read_to_string(&stamp) {
            match s.strip_prefix(k.as_str()).map(str::trim) {
                Some("-") => return Ok(None),
                Some(n) => {
                    if let Ok(n) = n.parse() {
                        return Ok(Some(n));
                    }
                }
                None => {}
            }
        }
    }
    let n = realm_complete_slow(&realm_dir, &path)?;
    // Remembered only if nothing changed while the markers were read.
    if let Some(k) = key.filter(|k| complete_key(&realm_dir).as_ref() == Some(k)) {
        let answer = n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        // Only an optimisation: a stamp that cannot be written is built again next time.
        let _ = write_renamed(&stamp, format!("{k}{answer}\n").as_bytes());
    }
    Ok(n)
}

/// A package whose marker says it is completely installed in a realm's lib dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledPackage {
    pub name: String,
    /// The archive it was installed from (its index entry's).
    pub archive_sha256: String,
    /// Its top-level entries in the lib dir.
    pub entries: Vec<String>,
}

/// The packages of realm `realm` under `root` that are completely installed, by their markers
/// (unreadable markers are left out). Empty while the cache awaits its crash check: markers
/// written before a crash are trusted only once [`RealmCache::open`](super::RealmCache::open) has checked them. Reads
/// only local files (no network, no threads).
pub fn installed_packages(root: &Path, realm: &str) -> Result<Vec<InstalledPackage>> {
    check_realm(realm)?;
    if needs_recovery(root)? {
        return Ok(Vec::new());
    }
    let state = root.join("realms").join(realm).join("state");
    let entries = match std::fs::read_dir(&state) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(FetchError::io("list", state, e)),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pkg) = name.to_str().and_then(|n| n.strip_suffix(".installed")) else {
            continue;
        };
        let Some(m) = std::fs::read(e.path())
            .ok()
            .and_then(|d| serde_json::from_slice::<Marker>(&d).ok())
            .filter(|m| m.package == pkg)
        else {
            continue;
        };
        out.push(InstalledPackage {
            name: m.package,
            archive_sha256: m.archive_sha256,
            entries: m.entries,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// What [`realm_complete`]'s remembered answer is keyed by (`None`: no snapshot or no state).
fn complete_key(realm_dir: &Path) -> Option<String> {
    use std::fmt::Write as _;
    let id = identity;
    let mut key = format!(
        "v1 index {}",
        id(&std::fs::metadata(realm_dir.join("index.json")).ok()?)
    );
    let mut markers = Vec::new();
    for e in std::fs::read_dir(realm_dir.join("state")).ok()? {
        let e = e.ok()?;
        markers.push((e.file_name(), id(&e.metadata().ok()?)));
    }
    markers.sort();
    for (name, m) in markers {
        let _ = write!(key, " {}={m}", name.to_string_lossy());
    }
    key.push_str(" packages ");
    Some(key)
}

fn realm_complete_slow(realm_dir: &Path, path: &Path) -> Result<Option<usize>> {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FetchError::io("read", path.to_path_buf(), e)),
    };
    let index = Index::from_json(&path.display().to_string(), &data)?;
    for pkg in index.packages().values() {
        let marker = realm_dir
            .join("state")
            .join(format!("{}.installed", pkg.name));
        let m: Marker = match std::fs::read(&marker) {
            Ok(d) => match serde_json::from_slice(&d) {
                Ok(m) => m,
                Err(_) => return Ok(None),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FetchError::io("read", marker, e)),
        };
        if m.archive_sha256 != pkg.archive.sha256 {
            return Ok(None);
        }
    }
    Ok(Some(index.packages().len()))
}
