//! The snapshot's tree in memory: every directory and file with its size and inode.
#![forbid(unsafe_code)]

use fetcher::Index;
use fuser::{FileAttr, FileType};
use std::collections::BTreeMap;
use std::time::SystemTime;

/// One entry of the snapshot's tree; its inode number is its place in [`Tree::nodes`] plus one.
pub(super) struct Node {
    pub(super) parent: u64,
    pub(super) kind: Kind,
}

pub(super) enum Kind {
    Dir(BTreeMap<String, u64>),
    File {
        size: u64,
        sha256: String,
        /// The top-level entry it belongs to (`numpy`), which names its package.
        top: String,
    },
}

/// The snapshot's directories and files (the root is inode 1).
pub(super) struct Tree {
    pub(super) nodes: Vec<Node>,
    pub(super) mtime: SystemTime,
    pub(super) uid: u32,
    pub(super) gid: u32,
}

impl Tree {
    pub(super) fn of(index: &Index, mtime: SystemTime) -> Tree {
        let mut t = Tree {
            nodes: vec![Node {
                parent: 1,
                kind: Kind::Dir(BTreeMap::new()),
            }],
            mtime,
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        };
        for pkg in index.packages().values() {
            for f in &pkg.files {
                // Index paths are checked relative paths of normal components.
                let parts: Vec<&str> = f.path.split('/').collect();
                let Some((name, dirs)) = parts.split_last() else {
                    continue;
                };
                let mut at = 1u64;
                let mut ok = true;
                for d in dirs {
                    match t.child_or_insert(at, d, || Kind::Dir(BTreeMap::new())) {
                        Some(ino) if matches!(t.node(ino).map(|n| &n.kind), Some(Kind::Dir(_))) => {
                            at = ino
                        }
                        _ => {
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    let top = parts[0].to_owned();
                    let _ = t.child_or_insert(at, name, || Kind::File {
                        size: f.size,
                        sha256: f.sha256.clone(),
                        top,
                    });
                }
            }
        }
        t
    }

    pub(super) fn node(&self, ino: u64) -> Option<&Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get(i)
    }

    /// The child `name` of directory `dir`, made with `kind` if missing.
    pub(super) fn child_or_insert(
        &mut self,
        dir: u64,
        name: &str,
        kind: impl FnOnce() -> Kind,
    ) -> Option<u64> {
        let next = self.nodes.len() as u64 + 1;
        let i = usize::try_from(dir.checked_sub(1)?).ok()?;
        let Kind::Dir(children) = &mut self.nodes.get_mut(i)?.kind else {
            return None;
        };
        if let Some(&ino) = children.get(name) {
            return Some(ino);
        }
        children.insert(name.to_owned(), next);
        self.nodes.push(Node {
            parent: dir,
            kind: kind(),
        });
        Some(next)
    }

    pub(super) fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.node(ino)?;
        let (kind, perm, size, nlink) = match &n.kind {
            Kind::Dir(_) => (FileType::Directory, 0o555, 0, 2),
            Kind::File { size, .. } => (FileType::RegularFile, 0o444, *size, 1),
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
            crtime: self.mtime,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}
