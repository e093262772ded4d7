//! The superlib: a listing of a realm's top-level entries as empty placeholders, shown at the
//! prefix.
#![forbid(unsafe_code)]

use anyhow::Context as _;
use fetcher::index::TopLevelEntry;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// Build (once per distinct set of entries) `<base>/<hash>/` with one empty placeholder per
/// top-level entry: staged under a temporary name and renamed into place, so a reader never
/// sees half a listing; concurrent supervisors of a realm build the same name and share it.
pub fn build_superlib(base: &Path, entries: &[TopLevelEntry]) -> anyhow::Result<PathBuf> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for e in entries {
        (&e.name, e.is_dir).hash(&mut h);
    }
    let dir = base.join(format!("{:016x}", h.finish()));
    if dir.is_dir() {
        return Ok(dir);
    }
    std::fs::create_dir_all(base).with_context(|| format!("creating {}", base.display()))?;
    let tmp = base.join(format!(
        ".tmp-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let staged = (|| -> std::io::Result<()> {
        std::fs::create_dir(&tmp)?;
        for e in entries {
            // Index names are single normal components (the fetcher validates them).
            let p = tmp.join(&e.name);
            if e.is_dir {
                std::fs::create_dir(&p)?;
            } else {
                std::fs::File::create(&p)?;
            }
        }
        std::fs::File::open(&tmp)?.sync_all()
    })();
    if let Err(e) = staged {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e).with_context(|| format!("building the superlib in {}", tmp.display()));
    }
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another supervisor of this realm put the same listing there first.
        Err(_) if dir.is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e).with_context(|| format!("renaming the superlib to {}", dir.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, is_dir: bool) -> TopLevelEntry {
        TopLevelEntry {
            name: name.into(),
            is_dir,
            package: "p".into(),
        }
    }

    #[test]
    fn superlib_lists_every_entry_and_is_shared() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("superlib");
        let es = [
            entry("numpy", true),
            entry("numpy.libs", true),
            entry("numpy-2.1.3.dist-info", true),
            entry("six.py", false),
        ];
        let d = build_superlib(&base, &es).unwrap();
        let mut names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| (e.file_name().into_string().unwrap(), e.path().is_dir()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("numpy".to_string(), true),
                ("numpy-2.1.3.dist-info".to_string(), true),
                ("numpy.libs".to_string(), true),
                ("six.py".to_string(), false)
            ]
        );
        // Same entries: the same directory, nothing staged left behind.
        assert_eq!(build_superlib(&base, &es).unwrap(), d);
        let other = build_superlib(&base, &es[..1]).unwrap();
        assert_ne!(other, d);
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 2);
        // No index: an empty listing.
        let empty = build_superlib(&base, &[]).unwrap();
        assert_eq!(std::fs::read_dir(empty).unwrap().count(), 0);
    }
}
