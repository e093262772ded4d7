//! The bucket index: which distribution provides which top-level names, and the sha256 and size
//! of every file. Layout and format are documented in `fetcher/README.md`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use crate::error::{FetchError, Result};

/// Key of the index object in the bucket.
pub const INDEX_KEY: &str = "sigma-lib/index-v1.json";
/// Key prefix of package archives (content-addressed by the archive's sha256).
pub const PKG_PREFIX: &str = "sigma-lib/pkgs/";
/// Format number written into the index.
pub const FORMAT: u32 = 1;
/// The most other packages one package's entry may name in `reads`.
pub const MAX_READS: usize = 1024;

/// One file of a package, at `path` relative to the lib dir (e.g. `numpy/__init__.py`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

/// How a package archive is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Encoding {
    /// A POSIX tar stream compressed with zstd.
    #[serde(rename = "tar+zstd")]
    TarZstd,
    /// A plain POSIX tar stream.
    #[serde(rename = "tar")]
    Tar,
    /// Every file its own zstd frame, behind a frame index (`crate::frame_index`): what an
    /// import needs is found, fetched and decoded alone.
    #[serde(rename = "zstd-frames")]
    Frames,
}

/// The object holding a whole package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Archive {
    pub key: String,
    pub sha256: String,
    pub size: u64,
    pub encoding: Encoding,
}

/// One distribution (a wheel or a plain package directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Package {
    /// Normalised distribution name (PEP 503), the key in [`Index::packages`].
    pub name: String,
    pub version: String,
    /// Where it came from (wheel file name or directory name), for humans.
    pub source: String,
    /// The entries it puts in the lib dir: `numpy`, `numpy.libs`, `numpy-2.1.3.dist-info`, `six.py`.
    pub top_level: Vec<String>,
    pub archive: Archive,
    /// Every file, sorted by path.
    pub files: Vec<FileEntry>,
    /// Cache tag (`cpython-311`) of the `__pycache__/*.pyc` files shipped among `files`:
    /// unchecked-hash bytecode compiled at publish time, so a cold import runs no compiler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytecode: Option<String>,
    /// How many files open the archive because the import trace read them, in the order it
    /// read them (see `publish`). An install past them is writing what an import does not
    /// need at its start. Absent: no trace, files in path order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced: Option<u64>,
    /// The other packages of the bucket whose files this package's import read at publish (its
    /// import trace), in the order first read: fetched with it, before the import asks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<String>,
}

impl Package {
    /// Total size of the unpacked files.
    pub fn unpacked_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// A top-level entry of the lib dir as listed by the index ("superlib").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopLevelEntry {
    /// File or directory name in the lib dir.
    pub name: String,
    pub is_dir: bool,
    /// Distribution that owns it.
    pub package: String,
}

/// The index document; `P` is how far each package is parsed (`Package`, or a `RawValue` to
/// parse one of them alone).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexFile<P = Package> {
    format: u32,
    packages: BTreeMap<String, P>,
}

impl<'de, P: Deserialize<'de>> IndexFile<P> {
    /// Parse an index document of `bucket` and check its format.
    fn parse(bucket: &str, data: &'de [u8]) -> Result<Self> {
        let file: Self = serde_json::from_slice(data)
            .map_err(|e| FetchError::invalid(format!("{bucket}: {INDEX_KEY}"), e))?;
        if file.format != FORMAT {
            return Err(FetchError::invalid(
                format!("{bucket}: {INDEX_KEY}"),
                format!(
                    "format {} is not supported (expected {FORMAT})",
                    file.format
                ),
            ));
        }
        Ok(file)
    }
}

/// A package is listed under its own name.
fn check_key(bucket: &str, key: &str, pkg: &Package) -> Result<()> {
    if key != pkg.name {
        return Err(FetchError::invalid(
            format!("{bucket}: {INDEX_KEY}"),
            format!("package key {key:?} names {:?}", pkg.name),
        ));
    }
    Ok(())
}

/// The parsed, validated index.
#[derive(Debug, Clone, Default)]
pub struct Index {
    packages: BTreeMap<String, Package>,
    /// Top-level entry name -> package name.
    entries: HashMap<String, String>,
    /// Import name (`six` for `six.py`, `_cffi_backend` for `_cffi_backend.cpython-311-….so`) -> package.
    imports: HashMap<String, String>,
}

/// PEP 503 normalisation: lower case, runs of `-`, `_`, `.` become one `-`.
pub fn normalize_dist_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// The name `import X` would use for a top-level entry, if it is importable.
pub fn import_name_of(entry: &str, is_dir: bool) -> Option<&str> {
    if is_dir {
        // `numpy.libs`, `x.dist-info`, `x.data` are not importable.
        (!entry.contains('.')).then_some(entry)
    } else {
        let (stem, ext) = entry.split_once('.')?;
        let ext = ext.rsplit('.').next().unwrap_or(ext);
        matches!(ext, "py" | "pyc" | "so" | "pyd").then_some(stem)
    }
}

/// Check that `path` is a safe relative path of normal components, `/`-separated.
pub(crate) fn check_rel_path(path: &str) -> Result<()> {
    let ok = !path.is_empty()
        && !path.contains('\\')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(())
    } else {
        Err(FetchError::invalid(
            format!("path {path:?}"),
            "package paths must be relative, without '.', '..' or empty parts",
        ))
    }
}

fn is_sha(sha: &str) -> bool {
    sha.len() == 64
        && sha
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn check_sha(what: &str, sha: &str) -> Result<()> {
    if is_sha(sha) {
        Ok(())
    } else {
        Err(FetchError::invalid(what, format!("bad sha256 {sha:?}")))
    }
}

impl Index {
    /// An empty index.
    pub fn new() -> Self {
        Index::default()
    }

    /// Parse and validate the JSON of an index object.
    pub fn from_json(bucket: &str, data: &[u8]) -> Result<Self> {
        let file: IndexFile = IndexFile::parse(bucket, data)?;
        let mut index = Index::new();
        for (name, pkg) in file.packages {
            check_key(bucket, &name, &pkg)?;
            index.insert(bucket, pkg)?;
        }
        Ok(index)
    }

    /// Package `name` (normalised) of an index document, parsed and checked alone: the others
    /// are only scanned as JSON. `None` when the index does not list it.
    pub fn package_from_json(bucket: &str, data: &[u8], name: &str) -> Result<Option<Package>> {
        let file: IndexFile<&serde_json::value::RawValue> = IndexFile::parse(bucket, data)?;
        let Some(raw) = file.packages.get(name) else {
            return Ok(None);
        };
        let pkg: Package = serde_json::from_str(raw.get())
            .map_err(|e| FetchError::invalid(format!("{bucket}: {INDEX_KEY}"), e))?;
        check_key(bucket, name, &pkg)?;
        validate_package(&pkg)?;
        Ok(Some(pkg))
    }

    /// Serialise (pretty, sorted, so diffs of the bucket's index stay readable).
    pub fn to_json(&self) -> Vec<u8> {
        let file = IndexFile {
            format: FORMAT,
            packages: self.packages.clone(),
        };
        let mut v = serde_json::to_vec_pretty(&file).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Validate `pkg` and add it, replacing an older version of the same distribution.
    /// A top-level name owned by a different distribution is a [`FetchError::Conflict`].
    /// Returns the replaced package, if any.
    pub fn insert(&mut self, bucket: &str, pkg: Package) -> Result<Option<Package>> {
        validate_package(&pkg)?;
        for entry in &pkg.top_level {
            if let Some(owner) = self.entries.get(entry) {
                if *owner != pkg.name {
                    return Err(FetchError::Conflict {
                        bucket: bucket.to_owned(),
                        name: entry.clone(),
                        existing: owner.clone(),
                        new: pkg.name.clone(),
                    });
                }
            }
        }
        let old = self.packages.remove(&pkg.name);
        if let Some(old) = &old {
            self.entries.retain(|_, p| *p != old.name);
            self.imports.retain(|_, p| *p != old.name);
        }
        for e in top_level_entries_of(&pkg) {
            if let Some(imp) = import_name_of(&e.name, e.is_dir) {
                self.imports
                    .entry(imp.to_owned())
                    .or_insert(pkg.name.clone());
            }
            self.entries.insert(e.name, pkg.name.clone());
        }
        self.packages.insert(pkg.name.clone(), pkg);
        Ok(old)
    }

    /// Every distribution, by normalised name.
    pub fn packages(&self) -> &BTreeMap<String, Package> {
        &self.packages
    }

    /// A distribution by (any spelling of) its name.
    pub fn package(&self, dist: &str) -> Option<&Package> {
        self.packages.get(&normalize_dist_name(dist))
    }

    /// Every top-level name of the lib dir (packages, modules, `*.libs`, `*.dist-info`), sorted.
    pub fn top_level_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Every top-level entry with its kind and owner, sorted by name.
    pub fn top_level_entries(&self) -> Vec<TopLevelEntry> {
        let mut v: Vec<TopLevelEntry> = self
            .packages
            .values()
            .flat_map(top_level_entries_of)
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The package providing an import or top-level name: `numpy`, `numpy.core` (the first
    /// dotted segment), `six`, `six.py`, `numpy.libs`, `numpy-2.1.3.dist-info`.
    pub fn package_for_name(&self, name: &str) -> Option<&Package> {
        let owner = self
            .entries
            .get(name)
            .or_else(|| self.imports.get(name))
            .or_else(|| {
                let first = name.split('.').next()?;
                self.imports.get(first)
            })?;
        self.packages.get(owner)
    }

    /// The package owning a path under the lib dir (`numpy/core/x.py`,
    /// `numpy-2.1.3.dist-info/METADATA`, `numpy.libs/libopenblas….so`, `six.py`).
    /// `None` for paths no package owns or that are not plain relative paths.
    pub fn package_for_path(&self, rel: &Path) -> Option<&Package> {
        let first = match rel.components().next()? {
            Component::Normal(c) => c.to_str()?,
            _ => return None,
        };
        self.packages.get(self.entries.get(first)?)
    }
}

fn top_level_entries_of(pkg: &Package) -> Vec<TopLevelEntry> {
    let dirs: BTreeSet<&str> = pkg
        .files
        .iter()
        .filter_map(|f| f.path.split_once('/').map(|(d, _)| d))
        .collect();
    pkg.top_level
        .iter()
        .map(|name| TopLevelEntry {
            name: name.clone(),
            is_dir: dirs.contains(name.as_str()),
            package: pkg.name.clone(),
        })
        .collect()
}

fn validate_package(pkg: &Package) -> Result<()> {
    let what = format!("package {}", pkg.name);
    if pkg.name.is_empty() || normalize_dist_name(&pkg.name) != pkg.name {
        return Err(FetchError::invalid(what, "name is not normalised"));
    }
    check_sha(&what, &pkg.archive.sha256)?;
    if !pkg.archive.key.starts_with(PKG_PREFIX) {
        return Err(FetchError::invalid(
            &what,
            "archive key outside sigma-lib/pkgs/",
        ));
    }
    if pkg.traced.is_some_and(|n| n > pkg.files.len() as u64) {
        return Err(FetchError::invalid(&what, "more traced files than files"));
    }
    let mut read = HashSet::new();
    for r in &pkg.reads {
        if r.is_empty() || normalize_dist_name(r) != *r || *r == pkg.name || !read.insert(r) {
            return Err(FetchError::invalid(
                &what,
                format!("reads {r:?}: not another package's normalised name, once"),
            ));
        }
    }
    if pkg.reads.len() > MAX_READS {
        return Err(FetchError::invalid(&what, "reads too many packages"));
    }
    let top: BTreeSet<&str> = pkg.top_level.iter().map(String::as_str).collect();
    if top.is_empty() || top.len() != pkg.top_level.len() {
        return Err(FetchError::invalid(&what, "top_level empty or repeated"));
    }
    // One pass over the files (a package has thousands): each path checked, its first
    // component noted as a directory or as a file at the top.
    let mut seen = HashSet::with_capacity(pkg.files.len());
    let mut top_dirs: BTreeSet<&str> = BTreeSet::new();
    let mut top_files: BTreeSet<&str> = BTreeSet::new();
    for f in &pkg.files {
        check_rel_path(&f.path)?;
        if !is_sha(&f.sha256) {
            return Err(FetchError::invalid(
                format!("{what}: {}", f.path),
                format!("bad sha256 {:?}", f.sha256),
            ));
        }
        let (first, is_dir) = match f.path.split_once('/') {
            Some((d, _)) => (d, true),
            None => (f.path.as_str(), false),
        };
        if !top.contains(first) {
            return Err(FetchError::invalid(
                &what,
                format!("file {} is outside its top-level names", f.path),
            ));
        }
        if !seen.insert(f.path.as_str()) {
            return Err(FetchError::invalid(
                &what,
                format!("file {} listed twice", f.path),
            ));
        }
        if is_dir {
            top_dirs.insert(first);
        } else {
            top_files.insert(first);
        }
    }
    if let Some(t) = top
        .iter()
        .find(|t| !top_dirs.contains(*t) && !top_files.contains(*t))
    {
        return Err(FetchError::invalid(
            &what,
            format!("top-level name {t} has no files"),
        ));
    }
    // A top-level name is either a file or a directory, never both.
    if let Some(t) = top_files.intersection(&top_dirs).next() {
        return Err(FetchError::invalid(
            &what,
            format!("{t} is both a file and a directory"),
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn pkg(name: &str, files: &[&str]) -> Package {
        let top: BTreeSet<String> = files
            .iter()
            .map(|p| p.split('/').next().unwrap().to_owned())
            .collect();
        Package {
            name: name.into(),
            version: "1.0".into(),
            source: "test".into(),
            top_level: top.into_iter().collect(),
            archive: Archive {
                key: format!("{PKG_PREFIX}{name}.tar.zst"),
                sha256: "a".repeat(64),
                size: 1,
                encoding: Encoding::TarZstd,
            },
            bytecode: None,
            traced: None,
            reads: Vec::new(),
            files: files
                .iter()
                .map(|p| FileEntry {
                    path: (*p).into(),
                    sha256: "b".repeat(64),
                    size: 3,
                })
                .collect(),
        }
    }

    #[test]
    fn hostile_packages_are_refused_with_what_is_wrong() {
        let refused = |p: Package, why: &str| {
            let e = validate_package(&p).unwrap_err().to_string();
            assert!(e.contains(why), "{e:?} lacks {why:?}");
        };
        validate_package(&pkg(
            "ok",
            &["ok/__init__.py", "ok/a/b.py", "ok.py.libs/x.so"],
        ))
        .unwrap();
        let mut p = pkg("p", &["p/a.py"]);
        p.files.push(p.files[0].clone());
        refused(p, "listed twice");
        let mut p = pkg("p", &["p/a.py"]);
        p.files[0].path = "q/a.py".into();
        refused(p, "outside its top-level names");
        let mut p = pkg("p", &["p/a.py"]);
        p.top_level.push("r".into());
        refused(p, "top-level name r has no files");
        refused(
            pkg("p", &["p", "p/a.py"]),
            "p is both a file and a directory",
        );
        let mut p = pkg("p", &["p/a.py"]);
        p.files[0].sha256 = "B".repeat(64);
        refused(p, "bad sha256");
        for bad in ["p/../x", "p//a", "p/./a", "/p/a", "p\\a"] {
            let mut p = pkg("p", &["p/a.py"]);
            p.files[0].path = bad.into();
            refused(p, "package paths must be relative");
        }
    }

    #[test]
    fn names_and_paths_map_to_owners() {
        let mut idx = Index::new();
        idx.insert(
            "b",
            pkg(
                "numpy",
                &[
                    "numpy/__init__.py",
                    "numpy/core/x.py",
                    "numpy.libs/libopenblas.so",
                    "numpy-2.1.dist-info/METADATA",
                ],
            ),
        )
        .unwrap();
        idx.insert("b", pkg("six", &["six.py", "six-1.16.dist-info/RECORD"]))
            .unwrap();
        assert_eq!(
            idx.top_level_names(),
            vec![
                "numpy",
                "numpy-2.1.dist-info",
                "numpy.libs",
                "six-1.16.dist-info",
                "six.py"
            ]
        );
        for name in ["numpy", "numpy.core.x", "numpy.libs", "numpy-2.1.dist-info"] {
            assert_eq!(idx.package_for_name(name).unwrap().name, "numpy", "{name}");
        }
        assert_eq!(idx.package_for_name("six").unwrap().name, "six");
        assert_eq!(idx.package_for_name("six.py").unwrap().name, "six");
        assert!(idx.package_for_name("requests").is_none());
        for p in [
            "numpy/core/x.py",
            "numpy.libs/a.so",
            "numpy-2.1.dist-info/METADATA",
        ] {
            assert_eq!(idx.package_for_path(Path::new(p)).unwrap().name, "numpy");
        }
        assert_eq!(
            idx.package_for_path(Path::new("six.py")).unwrap().name,
            "six"
        );
        assert!(idx.package_for_path(Path::new("../six.py")).is_none());
        assert!(idx.package_for_path(Path::new("/six.py")).is_none());
        let entries = idx.top_level_entries();
        let six = entries.iter().find(|e| e.name == "six.py").unwrap();
        assert!(!six.is_dir);
        assert!(entries.iter().find(|e| e.name == "numpy").unwrap().is_dir);
    }

    #[test]
    fn what_a_package_reads_names_other_packages_once() {
        let mut p = pkg("p", &["p/a.py"]);
        p.reads = vec!["q".into(), "r-s".into()];
        validate_package(&p).unwrap();
        for bad in [vec!["p"], vec!["q", "q"], vec!["R_S"], vec![""]] {
            p.reads = bad.iter().map(|s| s.to_string()).collect();
            let e = validate_package(&p).unwrap_err().to_string();
            assert!(e.contains("reads"), "{bad:?}: {e}");
        }
        p.reads = (0..=MAX_READS).map(|i| format!("q{i}")).collect();
        assert!(validate_package(&p).is_err());
    }

    #[test]
    fn one_package_of_an_index_is_parsed_and_checked_alone() {
        let mut idx = Index::new();
        let mut b = pkg("b", &["b/__init__.py", "b/c.py"]);
        b.traced = Some(1);
        idx.insert("x", pkg("a", &["a/__init__.py"])).unwrap();
        idx.insert("x", b.clone()).unwrap();
        let json = idx.to_json();
        assert_eq!(Index::package_from_json("x", &json, "b").unwrap(), Some(b));
        assert_eq!(Index::package_from_json("x", &json, "zz").unwrap(), None);
        let text = String::from_utf8(json).unwrap();
        // A package that fails its checks is refused, whichever is asked for alone.
        let bad = text.replace(&"b".repeat(64), "not a sha");
        let e = Index::package_from_json("x", bad.as_bytes(), "b").unwrap_err();
        assert!(e.to_string().contains("bad sha256"), "{e}");
        // The key must name the package; the format must be known; unknown fields are refused.
        let renamed = text.replace("\"name\": \"b\"", "\"name\": \"c\"");
        let e = Index::package_from_json("x", renamed.as_bytes(), "b").unwrap_err();
        assert!(e.to_string().contains("names \"c\""), "{e}");
        let future = text.replace("\"format\": 1", "\"format\": 9");
        assert!(Index::package_from_json("x", future.as_bytes(), "a")
            .unwrap_err()
            .to_string()
            .contains("format 9"));
        let extra = text.replace("\"format\": 1", "\"format\": 1, \"extra\": 0");
        assert!(Index::package_from_json("x", extra.as_bytes(), "a").is_err());
        assert!(Index::package_from_json("x", b"{", "a").is_err());
    }

    #[test]
    fn roundtrip_replace_and_conflict() {
        let mut idx = Index::new();
        idx.insert("b", pkg("a", &["a/__init__.py"])).unwrap();
        let again = Index::from_json("b", &idx.to_json()).unwrap();
        assert_eq!(again.packages(), idx.packages());
        let mut newer = pkg("a", &["a/__init__.py", "a_extra/x.py"]);
        newer.version = "2.0".into();
        assert!(idx.insert("b", newer).unwrap().is_some());
        assert_eq!(idx.package_for_name("a_extra").unwrap().version, "2.0");
        let err = idx
            .insert("b", pkg("other", &["a/__init__.py"]))
            .unwrap_err();
        assert!(matches!(err, FetchError::Conflict { .. }), "{err}");
    }

    #[test]
    fn rejects_unsafe_or_inconsistent_packages() {
        let mut idx = Index::new();
        assert!(idx.insert("b", pkg("evil", &["../etc/passwd"])).is_err());
        let mut p = pkg("x", &["x/a.py"]);
        p.top_level.push("y".into());
        p.files.push(FileEntry {
            path: "z/b.py".into(),
            sha256: "c".repeat(64),
            size: 1,
        });
        assert!(idx.insert("b", p).is_err());
        assert!(Index::from_json("b", b"{\"format\":99,\"packages\":{}}").is_err());
        assert_eq!(normalize_dist_name("Foo_Bar.baz"), "foo-bar-baz");
        assert_eq!(
            import_name_of("_cffi.cpython-311-x86_64-linux-gnu.so", false),
            Some("_cffi")
        );
        assert_eq!(import_name_of("numpy.libs", true), None);
    }
}
