//! The compiled-profile cache. Parsing a profile (`sigmaos` is ~40 KB of TOML) and compiling its
//! seccomp programs with libseccomp cost more than building the whole jail, and the result
//! depends only on the profile's text, this program and a few options of the run. So it is kept
//! in the cache root (`filters/`, hidden from every proc like the rest of the cache): written
//! atomically, checked on read (a digest of the entry and its full key), and built again when
//! missing, stale or corrupt. Nothing here is trusted more than the cache root itself, which
//! only the user who runs the supervisor can write.
#![forbid(unsafe_code)]

use crate::{parse_serve_arg, Profile, Source};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::Path;

/// The options of a run that shape its policy and filter.
pub struct Options<'a> {
    /// Builtin name or TOML file.
    pub profile: &'a str,
    pub serves: &'a [String],
    pub audit: bool,
    /// The proc runs in the σcontainer (else signals are confined by the supervisor).
    pub jailed: bool,
    /// Path calls must be notified even without a path rule (`--always-notify`, `--trace`).
    pub notify_paths: bool,
    /// Calls that write are notified so a refusal as read-only can be explained.
    pub read_only_hints: bool,
    /// The proc has a network namespace of its own (jailed, not `--net host`): the profile's
    /// `needs = "own-net"` entries apply ([`Profile::for_run`]).
    pub own_net: bool,
}

/// One cache entry: the parsed profile and what compiling it gave.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Entry {
    pub key: String,
    pub profile: Profile,
    /// The profile's seccomp program, hex.
    pub filter: String,
    /// The jail's guard program (jailed runs), hex.
    pub guard: Option<String>,
    pub sendmsg_allowed: bool,
    pub execve_allowed: bool,
    pub root_fixed: bool,
    pub cwd_seen: bool,
}

/// Where the entry for `key` lives under the cache root.
pub fn entry_file(root: &Path, key: &str) -> std::path::PathBuf {
    root.join("filters").join(format!("{}.json", digest(key)))
}

/// Everything the entry depends on, spelled out (compared in full on read).
///
/// `exe` identifies this very program (a rebuild changes the handlers, the profile format, the
/// guard); `version` is its version.
pub fn key(opts: &Options, source: &Source, exe: &str, version: &str) -> String {
    let seccomp = libseccomp::ScmpVersion::current()
        .map(|v| format!("{}.{}.{}", v.major, v.minor, v.micro))
        .unwrap_or_default();
    let text = if source.builtin {
        "builtin".to_owned()
    } else {
        digest(&source.text)
    };
    // Only where a served dir appears shapes the program, not which host dir serves it: every
    // realm's lib dir shares one entry (the policy is built with the run's own serves).
    let served_at: Vec<String> = opts
        .serves
        .iter()
        .map(|s| match parse_serve_arg(s) {
            Ok((at, _)) => at.display().to_string(),
            // Refused when the policy is built; keyed as given meanwhile.
            Err(_) => s.clone(),
        })
        .collect();
    format!(
        "v6 {} exe={exe} libseccomp={seccomp} profile={:?} text={text} served_at={:?} audit={} \
         jailed={} notify_paths={} read_only_hints={} own_net={}",
        version,
        source.file,
        served_at,
        opts.audit,
        opts.jailed,
        opts.notify_paths,
        opts.read_only_hints,
        opts.own_net,
    )
}

/// A 128-bit digest for naming entries and catching corrupt ones (not a defence against
/// someone who can write the cache root: that user can replace this program too). SipHash
/// under two fixed keys: no CPU feature probing, ~1 GB/s.
pub fn digest(s: &str) -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let half = |k: u64| {
        let mut h =
            std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default().build_hasher();
        h.write_u64(k);
        h.write(s.as_bytes());
        h.finish()
    };
    format!(
        "{:016x}{:016x}",
        half(0x5349_474d_4131),
        half(0x5349_474d_4132)
    )
}

/// The largest entry read (a profile with every syscall is ~100 KB).
const MAX_ENTRY: u64 = 4 << 20;

/// The entry at `file` if it is whole (its digest matches) and made for `key`.
pub fn read(file: &Path, key: &str) -> Option<Entry> {
    use std::io::Read as _;
    let f = std::fs::File::open(file).ok()?;
    let len = f.metadata().ok()?.len();
    if len > MAX_ENTRY {
        return None;
    }
    // Sized once from the entry's length: one read, no growing (a third of a cached start).
    let mut data = String::with_capacity(len as usize + 1);
    f.take(MAX_ENTRY + 1).read_to_string(&mut data).ok()?;
    if data.len() as u64 > MAX_ENTRY {
        return None;
    }
    let (sum, body) = data.split_once('\n')?;
    if digest(body) != sum {
        tracing::debug!("compiled-profile cache entry {} is corrupt", file.display());
        return None;
    }
    let entry: Entry = serde_json::from_str(body).ok()?;
    (entry.key == key).then_some(entry)
}

/// Entries not written for this long go when another entry is made (a run that misses the
/// cache): those of earlier builds of this program, of options no longer used. An entry still
/// in use is only compiled again once.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Remove the entries beside `keep` last written more than `age` ago (best effort).
pub fn prune(keep: &Path, age: std::time::Duration) {
    let Some(dir) = keep.parent() else { return };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    for e in entries.flatten() {
        let path = e.path();
        let stale = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).is_ok_and(|d| d > age));
        if stale && path != keep && path.extension().is_some_and(|x| x == "json") {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Write `entry` at `file` (its directory made, private to the user), through `write_renamed`:
/// a temporary file in the same directory, renamed over the entry.
pub fn write(
    file: &Path,
    entry: &Entry,
    write_renamed: impl FnOnce(&Path, &[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = file
        .parent()
        .ok_or_else(|| std::io::Error::other("entry has no directory"))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let body = serde_json::to_string(entry)?;
    write_renamed(file, format!("{}\n{body}", digest(&body)).as_bytes())
}
