//! σOS procs' programs, cached (the supervisor's trampoline mode, `cache_dir` in its
//! trampoline.toml): a proc's binary is copied out of binfs once per realm, name and binfs
//! attributes, and every later proc of it execs the cached file by descriptor, paged in by the kernel from its page cache as the upstream
//! trampoline's procs are from binfs. Without it each proc's binary is copied whole into a
//! memfd before the jail starts (35 MB for σOS's Go procs) and freed when it ends.
//!
//! The key is what σOS's own binary cache trusts: the name (`NAME-vVERSION`, which σOS never
//! reuses for other bytes within a realm) with binfs's size and modification time, and the
//! realm. An entry is written under a temporary name, flushed and renamed: a file under its
//! final name is always whole, and one whose size disagrees with its key is never used.
//! The directory is root's, mode 0700; a proc reaches its own binary only through the
//! read-only descriptor it is handed (Landlock allows that one file, nothing of the cache).
#![forbid(unsafe_code)]

use crate::error::{FetchError, Result};
use sha2::{Digest as _, Sha256};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// The cache's subdirectory of `cache_dir`.
const DIR: &str = "programs";

/// One program's place in the cache.
pub struct Entry {
    path: PathBuf,
    size: u64,
}

impl Entry {
    /// The entry of `prog` (opened as `file`, whose attributes are binfs's) in `realm`.
    pub fn of(cache_dir: &Path, realm: &str, prog: &Path, file: &File) -> Result<Entry> {
        let m = file
            .metadata()
            .map_err(|e| FetchError::io("stat of", prog, e))?;
        let mut h = Sha256::new();
        for part in [
            realm.as_bytes(),
            prog.as_os_str().as_encoded_bytes(),
            format!("{}:{}.{}", m.size(), m.mtime(), m.mtime_nsec()).as_bytes(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        Ok(Entry {
            path: cache_dir.join(DIR).join(hex::encode(h.finalize())),
            size: m.size(),
        })
    }

    /// The cached copy, read-only and close-on-exec, when there is a whole one.
    pub fn open(&self) -> Option<File> {
        let f = File::open(&self.path).ok()?;
        let m = f.metadata().ok()?;
        (m.is_file() && m.size() == self.size).then_some(f)
    }

    /// Copies `file` into the cache and opens the copy. Nothing is left under the entry's name
    /// unless the copy is whole.
    pub fn fill(&self, file: &File) -> Result<File> {
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| FetchError::io("creating", dir, e))?;
        let tmp = dir.join(format!(".tmp-{}", std::process::id()));
        let result = (|| {
            let mut out = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o755)
                .open(&tmp)?;
            let mut src = file;
            let n = std::io::copy(&mut src, &mut out)?;
            if n != self.size {
                return Err(std::io::Error::other(format!(
                    "read {n} bytes of {}",
                    self.size
                )));
            }
            out.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(FetchError::io("caching a program at", &self.path, e));
        }
        self.open().ok_or_else(|| {
            FetchError::io(
                "opening the program cached at",
                &self.path,
                std::io::ErrorKind::NotFound.into(),
            )
        })
    }
}

/// Whether `cache_dir` can hold programs: it exists or is made (mode 0700), and its
/// filesystem is not mounted `noexec`. Said once in a warning when not.
pub fn usable(cache_dir: &Path) -> bool {
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(cache_dir);
    let noexec =
        |s: nix::sys::statvfs::Statvfs| s.flags().contains(nix::sys::statvfs::FsFlags::ST_NOEXEC);
    let why = match (made, nix::sys::statvfs::statvfs(cache_dir)) {
        (Err(e), _) => format!("cannot be made: {e}"),
        (_, Err(e)) => format!("statvfs: {e}"),
        (_, Ok(s)) if noexec(s) => "is on a filesystem mounted noexec".to_owned(),
        _ => return true,
    };
    tracing::warn!(
        "cache_dir {} {why}: binaries are copied into memory for each proc",
        cache_dir.display()
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn a_program_is_copied_once_and_found_by_its_key() {
        let d = tempfile::tempdir().unwrap();
        let prog = d.path().join("tool-v1.0");
        std::fs::write(&prog, b"\x7fELF one").unwrap();
        let f = File::open(&prog).unwrap();
        let e = Entry::of(d.path(), "r1", &prog, &f).unwrap();
        assert!(e.open().is_none());
        let copy = e.fill(&f).unwrap();
        assert_eq!(std::io::read_to_string(copy).unwrap(), "\x7fELF one");
        assert_eq!(
            std::fs::metadata(&e.path).unwrap().mode() & 0o777,
            0o755,
            "executable by the proc's own uid"
        );
        assert_eq!(
            std::fs::metadata(e.path.parent().unwrap()).unwrap().mode() & 0o777,
            0o700
        );
        assert!(e.open().is_some());
        // Another realm, or the program changed in binfs: another entry.
        let other = Entry::of(d.path(), "r2", &prog, &f).unwrap();
        assert_ne!(other.path, e.path);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&prog)
            .unwrap()
            .write_all(b" two")
            .unwrap();
        let f2 = File::open(&prog).unwrap();
        let changed = Entry::of(d.path(), "r1", &prog, &f2).unwrap();
        assert_ne!(changed.path, e.path);
        assert!(changed.open().is_none());
    }

    #[test]
    fn a_short_copy_is_never_used() {
        let d = tempfile::tempdir().unwrap();
        let prog = d.path().join("tool-v1.0");
        std::fs::write(&prog, b"0123456789").unwrap();
        let f = File::open(&prog).unwrap();
        let e = Entry::of(d.path(), "r", &prog, &f).unwrap();
        std::fs::create_dir_all(e.path.parent().unwrap()).unwrap();
        // A file under the entry's name whose size disagrees (a copy cut short elsewhere).
        std::fs::write(&e.path, b"01234").unwrap();
        assert!(e.open().is_none());
        // The program shrank under the copy: the copy fails, the short file is not kept.
        let e2 = Entry {
            path: e.path.with_extension("x"),
            size: 20,
        };
        assert!(e2.fill(&f).is_err());
        assert!(!e2.path.exists());
        let leftovers: Vec<_> = std::fs::read_dir(e.path.parent().unwrap())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|x| x.file_name().to_string_lossy().starts_with(".tmp-"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
