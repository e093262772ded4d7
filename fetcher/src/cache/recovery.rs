//! Crash recovery. Of the machine: installs are not flushed (see the module docs of
//! [`super`]), so a boot stamp names the boot with unflushed writes and the next open after a
//! crash checks the whole cache. Of a process: a killed install's staging and journaled
//! entries are removed before the next install of its package, and staging of dead
//! processes when a realm is opened.

use std::collections::HashMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::files::{fsync_dir, pid_alive, remove_any, sync_fs};
use super::layout::{pending_path, Marker, UNSYNCED};
use super::locks::flock_blocking;
use crate::error::{FetchError, IoContext, Result};
use crate::index::Index;
use crate::store::local::write_atomic;

/// Record under `root` that this boot has unflushed writes there (see the module docs).
pub(super) fn stamp_unsynced(root: &Path) -> Result<()> {
    let boot = boot_id()?;
    let stamp = root.join(UNSYNCED);
    if std::fs::read_to_string(&stamp).map_or(true, |b| b.trim() != boot) {
        write_atomic(&stamp, boot.as_bytes())?;
    }
    Ok(())
}

/// This boot's id, as the kernel reports it.
pub(super) fn boot_id() -> Result<String> {
    let p = "/proc/sys/kernel/random/boot_id";
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_owned())
        .ctx("read", p)
}

/// True if unflushed installs of an earlier boot may have been lost in a crash.
pub(super) fn needs_recovery(root: &Path) -> Result<bool> {
    let stamp = root.join(UNSYNCED);
    match std::fs::read_to_string(&stamp) {
        Ok(b) => Ok(b.trim() != boot_id()?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(FetchError::io("read", stamp, e)),
    }
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

/// After a crash of the machine, trust nothing that was not flushed: keep the `cas/` files
/// whose content matches their name, keep a package marker only if every file of the package
/// is in the realm's lib dir as a link to a kept `cas/` file, drop index snapshots that do not
/// parse; then flush and remove the stamp. One process does it (a lock); the rest wait.
pub(super) fn recover_after_crash(root: &Path) -> Result<()> {
    if !needs_recovery(root)? {
        return Ok(());
    }
    let _guard = flock_blocking(&root.join("recover.lock"))?;
    if !needs_recovery(root)? {
        return Ok(());
    }
    tracing::info!(root = %root.display(), "checking the cache after a crash");
    let cas = root.join("cas");
    let mut good: HashMap<String, (u64, u64)> = HashMap::new();
    for e in std::fs::read_dir(&cas).ctx("list", &cas)? {
        let e = e.ctx("list", &cas)?;
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let ok = name.len() == 64 && sha256_file(&path).is_ok_and(|h| h == name);
        if ok {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&path).ctx("stat", &path)?;
            good.insert(name, (m.dev(), m.ino()));
        } else {
            remove_any(&path)?;
        }
    }
    // Trees link to cas/ inodes, possibly to one just dropped, and may be half written: they
    // are derived from the CAS and built again on demand.
    remove_any(&root.join("trees"))?;
    let realms = root.join("realms");
    let listing = match std::fs::read_dir(&realms) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return finish_recovery(root);
        }
        Err(e) => return Err(FetchError::io("list", realms, e)),
    };
    for realm in listing {
        let realm_dir = realm.ctx("list", &realms)?.path();
        let (state, lib) = (realm_dir.join("state"), realm_dir.join("lib"));
        let snapshot = realm_dir.join("index.json");
        let index = std::fs::read(&snapshot)
            .ok()
            .and_then(|d| Index::from_json(&snapshot.display().to_string(), &d).ok());
        let Some(index) = index else {
            // No usable snapshot: no marker can be checked against it.
            remove_any(&snapshot)?;
            if let Ok(markers) = std::fs::read_dir(&state) {
                for m in markers.flatten() {
                    if m.file_name().to_string_lossy().ends_with(".installed") {
                        remove_any(&m.path())?;
                    }
                }
            }
            continue;
        };
        for pkg in index.packages().values() {
            let marker = state.join(format!("{}.installed", pkg.name));
            if !marker.exists() {
                continue;
            }
            let intact = std::fs::read(&marker)
                .ok()
                .and_then(|d| serde_json::from_slice::<Marker>(&d).ok())
                .is_some_and(|m| m.archive_sha256 == pkg.archive.sha256)
                && pkg.files.iter().all(|f| {
                    use std::os::unix::fs::MetadataExt;
                    std::fs::symlink_metadata(lib.join(&f.path))
                        .is_ok_and(|m| good.get(&f.sha256) == Some(&(m.dev(), m.ino())))
                });
            if !intact {
                remove_any(&marker)?;
            }
        }
    }
    finish_recovery(root)
}

fn finish_recovery(root: &Path) -> Result<()> {
    sync_fs(root)?;
    let stamp = root.join(UNSYNCED);
    remove_any(&stamp)?;
    fsync_dir(root)
}

/// Remove staging dirs whose owning process is gone (name: `<pkg>.<pid>.<rand>`).
pub(super) fn sweep_dead_staging(realm_dir: &Path) -> Result<()> {
    let staging = realm_dir.join("staging");
    for e in std::fs::read_dir(&staging).ctx("list", &staging)? {
        let e = e.ctx("list", &staging)?;
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.rsplit('.').nth(1).and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(|p| p != std::process::id() as i32 && !pid_alive(p)) {
            remove_any(&e.path())?;
        }
    }
    Ok(())
}

/// Called with the package lock held: undo what a killed install of `pkg` left in the realm
/// `realm_dir` whose lib dir is `lib`.
pub(super) fn undo_killed_install(realm_dir: &Path, lib: &Path, pkg: &str) -> Result<()> {
    let pending = pending_path(realm_dir, pkg);
    match std::fs::read(&pending) {
        Ok(data) => {
            let entries: Vec<String> = serde_json::from_slice(&data).unwrap_or_default();
            for entry in entries {
                if crate::index::check_rel_path(&entry).is_ok() && !entry.contains('/') {
                    remove_any(&lib.join(entry))?;
                }
            }
            fsync_dir(lib)?;
            std::fs::remove_file(&pending).ctx("remove", &pending)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(FetchError::io("read", pending, e)),
    }
    let staging = realm_dir.join("staging");
    let prefix = format!("{pkg}.");
    for e in std::fs::read_dir(&staging).ctx("list", &staging)? {
        let e = e.ctx("list", &staging)?;
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            remove_any(&e.path())?;
        }
    }
    Ok(())
}
