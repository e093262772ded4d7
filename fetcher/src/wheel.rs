//! Reading distributions to publish: wheels (RECORD-verified) and plain package directories.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use base64::Engine;
use sha2::{Digest, Sha256};

use crate::error::{FetchError, IoContext, Result};
use crate::index::{check_rel_path, normalize_dist_name};

/// The files of one distribution, at their lib-dir paths.
#[derive(Debug)]
pub(crate) struct Distribution {
    pub name: String,
    pub version: String,
    pub source: String,
    pub files: BTreeMap<String, Vec<u8>>,
}

impl Distribution {
    /// Top-level entries (first path components), sorted.
    pub fn top_level(&self) -> Vec<String> {
        let set: BTreeSet<&str> = self
            .files
            .keys()
            .map(|p| p.split('/').next().unwrap_or(p))
            .collect();
        set.into_iter().map(str::to_owned).collect()
    }
}

/// Parse one CSV line of a RECORD file (fields may be double-quoted).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if cur.is_empty() => quoted = true,
            (',', false) => out.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Read a wheel, verify every file against RECORD (sha256 and size), and map it to lib-dir
/// paths: `*.data/purelib/` and `*.data/platlib/` are relocated to the top; other `*.data/`
/// parts (scripts, headers, data) are not library files and are dropped.
pub(crate) fn read_wheel(path: &Path) -> Result<Distribution> {
    let fname = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let what = |cause: &str| FetchError::invalid(format!("wheel {}", path.display()), cause);
    let stem = fname
        .strip_suffix(".whl")
        .ok_or_else(|| what("not a .whl file"))?;
    let parts: Vec<&str> = stem.split('-').collect();
    if parts.len() < 5 {
        return Err(what("file name is not NAME-VERSION-PY-ABI-PLATFORM.whl"));
    }
    let (dist, version) = (parts[0], parts[1]);
    let file = std::fs::File::open(path).ctx("open", path)?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| what(&e.to_string()))?;
    let mut raw: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| what(&e.to_string()))?;
        if entry.is_dir() {
            continue;
        }
        let name = entry.name().to_owned();
        check_rel_path(&name)?;
        let mut data = Vec::with_capacity(entry.size() as usize);
        entry
            .read_to_end(&mut data)
            .map_err(|e| what(&format!("{name}: {e}")))?;
        if raw.insert(name.clone(), data).is_some() {
            return Err(what(&format!("{name} appears twice")));
        }
    }
    let dist_info: BTreeSet<&str> = raw
        .keys()
        .filter_map(|p| p.split_once('/').map(|(d, _)| d))
        .filter(|d| d.ends_with(".dist-info"))
        .collect();
    let [dist_info] = dist_info.into_iter().collect::<Vec<_>>()[..] else {
        return Err(what("expected exactly one top-level .dist-info directory"));
    };
    let record_path = format!("{dist_info}/RECORD");
    let record = raw
        .get(&record_path)
        .ok_or_else(|| what("no .dist-info/RECORD"))?;
    let record = String::from_utf8_lossy(record).into_owned();
    let mut listed = BTreeSet::new();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    for line in record.lines().filter(|l| !l.trim().is_empty()) {
        let f = csv_fields(line);
        let p = f.first().map(String::as_str).unwrap_or("");
        let hash = f.get(1).map(String::as_str).unwrap_or("");
        let size = f.get(2).map(String::as_str).unwrap_or("");
        listed.insert(p.to_owned());
        if hash.is_empty() {
            // Only RECORD itself (and its signatures) may go unhashed.
            if p == record_path
                || p == format!("{record_path}.jws")
                || p == format!("{record_path}.p7s")
            {
                continue;
            }
            return Err(FetchError::IntegrityMismatch {
                file: format!("{fname}:{p}"),
                expected: "a sha256 in RECORD".into(),
                got: "no hash".into(),
            });
        }
        let expected = hash.strip_prefix("sha256=").ok_or_else(|| {
            what(&format!(
                "{p}: unsupported RECORD hash {hash:?} (only sha256)"
            ))
        })?;
        let data = raw.get(p).ok_or_else(|| FetchError::IntegrityMismatch {
            file: format!("{fname}:{p}"),
            expected: format!("present (RECORD sha256={expected})"),
            got: "missing from the wheel".into(),
        })?;
        let got = b64.encode(Sha256::digest(data));
        let size_ok = size.is_empty() || size.parse::<u64>().ok() == Some(data.len() as u64);
        if got != expected.trim_end_matches('=') || !size_ok {
            return Err(FetchError::IntegrityMismatch {
                file: format!("{fname}:{p}"),
                expected: format!("sha256={expected} size {size}"),
                got: format!("sha256={got} size {}", data.len()),
            });
        }
    }
    for p in raw.keys() {
        if !listed.contains(p) && !p.starts_with(&format!("{dist_info}/RECORD.")) {
            return Err(FetchError::IntegrityMismatch {
                file: format!("{fname}:{p}"),
                expected: "listed in RECORD".into(),
                got: "not listed".into(),
            });
        }
    }
    let data_dir = format!("{}.data/", dist_info.trim_end_matches(".dist-info"));
    let mut files = BTreeMap::new();
    for (p, data) in raw {
        let target = match p.strip_prefix(&data_dir) {
            Some(rest) => match rest
                .strip_prefix("purelib/")
                .or_else(|| rest.strip_prefix("platlib/"))
            {
                Some(lib) => lib.to_owned(),
                None => continue,
            },
            None => p,
        };
        check_rel_path(&target)?;
        if files.insert(target.clone(), data).is_some() {
            return Err(what(&format!(
                "{target} appears twice after relocating .data"
            )));
        }
    }
    Ok(Distribution {
        name: normalize_dist_name(dist),
        version: version.to_owned(),
        source: fname,
        files,
    })
}

fn read_tree(root: &Path, rel: &str, out: &mut BTreeMap<String, Vec<u8>>) -> Result<()> {
    let dir = if rel.is_empty() {
        root.to_owned()
    } else {
        root.join(rel)
    };
    for e in std::fs::read_dir(&dir).ctx("list", &dir)? {
        let e = e.ctx("list", &dir)?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "__pycache__" {
            continue;
        }
        let p = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let ft = e.file_type().ctx("stat", e.path())?;
        if ft.is_symlink() {
            return Err(FetchError::invalid(
                format!("{}", e.path().display()),
                "symbolic links cannot be published; copy the target instead",
            ));
        } else if ft.is_dir() {
            read_tree(root, &p, out)?;
        } else if ft.is_file() {
            check_rel_path(&p)?;
            out.insert(p, std::fs::read(e.path()).ctx("read", e.path())?);
        }
    }
    Ok(())
}

/// Read a plain package directory (or a single module).
///
/// * A module file (`NAME.py`) is one distribution named after it (version `0`).
/// * A directory with `__init__.py` is one package named after the directory (version `0`).
/// * Otherwise it is a site-packages-like directory: each `*.dist-info` with a RECORD groups the
///   top-level entries its RECORD names into one distribution; every other top-level entry is a
///   distribution of its own (version `0`).
pub(crate) fn read_package_dir(dir: &Path) -> Result<Vec<Distribution>> {
    if dir.is_file() {
        return read_module(dir).map(|d| vec![d]);
    }
    let base = dir
        .canonicalize()
        .ctx("resolve", dir)?
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    if dir.join("__init__.py").is_file() {
        let mut inner = BTreeMap::new();
        read_tree(dir, "", &mut inner)?;
        let files = inner
            .into_iter()
            .map(|(p, d)| (format!("{base}/{p}"), d))
            .collect();
        return Ok(vec![Distribution {
            name: normalize_dist_name(&base),
            version: "0".into(),
            source: format!("{}", dir.display()),
            files,
        }]);
    }
    let mut all = BTreeMap::new();
    read_tree(dir, "", &mut all)?;
    let mut owner: BTreeMap<String, (String, String)> = BTreeMap::new(); // entry -> (dist, version)
    for (p, data) in &all {
        let Some(info) = p.strip_suffix(".dist-info/RECORD") else {
            continue;
        };
        if info.contains('/') {
            continue;
        }
        let (dist, version) = info.split_once('-').unwrap_or((info, "0"));
        let dist = normalize_dist_name(dist);
        owner.insert(
            format!("{info}.dist-info"),
            (dist.clone(), version.to_owned()),
        );
        for line in String::from_utf8_lossy(data).lines() {
            let f = csv_fields(line);
            if let Some(top) = f.first().and_then(|p| p.split('/').next()) {
                if !top.is_empty()
                    && top != ".."
                    && all
                        .keys()
                        .any(|k| k == top || k.starts_with(&format!("{top}/")))
                {
                    owner
                        .entry(top.to_owned())
                        .or_insert((dist.clone(), version.to_owned()));
                }
            }
        }
    }
    let mut dists: BTreeMap<String, Distribution> = BTreeMap::new();
    for (p, data) in all {
        let top = p.split('/').next().unwrap_or(&p).to_owned();
        let (dist, version) = owner.get(&top).cloned().unwrap_or_else(|| {
            let stem = top.split('.').next().unwrap_or(&top);
            (normalize_dist_name(stem), "0".to_owned())
        });
        dists
            .entry(dist.clone())
            .or_insert_with(|| Distribution {
                name: dist,
                version,
                source: format!("{}", dir.display()),
                files: BTreeMap::new(),
            })
            .files
            .insert(p, data);
    }
    if dists.is_empty() {
        return Err(FetchError::invalid(
            format!("{}", dir.display()),
            "no files to publish",
        ));
    }
    Ok(dists.into_values().collect())
}

/// A single-file module (`mymod.py`): a distribution of that name with the one file.
fn read_module(path: &Path) -> Result<Distribution> {
    let name = path.file_name().map(|f| f.to_string_lossy().into_owned());
    let Some(stem) = name.as_deref().and_then(|n| n.strip_suffix(".py")) else {
        return Err(FetchError::invalid(
            format!("{}", path.display()),
            "a file to publish as a package must be a module (NAME.py)",
        ));
    };
    let file = format!("{stem}.py");
    check_rel_path(&file)?;
    let data = std::fs::read(path).ctx("read", path)?;
    Ok(Distribution {
        name: normalize_dist_name(stem),
        version: "0".into(),
        source: format!("{}", path.display()),
        files: BTreeMap::from([(file, data)]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_module_is_a_distribution_of_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("My_Mod.py");
        std::fs::write(&m, b"X = 1\n").unwrap();
        let d = read_package_dir(&m).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].name, normalize_dist_name("My_Mod"));
        assert_eq!(d[0].files.keys().collect::<Vec<_>>(), ["My_Mod.py"]);
        assert_eq!(d[0].files["My_Mod.py"], b"X = 1\n");
        let other = dir.path().join("notes.md");
        std::fs::write(&other, b"").unwrap();
        assert!(read_package_dir(&other).is_err());
    }

    #[test]
    fn csv_quotes() {
        assert_eq!(csv_fields("a,b,c"), vec!["a", "b", "c"]);
        assert_eq!(
            csv_fields("\"x,y\",sha256=abc,12"),
            vec!["x,y", "sha256=abc", "12"]
        );
        assert_eq!(csv_fields("p/RECORD,,"), vec!["p/RECORD", "", ""]);
    }
}
