//! A realm's index snapshot as both lazy backends show it (the root's image, `lazy/`, and
//! the FUSE server, `fuse/`): the snapshot read back, its packages and archives,
//! the installed entries shown from the lib dir over it, and the backends' one error.
#![forbid(unsafe_code)]

use fetcher::Index;
use nix::fcntl::{Flock, FlockArg};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Errors of the lazy backend; the caller falls back to the notification path.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {cause}")]
    Command { command: String, cause: String },
    #[error("fanotify {op}: {source} (needs CAP_SYS_ADMIN and ext4)")]
    Fanotify {
        op: &'static str,
        #[source]
        source: nix::Error,
    },
}

pub(crate) fn io<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> LazyError + 'a {
    move |source| LazyError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// The realm's index snapshot (`REALM_DIR/index.json`), which its image is made from.
pub fn snapshot_index(realm_dir: &Path, bucket: &str) -> Result<Index, LazyError> {
    let snapshot = realm_dir.join("index.json");
    std::fs::read(&snapshot)
        .ok()
        .and_then(|b| Index::from_json(bucket, &b).ok())
        .ok_or_else(|| LazyError::Io {
            op: "read",
            path: snapshot,
            source: std::io::ErrorKind::InvalidData.into(),
        })
}

/// The name of `index`'s lazy view (the root's image, the FUSE server's mount): its packages
/// and their archives.
pub fn key_of(index: &Index) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in index.packages().values() {
        (&p.name, &p.archive.sha256).hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

/// `NAME SHA256` lines: a snapshot's packages and their archives.
pub fn packages_text(index: &Index) -> String {
    let mut text = String::new();
    for p in index.packages().values() {
        text.push_str(&format!("{} {}\n", p.name, p.archive.sha256));
    }
    text
}

/// [`packages_text`] read back (empty if unreadable).
pub fn read_packages(path: &Path) -> HashMap<String, String> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(n, sha)| (n.to_owned(), sha.to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The top-level entries of `installed` packages installed from the archive `packages` names
/// for them (package → archive sha256): shown from the realm's lib dir over a lazy view of the
/// snapshot. An entry is one normal name (the index checks them; checked again, as it names a
/// mount point).
pub fn entries_from_lib(
    packages: &HashMap<String, String>,
    installed: &[fetcher::InstalledPackage],
) -> Vec<String> {
    installed
        .iter()
        .filter(|p| packages.get(&p.name) == Some(&p.archive_sha256))
        .flat_map(|p| p.entries.iter())
        .filter(|e| one_name(e))
        .cloned()
        .collect()
}

/// `e` is one normal path component (`numpy`, `six.py`): not empty, `.`, `..` or a path.
fn one_name(e: &str) -> bool {
    let mut c = Path::new(e).components();
    !e.contains('/')
        && matches!(
            (c.next(), c.next()),
            (Some(std::path::Component::Normal(_)), None)
        )
}

/// Keep why a lazy backend could not be had in `marker`.
pub fn remember(marker: &Path, e: &LazyError) {
    let _ = fetcher::cache::write_renamed(marker, format!("{e}\n").as_bytes());
}

/// `path` (created if missing: [`fetcher::cache::open_lock`]), locked `how`.
pub(crate) fn lock_file(path: &Path, how: FlockArg) -> Result<Flock<std::fs::File>, LazyError> {
    let file = fetcher::cache::open_lock(path).map_err(|e| LazyError::Io {
        op: "open",
        path: path.to_owned(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Flock::lock(file, how).map_err(|(_, e)| LazyError::Io {
        op: "flock",
        path: path.to_owned(),
        source: e.into(),
    })
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Single inserts and removals: a panic cannot leave these inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::one_name;

    #[test]
    fn only_single_names_become_mount_points() {
        for ok in ["numpy", "six.py", "numpy-2.1.3.dist-info", "..x"] {
            assert!(one_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "/etc", "numpy/", "../lib", "./x"] {
            assert!(!one_name(bad), "{bad}");
        }
    }
}
