//! Shared trees: a package's files as one read-only tree of links into the CAS, built once per
//! archive on the machine, and a realm shown from its packages' trees ([`realm_trees`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::files::{for_each_in_parallel, identity, pid_alive, remove_any, write_renamed};
use super::layout::{check_realm, stored, tree_dir};
use super::recovery::{needs_recovery, stamp_unsynced};
use crate::error::{FetchError, IoContext, Result};
use crate::index::{Index, Package};

/// More top-level entries than this and a realm is not shown from trees (one mount each);
/// its own lib dir (one mount) serves it once installed.
pub const MAX_TREE_ENTRIES: usize = 512;

/// One top-level entry of a realm, shown from its package's shared tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    /// File or directory name at the lib prefix (`numpy`, `six.py`).
    pub name: String,
    pub is_dir: bool,
    /// Distribution that owns it.
    pub package: String,
    /// `<root>/trees/<archive sha256>/<name>`.
    pub source: PathBuf,
}

impl TreeEntry {
    /// The entry as the index lists it.
    pub fn top_level(&self) -> crate::index::TopLevelEntry {
        crate::index::TopLevelEntry {
            name: self.name.clone(),
            is_dir: self.is_dir,
            package: self.package.clone(),
        }
    }
}

/// A realm every package of which has a shared tree ([`realm_trees`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeView {
    /// Sorted by name.
    pub entries: Vec<TreeEntry>,
    /// The cache tag of the bytecode each package with Python sources ships (`None`: none),
    /// by package: a tree holds only what was published, never bytecode compiled for a realm
    /// afterwards.
    pub bytecode: BTreeMap<String, Option<String>>,
}

impl TreeView {
    /// How many packages the entries come from.
    pub fn packages(&self) -> usize {
        self.entries
            .iter()
            .map(|e| e.package.as_str())
            .collect::<HashSet<_>>()
            .len()
    }

    /// Whether every package with Python sources ships bytecode for interpreters of cache tag
    /// `tag` (`cpython-311`): else a realm of its own, compiled after install, imports faster.
    pub fn compiled_for(&self, tag: &str) -> bool {
        self.bytecode.values().all(|b| b.as_deref() == Some(tag))
    }
}

/// The realm's libraries as shared trees, if its index snapshot exists and every package of it
/// has a tree (built here from the CAS when all its files are there, ~1,500 links for numpy,
/// once per archive on the machine): then a target can be shown the realm by one read-only
/// mount per top-level entry, and a realm never seen before needs no install of its own.
/// `None`: a package's content is missing (fetch it: notification or lazy path), more than
/// [`MAX_TREE_ENTRIES`] entries, or the cache awaits its crash check.
///
/// Remembered in `<realm>/trees`, keyed by the identity of the snapshot and the modification
/// times of `cas/` and `trees/` (content added anywhere is a new key); a remembered view is used
/// after checking that its trees still exist.
pub fn realm_trees(root: &Path, realm: &str) -> Result<Option<TreeView>> {
    realm_trees_of(root, realm, None)
}

/// [`realm_trees`] for a caller that holds the realm's snapshot parsed already (it has just
/// taken it): not parsed again.
pub fn realm_trees_of(
    root: &Path,
    realm: &str,
    snapshot: Option<&Index>,
) -> Result<Option<TreeView>> {
    check_realm(realm)?;
    if needs_recovery(root)? {
        return Ok(None);
    }
    let realm_dir = root.join("realms").join(realm);
    let snapshot_path = realm_dir.join("index.json");
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| identity(&m));
    let Some(index_id) = id(&snapshot_path) else {
        return Ok(None);
    };
    let key = |root: &Path| {
        format!(
            "v1 index {index_id} cas {} trees {}",
            id(&root.join("cas")).unwrap_or_default(),
            id(&root.join("trees")).unwrap_or_default()
        )
    };
    #[derive(Serialize, Deserialize)]
    struct Stamp {
        key: String,
        view: Option<TreeView>,
    }
    let stamp_path = realm_dir.join("trees");
    let before = key(root);
    if let Some(stamp) = std::fs::read(&stamp_path)
        .ok()
        .and_then(|d| serde_json::from_slice::<Stamp>(&d).ok())
        .filter(|s| s.key == before)
    {
        match stamp.view {
            None => return Ok(None),
            Some(v)
                if v.entries.iter().all(|e| {
                    e.source.starts_with(root.join("trees")) && e.source.symlink_metadata().is_ok()
                }) =>
            {
                return Ok(Some(v))
            }
            Some(_) => {}
        }
    }
    let parsed;
    let index = match snapshot {
        Some(i) => i,
        None => {
            let data = std::fs::read(&snapshot_path).ctx("read", &snapshot_path)?;
            parsed = Index::from_json(&snapshot_path.display().to_string(), &data)?;
            &parsed
        }
    };
    let entries = index.top_level_entries();
    let mut view = None;
    if !index.packages().is_empty() && entries.len() <= MAX_TREE_ENTRIES {
        let mut trees = HashMap::new();
        for pkg in index.packages().values() {
            match ensure_tree(root, pkg)? {
                Some(t) => trees.insert(pkg.name.clone(), t),
                None => {
                    trees.clear();
                    break;
                }
            };
        }
        if trees.len() == index.packages().len() {
            view = Some(TreeView {
                bytecode: index
                    .packages()
                    .values()
                    .filter(|p| p.files.iter().any(|f| f.path.ends_with(".py")))
                    .map(|p| (p.name.clone(), p.bytecode.clone()))
                    .collect(),
                entries: entries
                    .into_iter()
                    .map(|e| TreeEntry {
                        source: trees[&e.package].join(&e.name),
                        name: e.name,
                        is_dir: e.is_dir,
                        package: e.package,
                    })
                    .collect(),
            });
        }
    }
    // Building trees changes `trees/`: keyed by what is there now, so the next run hits.
    let stamp = Stamp {
        key: key(root),
        view: view.clone(),
    };
    // Only an optimisation: a stamp that cannot be written is worked out again next time.
    let _ = write_renamed(&stamp_path, &serde_json::to_vec(&stamp).unwrap_or_default());
    Ok(view)
}

/// The package's shared tree, `<root>/trees/<archive sha256>/` (its top-level entries, every
/// file a hard link to the verified `cas/` copy): built from the CAS when every file of the
/// package is there, else `None`. A tree appears whole or not at all (built under a temporary
/// name and renamed into place; concurrent builders race harmlessly and the loser's copy goes)
/// and is never changed afterwards, so a realm whose packages all have trees can show them
/// to its target by bind-mounting each top-level entry, with nothing of its own to install.
/// Trees are shared by every realm of the root, as the CAS is: realms share directories, not
/// only files.
pub fn ensure_tree(root: &Path, pkg: &Package) -> Result<Option<PathBuf>> {
    let dir = tree_dir(root, &pkg.archive.sha256);
    if dir.is_dir() {
        return Ok(Some(dir));
    }
    if !stored(&root.join("cas"), pkg) {
        return Ok(None);
    }
    stamp_unsynced(root)?;
    let trees = root.join("trees");
    std::fs::create_dir_all(&trees).ctx("create dir", &trees)?;
    sweep_dead_trees(&trees);
    let tmp = trees.join(format!(
        ".tmp.{}.{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    let built = link_tree(pkg, root, &tmp).and_then(|()| {
        std::fs::rename(&tmp, &dir).or_else(|e| {
            // Another builder got there first: its tree is the same.
            if dir.is_dir() {
                Ok(())
            } else {
                Err(FetchError::io("rename into", &dir, e))
            }
        })
    });
    let _ = remove_any(&tmp);
    built.map(|()| Some(dir))
}

/// Remove tree builds left by processes that no longer exist (`.tmp.<pid>.<rand>`).
fn sweep_dead_trees(trees: &Path) {
    let Ok(list) = std::fs::read_dir(trees) else {
        return;
    };
    for e in list.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(".tmp.")
            .and_then(|r| r.split('.').next())
            .and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(|p| p != std::process::id() as i32 && !pid_alive(p)) {
            let _ = remove_any(&e.path());
        }
    }
}

/// Build the package's tree under `tree` from hard links into the CAS.
pub(super) fn link_tree(pkg: &Package, root: &Path, tree: &Path) -> Result<()> {
    make_dirs(pkg, tree)?;
    let cas = root.join("cas");
    for_each_in_parallel(&pkg.files, |f| {
        let src = cas.join(&f.sha256);
        std::fs::hard_link(&src, tree.join(&f.path)).ctx("link from cas", &src)
    })
}

/// Create `tree` and every directory of `pkg` in it.
pub(super) fn make_dirs(pkg: &Package, tree: &Path) -> Result<()> {
    std::fs::create_dir(tree).ctx("create dir", tree)?;
    make_subdirs(pkg, tree)
}

/// [`make_dirs`] in an existing (empty) `tree`.
pub(super) fn make_subdirs(pkg: &Package, tree: &Path) -> Result<()> {
    let mut dirs: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
    for f in &pkg.files {
        let mut p = Path::new(&f.path).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            if !dirs.insert(tree.join(d)) {
                break;
            }
            p = d.parent();
        }
    }
    // BTreeSet order puts parents before children.
    for d in &dirs {
        std::fs::create_dir(d).ctx("create dir", d)?;
    }
    Ok(())
}
