//! Publishing: distributions → package archives → bucket, index last.
//!
//! Order matters: every archive is uploaded (and already-present ones checked) before the merged
//! index is written, so a reader never sees an index entry whose object is missing.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::config::FetchConfig;
use crate::error::{FetchError, IoContext, Result};
use crate::index::{Archive, Encoding, FileEntry, Index, Package, INDEX_KEY, PKG_PREFIX};
use crate::store::{get_bytes, Store};
use crate::wheel::{read_package_dir, read_wheel, Distribution};

/// zstd level for package archives (see README: level 3 keeps publish fast, decode ≫ network).
pub const ZSTD_LEVEL: i32 = 3;

/// What to publish.
#[derive(Debug, Clone)]
pub enum PublishSource {
    /// A requirements file: `python -m pip download --only-binary=:all: -r FILE` resolves the
    /// dependencies and brings binary wheels, which are then published.
    Requirements {
        file: PathBuf,
        /// Interpreter whose pip (and tags) to use; default `python3`.
        python: Option<PathBuf>,
    },
    /// One `.whl` file or a directory of them.
    Wheels(PathBuf),
    /// A plain package directory (with `__init__.py`) or a site-packages-like directory.
    PackageDir(PathBuf),
    /// All of these, published together (one import trace sees every one of them, so a
    /// package is traced with its dependencies present).
    Several(Vec<PublishSource>),
}

impl PublishSource {
    /// Guess the kind of `path`: `*.whl` or a directory containing wheels → wheels, a module
    /// (`*.py`) or any other directory → package directory, any other file (`*.txt`, `*.in`)
    /// → requirements.
    pub fn detect(path: &Path) -> Result<PublishSource> {
        let has_wheels = || {
            std::fs::read_dir(path).is_ok_and(|rd| {
                rd.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".whl"))
            })
        };
        if path.is_file() && path.extension().is_some_and(|e| e == "whl") {
            Ok(PublishSource::Wheels(path.to_owned()))
        } else if path.is_file() && path.extension().is_some_and(|e| e == "py") {
            Ok(PublishSource::PackageDir(path.to_owned()))
        } else if path.is_file() {
            Ok(PublishSource::Requirements {
                file: path.to_owned(),
                python: None,
            })
        } else if path.is_dir() && has_wheels() {
            Ok(PublishSource::Wheels(path.to_owned()))
        } else if path.is_dir() {
            Ok(PublishSource::PackageDir(path.to_owned()))
        } else {
            Err(FetchError::invalid(
                format!("{}", path.display()),
                "no such file or directory",
            ))
        }
    }
}

/// Runs the import trace (see [`PublishOptions::trace`]): given the interpreter, a directory
/// that must be visible to it (read-only is enough) and the interpreter's arguments, the
/// command to run. The supervisor's `publish` runs it in its jail, as a proc: importing a
/// package runs its code.
#[derive(Clone)]
pub struct TraceRunner(pub Arc<TraceCommand>);

/// See [`TraceRunner`].
pub type TraceCommand = dyn Fn(&Path, &Path, &[OsString]) -> std::process::Command + Send + Sync;

impl fmt::Debug for TraceRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TraceRunner")
    }
}

/// zstd frames of an archive hold this many bytes of tar each (entries may span frames):
/// independent pieces a reader decodes in parallel ([`crate::frames`]), the traced files in
/// frames of their own.
pub const FRAME_BYTES: usize = 4 << 20;

/// How [`publish_with`] builds archives.
#[derive(Debug, Clone, Default)]
pub struct PublishOptions {
    /// With `compile_with`: import each distribution's modules with that interpreter (through
    /// this runner) and record the files the import opens or maps, in order. Those files come
    /// first in the package's archive, so a cold import's files arrive first and a reader that
    /// is served file by file waits for little more than what it reads. `None`: path order.
    pub trace: Option<TraceRunner>,
    /// Interpreter that byte-compiles every module at publish time: unchecked-hash `.pyc` files
    /// for its cache tag go into the archive and the index, so a cold import in a realm reads
    /// bytecode instead of compiling (the target cannot write `__pycache__` in its lib dir).
    /// `None`: sources only.
    pub compile_with: Option<PathBuf>,
    /// With `compile_with`: a failure to run the interpreter fails the publish (true) or
    /// publishes sources only and says so in the report (false: the default `python3`).
    pub compile_required: bool,
    /// Write the old layout (one tar in 4 MiB zstd frames), which builds before the frame
    /// index can read; by default every file is a frame of its own behind an index.
    pub tar_layout: bool,
}

/// One published distribution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedPackage {
    pub name: String,
    pub version: String,
    pub top_level: Vec<String>,
    pub files: usize,
    pub unpacked_bytes: u64,
    pub archive_key: String,
    pub archive_bytes: u64,
    /// False if an identical archive was already in the bucket.
    pub uploaded: bool,
    /// Version it replaced in the index, if any.
    pub replaced: Option<String>,
    /// Cache tag of the shipped bytecode, if any.
    pub bytecode: Option<String>,
}

/// What [`publish`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    pub bucket: String,
    pub packages: Vec<PublishedPackage>,
    /// Bytes uploaded (archives + index).
    pub uploaded_bytes: u64,
    /// Distributions in the index after publishing.
    pub index_packages: usize,
    /// Why no bytecode was shipped, when compiling was asked for but not possible.
    pub bytecode_skipped: Option<String>,
}

impl fmt::Display for PublishReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.packages {
            writeln!(
                f,
                "{} {}: {} files{}, {} bytes -> {} ({} bytes{}){}",
                p.name,
                p.version,
                p.files,
                p.bytecode
                    .as_ref()
                    .map(|t| format!(" (bytecode {t})"))
                    .unwrap_or_default(),
                p.unpacked_bytes,
                p.archive_key,
                p.archive_bytes,
                if p.uploaded { "" } else { ", already present" },
                p.replaced
                    .as_ref()
                    .map(|v| format!(", replaces {v}"))
                    .unwrap_or_default()
            )?;
        }
        if let Some(why) = &self.bytecode_skipped {
            writeln!(f, "no bytecode shipped: {why}")?;
        }
        write!(
            f,
            "published {} package(s) to {}; {} bytes uploaded; index lists {} package(s)",
            self.packages.len(),
            self.bucket,
            self.uploaded_bytes,
            self.index_packages
        )
    }
}

/// Read the distributions of a source (running pip for requirements).
fn distributions(source: &PublishSource) -> Result<Vec<Distribution>> {
    match source {
        PublishSource::Requirements { file, python } => {
            let tmp =
                tempfile::tempdir().map_err(|e| FetchError::io("create temp dir", "/tmp", e))?;
            let python = python.clone().unwrap_or_else(|| PathBuf::from("python3"));
            let out = std::process::Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--only-binary=:all:",
                    "-d",
                ])
                .arg(tmp.path())
                .arg("-r")
                .arg(file)
                .output()
                .map_err(|e| FetchError::Command {
                    command: format!("{} -m pip download", python.display()),
                    cause: e.to_string(),
                })?;
            if !out.status.success() {
                return Err(FetchError::Command {
                    command: format!("pip download -r {}", file.display()),
                    cause: failure(&out),
                });
            }
            wheels_in(tmp.path())
        }
        PublishSource::Wheels(p) if p.is_file() => Ok(vec![read_wheel(p)?]),
        PublishSource::Wheels(dir) => wheels_in(dir),
        PublishSource::PackageDir(dir) => read_package_dir(dir),
        PublishSource::Several(all) => {
            let mut out = Vec::new();
            for s in all {
                out.extend(distributions(s)?);
            }
            Ok(out)
        }
    }
}

/// A failed command in one line: its status and the last line it wrote to stderr.
fn failure(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    format!("{}: {last}", out.status)
}

fn wheels_in(dir: &Path) -> Result<Vec<Distribution>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| FetchError::io("list", dir, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(FetchError::invalid(
            format!("{}", dir.display()),
            "no .whl files",
        ));
    }
    paths.iter().map(|p| read_wheel(p)).collect()
}

/// Compile every module in the directory given as `argv[1]`; print the interpreter's cache tag.
/// Compiled with a fixed `ddir`: the path each code object records is then the same whatever
/// temporary directory it was compiled in, so publishing a package twice makes the same
/// archive (the interpreter sets the real path when it loads the bytecode).
const COMPILE_SCRIPT: &str = "import compileall, py_compile, sys\n\
compileall.compile_dir(sys.argv[1], ddir='/sigma/lib', quiet=2, workers=0, \
invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n\
print(sys.implementation.cache_tag)\n";

/// True for paths in a distribution's metadata (`*.dist-info/`, `*.data/`), never imported.
fn is_metadata(path: &str) -> bool {
    let first = path.split('/').next().unwrap_or(path);
    first.ends_with(".dist-info") || first.ends_with(".data") || first.ends_with(".egg-info")
}

/// Byte-compile the distribution's modules with `python` (unchecked-hash, as the interpreter
/// would write them) and add the `.pyc` files next to the sources. Modules that do not compile
/// for this interpreter (templates, other versions' syntax) are left as sources, as pip does.
/// Returns the cache tag, or `None` if the distribution has no modules.
fn add_bytecode(dist: &mut Distribution, python: &Path) -> Result<Option<String>> {
    let sources: Vec<String> = dist
        .files
        .keys()
        .filter(|p| p.ends_with(".py") && !is_metadata(p))
        .cloned()
        .collect();
    if sources.is_empty() {
        return Ok(None);
    }
    let tmp = tempfile::tempdir().map_err(|e| FetchError::io("create temp dir", "/tmp", e))?;
    for p in &sources {
        let dst = tmp.path().join(p);
        if let Some(dir) = dst.parent() {
            std::fs::create_dir_all(dir).ctx("create dir", dir)?;
        }
        std::fs::write(&dst, &dist.files[p]).ctx("write", &dst)?;
    }
    let command = || format!("{} -m compileall", python.display());
    let out = std::process::Command::new(python)
        .args(["-I", "-c", COMPILE_SCRIPT])
        .arg(tmp.path())
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| FetchError::Command {
            command: command(),
            cause: e.to_string(),
        })?;
    let tag = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let tag_ok = !tag.is_empty()
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !out.status.success() || !tag_ok {
        return Err(FetchError::Command {
            command: command(),
            cause: failure(&out),
        });
    }
    for p in &sources {
        let (dir, file) = p.rsplit_once('/').map_or(("", p.as_str()), |(d, f)| (d, f));
        let stem = file.strip_suffix(".py").unwrap_or(file);
        let rel = if dir.is_empty() {
            format!("__pycache__/{stem}.{tag}.pyc")
        } else {
            format!("{dir}/__pycache__/{stem}.{tag}.pyc")
        };
        if dist.files.contains_key(&rel) {
            continue;
        }
        match std::fs::read(tmp.path().join(&rel)) {
            Ok(data) => {
                dist.files.insert(rel, data);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(FetchError::io("read", tmp.path().join(&rel), e)),
        }
    }
    Ok(Some(tag))
}

/// The import trace's script: `argv[1]` is the directory of every distribution being
/// published, `argv[2:]` the modules to import. Prints, in first-touch order, every file under
/// the directory that the imports opened (audit `open` events: sources, bytecode, data) or
/// that the loader mapped (extension modules and the libraries they need: `/proc/self/maps`
/// is read at each open, so a mapped file comes just before the first file opened after it
/// was loaded). A module that fails to import ends its part of the trace.
const TRACE_SCRIPT: &str = r#"import os, sys
root = os.path.realpath(sys.argv[1])
base = root + os.sep
seen = {}
busy = [False]
def touch(p):
    if p.startswith(base) and p not in seen:
        seen[p] = len(seen)
def scan_maps():
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6:
                touch(os.path.normpath(parts[5].strip()))
def hook(event, args):
    if event != "open" or busy[0] or not args or not isinstance(args[0], str):
        return
    busy[0] = True
    try:
        scan_maps()
        touch(os.path.normpath(os.path.join(root, args[0])))
    except Exception:
        pass
    finally:
        busy[0] = False
sys.addaudithook(hook)
sys.path.insert(0, root)
for name in sys.argv[2:]:
    try:
        __import__(name)
    except BaseException:
        pass
busy[0] = True
scan_maps()
for p in sorted(seen, key=seen.get):
    print(p[len(base):])
"#;

/// Import each distribution's top-level modules with `python` (through `runner`) in a
/// directory holding every distribution of this publish, and return, per distribution, its own
/// files in the order its import touched them, then those of its files that the other
/// distributions' imports touched (numpy's `numpy.random`, which `import numpy` leaves alone
/// and `import pandas` reads). Best effort: a distribution whose import fails or prints
/// nothing is archived in path order; only a runner that cannot start is an error.
fn trace_imports(
    dists: &[(Distribution, Option<String>)],
    python: &Path,
    runner: &TraceRunner,
) -> Result<Traces> {
    let tmp = tempfile::tempdir().map_err(|e| FetchError::io("create temp dir", "/tmp", e))?;
    let site = tmp.path().join("site");
    for (d, _) in dists {
        for (p, data) in &d.files {
            let dst = site.join(p);
            if let Some(dir) = dst.parent() {
                std::fs::create_dir_all(dir).ctx("create dir", dir)?;
            }
            std::fs::write(&dst, data).ctx("write", &dst)?;
        }
    }
    // Every file each import touched, by the distribution imported.
    let mut touched: Vec<(&str, Vec<String>)> = Vec::new();
    let mut traces = Traces::default();
    for (d, _) in dists {
        let modules: Vec<OsString> = d
            .top_level()
            .iter()
            .filter_map(|e| {
                let is_dir = d.files.keys().any(|p| p.starts_with(&format!("{e}/")));
                crate::index::import_name_of(e, is_dir).map(OsString::from)
            })
            .collect();
        if modules.is_empty() {
            continue;
        }
        let mut args: Vec<OsString> = ["-I", "-c", TRACE_SCRIPT].map(OsString::from).to_vec();
        args.push(site.clone().into_os_string());
        args.extend(modules);
        let mut cmd = (runner.0)(python, tmp.path(), &args);
        let out = run_bounded(&mut cmd, TRACE_TIMEOUT, TRACE_OUTPUT).map_err(|e| {
            FetchError::Command {
                command: format!("{} (import trace of {})", python.display(), d.name),
                cause: e.to_string(),
            }
        })?;
        // The loader stats a module's source before it reads the bytecode: the source first.
        let read: Vec<String> = String::from_utf8_lossy(&out)
            .lines()
            .flat_map(|p| [source_of_pyc(p), Some(p.to_owned())])
            .flatten()
            .collect();
        touched.push((d.name.as_str(), read));
    }
    // Which distribution each file is of (the first to list it).
    let mut owner: HashMap<&str, &str> = HashMap::new();
    for (d, _) in dists {
        for p in d.files.keys() {
            owner.entry(p.as_str()).or_insert(d.name.as_str());
        }
    }
    // Per distribution: the files its own import read, those the others' imports read of it
    // (in the order of the imports), and the other distributions its own import read.
    let mut own: HashMap<&str, Vec<String>> = HashMap::new();
    let mut by_others: HashMap<&str, Vec<String>> = HashMap::new();
    for (importer, read) in &touched {
        for p in read {
            let Some(&of) = owner.get(p.as_str()) else {
                continue;
            };
            if of == *importer {
                own.entry(of).or_default().push(p.clone());
                continue;
            }
            by_others.entry(of).or_default().push(p.clone());
            let reads = traces.reads.entry(importer.to_string()).or_default();
            if !reads.iter().any(|r| r == of) && reads.len() < crate::index::MAX_READS {
                reads.push(of.to_owned());
            }
        }
    }
    for (d, _) in dists {
        let mut first = own.remove(d.name.as_str()).unwrap_or_default();
        let by_itself = first.len();
        first.extend(by_others.remove(d.name.as_str()).unwrap_or_default());
        tracing::debug!(package = %d.name, files = by_itself, with_others = first.len(), "import trace");
        if !first.is_empty() {
            traces.first.insert(d.name.clone(), first);
        }
    }
    Ok(traces)
}

/// What the import traces of a publish found, per distribution: its files to put first
/// (see [`trace_imports`]) and the other distributions its import read.
#[derive(Default)]
struct Traces {
    first: HashMap<String, Vec<String>>,
    reads: HashMap<String, Vec<String>>,
}

/// How long one import trace may run: a package whose import blocks is traced up to here.
const TRACE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Bytes of an import trace's output read at most (the rest is dropped).
const TRACE_OUTPUT: u64 = 16 << 20;

/// Run `cmd` (stdin closed, stderr dropped) and return at most `cap` bytes of its stdout; a
/// run past `timeout` is killed and what it printed so far is returned.
fn run_bounded(
    cmd: &mut std::process::Command,
    timeout: std::time::Duration,
    cap: u64,
) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(s) = stdout {
            let mut s = s.take(cap);
            let _ = s.read_to_end(&mut out);
            // Whatever is left is drained, so the writer never blocks on a full pipe.
            let _ = std::io::copy(s.get_mut(), &mut std::io::sink());
        }
        out
    });
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    reader
        .join()
        .map_err(|_| std::io::Error::other("the trace's reader stopped"))
}

/// `dir/m.py` for `dir/__pycache__/m.TAG.pyc`.
fn source_of_pyc(path: &str) -> Option<String> {
    let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
    let dir = dir.strip_suffix("__pycache__")?;
    let stem = file.strip_suffix(".pyc")?.split('.').next()?;
    Some(format!("{dir}{stem}.py"))
}

/// Build the deterministic archive of a distribution: tar (sorted paths, mode 0644, mtime 0)
/// compressed with zstd. Returns the index entry and the archive bytes.
pub(crate) fn build_package(
    dist: &Distribution,
    encoding: Encoding,
    bytecode: Option<String>,
) -> Result<(Package, Bytes)> {
    build_package_ordered(dist, encoding, bytecode, &[])
}

/// [`build_package`] with the files named in `first` (an import trace) first, in that order,
/// then the rest in path order. [`Encoding::Frames`]: a frame per file behind the frame index
/// ([`crate::frame_index`]). Tar: compressed as independent zstd frames of [`FRAME_BYTES`] of
/// tar, counted from the start and again from the end of the traced files (so they end a
/// frame): together one zstd stream, and each frame declares its decoded size.
pub(crate) fn build_package_ordered(
    dist: &Distribution,
    encoding: Encoding,
    bytecode: Option<String>,
    first: &[String],
) -> Result<(Package, Bytes)> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut files = Vec::with_capacity(dist.files.len());
    let mut taken = std::collections::HashSet::new();
    let order = first
        .iter()
        .filter(|p| dist.files.contains_key(*p) && taken.insert(p.as_str()))
        .map(String::as_str)
        .collect::<Vec<_>>();
    let traced = order.len();
    let order = order.into_iter().chain(
        dist.files
            .keys()
            .map(String::as_str)
            .filter(|p| !taken.contains(p)),
    );
    if encoding == Encoding::Frames {
        let order: Vec<&str> = order.collect();
        let shas: Vec<[u8; 32]> = order
            .iter()
            .map(|p| Sha256::digest(&dist.files[*p]).into())
            .collect();
        let files = order
            .iter()
            .zip(&shas)
            .map(|(p, sha)| (*p, dist.files[*p].as_slice(), *sha));
        let bytes = crate::frame_index::build(files, ZSTD_LEVEL)
            .map_err(|e| FetchError::invalid(format!("compress {}", dist.name), e))?;
        let files = order.iter().zip(&shas).map(|(p, sha)| FileEntry {
            path: (*p).to_owned(),
            sha256: hex::encode(sha),
            size: dist.files[*p].len() as u64,
        });
        return Ok(package(
            dist,
            (encoding, bytes),
            files.collect(),
            bytecode,
            traced,
        ));
    }
    // Where the traced files end in the tar stream.
    let mut traced_end = 0usize;
    for (i, path) in order.enumerate() {
        let data = &dist.files[path];
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, path, data.as_slice())
            .map_err(|e| FetchError::invalid(format!("archive {}: {path}", dist.name), e))?;
        files.push(FileEntry {
            path: path.to_owned(),
            sha256: hex::encode(Sha256::digest(data)),
            size: data.len() as u64,
        });
        if i + 1 == traced {
            traced_end = tar.get_ref().len();
        }
    }
    let raw = tar
        .into_inner()
        .map_err(|e| FetchError::invalid(format!("archive {}", dist.name), e))?;
    let cuts: Vec<usize> = (FRAME_BYTES..traced_end)
        .step_by(FRAME_BYTES)
        .chain((traced_end > 0).then_some(traced_end))
        .chain((traced_end + FRAME_BYTES..raw.len()).step_by(FRAME_BYTES))
        .collect();
    let bytes = match encoding {
        Encoding::TarZstd | Encoding::Frames => compress_frames(&raw, &cuts, &dist.name)?,
        Encoding::Tar => raw,
    };
    Ok(package(dist, (encoding, bytes), files, bytecode, traced))
}

/// The index entry of `dist` archived as `bytes`, and the bytes.
fn package(
    dist: &Distribution,
    (encoding, bytes): (Encoding, Vec<u8>),
    mut files: Vec<FileEntry>,
    bytecode: Option<String>,
    traced: usize,
) -> (Package, Bytes) {
    // The index lists files in path order, whatever the archive's order.
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let ext = match encoding {
        Encoding::TarZstd => "tar.zst",
        Encoding::Tar => "tar",
        Encoding::Frames => "zsf",
    };
    let sha = hex::encode(Sha256::digest(&bytes));
    let pkg = Package {
        name: dist.name.clone(),
        version: dist.version.clone(),
        source: dist.source.clone(),
        top_level: dist.top_level(),
        archive: Archive {
            key: format!(
                "{PKG_PREFIX}{}-{}-{}.{ext}",
                dist.name,
                dist.version,
                &sha[..16]
            ),
            sha256: sha,
            size: bytes.len() as u64,
            encoding,
        },
        files,
        bytecode,
        traced: (traced > 0).then_some(traced as u64),
        reads: Vec::new(),
    };
    (pkg, Bytes::from(bytes))
}

/// `raw` compressed as one zstd frame per piece between `cuts` (and after the last cut).
fn compress_frames(raw: &[u8], cuts: &[usize], name: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&raw.len())) {
        if end <= start {
            continue;
        }
        let frame = zstd::bulk::compress(&raw[start..end], ZSTD_LEVEL)
            .map_err(|e| FetchError::invalid(format!("compress {name}"), e))?;
        out.extend_from_slice(&frame);
        start = end;
    }
    Ok(out)
}

/// Verify a wheel against its RECORD and build its package archive (index entry + bytes),
/// without uploading anything. Used by benchmarks and tools.
pub fn archive_wheel(path: &Path, encoding: Encoding) -> Result<(Package, Bytes)> {
    build_package(&read_wheel(path)?, encoding, None)
}

/// Read the bucket's index; a missing index is an empty one.
pub async fn read_index(store: &dyn Store, cfg: &FetchConfig) -> Result<Index> {
    match get_bytes(store, INDEX_KEY, cfg).await {
        Ok(data) => Index::from_json(store.name(), &data),
        Err(FetchError::NotFound { .. }) => Ok(Index::new()),
        Err(e) => Err(e),
    }
}

/// [`publish_with`] without bytecode.
pub async fn publish(
    store: &dyn Store,
    source: &PublishSource,
    cfg: &FetchConfig,
) -> Result<PublishReport> {
    publish_with(store, source, cfg, &PublishOptions::default()).await
}

/// Publish `source` to `store`: verify, byte-compile (if asked), archive, upload the archives,
/// then write the merged index. Nothing is uploaded if any distribution fails verification or
/// conflicts with a top-level name of another distribution in the index.
pub async fn publish_with(
    store: &dyn Store,
    source: &PublishSource,
    cfg: &FetchConfig,
    opts: &PublishOptions,
) -> Result<PublishReport> {
    // The bucket first: a wrong bucket fails before minutes of building.
    let mut index = read_index(store, cfg).await?;
    let (src, opts2) = (source.clone(), opts.clone());
    let (built, bytecode_skipped) = tokio::task::spawn_blocking(move || {
        let mut skipped = None;
        let mut dists = Vec::new();
        for mut d in distributions(&src)? {
            let mut tag = None;
            if let (Some(py), None) = (&opts2.compile_with, &skipped) {
                match add_bytecode(&mut d, py) {
                    Ok(t) => tag = t,
                    Err(e) if !opts2.compile_required => skipped = Some(e.to_string()),
                    Err(e) => return Err(e),
                }
            }
            dists.push((d, tag));
        }
        let traces = match (&opts2.compile_with, &opts2.trace, &skipped) {
            (Some(py), Some(runner), None) => trace_imports(&dists, py, runner)?,
            _ => Traces::default(),
        };
        let mut built = Vec::new();
        for (d, tag) in dists {
            let first = traces.first.get(&d.name).map_or(&[][..], Vec::as_slice);
            let encoding = match opts2.tar_layout {
                true => Encoding::TarZstd,
                false => Encoding::Frames,
            };
            let (mut pkg, bytes) = build_package_ordered(&d, encoding, tag, first)?;
            pkg.reads = traces.reads.get(&d.name).cloned().unwrap_or_default();
            built.push((pkg, bytes));
        }
        Ok::<_, FetchError>((built, skipped))
    })
    .await
    .map_err(|e| FetchError::invalid("publish", e))??;

    let mut report = PublishReport {
        bucket: store.name().to_owned(),
        bytecode_skipped,
        ..PublishReport::default()
    };
    let mut replaced = Vec::new();
    for (pkg, _) in &built {
        replaced.push(
            index
                .insert(store.name(), pkg.clone())?
                .map(|old| old.version),
        );
    }
    for ((pkg, bytes), replaced) in built.into_iter().zip(replaced) {
        let present = store.head(&pkg.archive.key).await? == Some(pkg.archive.size);
        if !present {
            store.put(&pkg.archive.key, bytes).await?;
            report.uploaded_bytes += pkg.archive.size;
        }
        report.packages.push(PublishedPackage {
            name: pkg.name.clone(),
            version: pkg.version.clone(),
            top_level: pkg.top_level.clone(),
            files: pkg.files.len(),
            unpacked_bytes: pkg.unpacked_size(),
            archive_key: pkg.archive.key.clone(),
            archive_bytes: pkg.archive.size,
            uploaded: !present,
            replaced,
            bytecode: pkg.bytecode.clone(),
        });
    }
    let json = index.to_json();
    report.uploaded_bytes += json.len() as u64;
    report.index_packages = index.packages().len();
    store.put(INDEX_KEY, Bytes::from(json)).await?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_trace_that_blocks_or_floods_is_cut_off() {
        let t = Instant::now();
        let out = run_bounded(
            std::process::Command::new("sh").args(["-c", "echo traced; exec sleep 30"]),
            Duration::from_millis(300),
            1 << 20,
        )
        .unwrap();
        assert_eq!(out, b"traced\n");
        assert!(t.elapsed() < Duration::from_secs(10), "killed at the bound");
        let out = run_bounded(
            std::process::Command::new("sh").args(["-c", "head -c 5000000 /dev/zero"]),
            Duration::from_secs(20),
            1000,
        )
        .unwrap();
        assert_eq!(out.len(), 1000, "at most the cap is kept");
    }

    #[test]
    fn the_source_of_a_bytecode_file() {
        assert_eq!(
            source_of_pyc("numpy/_core/__pycache__/multiarray.cpython-311.pyc").as_deref(),
            Some("numpy/_core/multiarray.py")
        );
        assert_eq!(
            source_of_pyc("__pycache__/six.cpython-311.pyc").as_deref(),
            Some("six.py")
        );
        assert_eq!(source_of_pyc("numpy/__init__.py"), None);
        assert_eq!(source_of_pyc("numpy/x.pyc"), None);
    }
}
