//! What this host gives a realm, and [`findings`], the whole of `sigma-supervise doctor`: the
//! lazy backend a realm that is not completely installed gets, by the probes the run's choice
//! makes ([`crate::realm`]'s `backend.rs`: the image's pre-content mark, `mkfs.ext4`;
//! [`crate::fuse::unavailable`]), the cache root's filesystem, the bucket; [`jail::host`]'s
//! findings before them.
#![forbid(unsafe_code)]

use jail::host::Finding;
use std::path::{Path, PathBuf};

/// The nearest existing directory at or above `p`.
fn existing(p: &Path) -> PathBuf {
    p.ancestors()
        .find(|a| a.is_dir())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

/// Why root's run cannot have the ext4 image, if it cannot: `mkfs.ext4` (which the image's
/// preparer runs) and pre-content events on the cache root's mount (the image's own mark).
fn image_unavailable(cache_root: &Path) -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/sbin".into(), "/usr/sbin".into()]);
    if !dirs
        .into_iter()
        .any(|d: PathBuf| d.join("mkfs.ext4").exists())
    {
        return Some("mkfs.ext4 is not installed (package e2fsprogs)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop device (/dev/loop-control; module loop)".into());
    }
    crate::lazy::pre_content(&existing(cache_root))
        .err()
        .map(|e| format!("{e}; pre-content events need Linux 6.14"))
}

/// Fanotify's pre-content events, which root's lazy image is filled by, with the kernel's
/// release (Linux 6.14 has them).
pub fn pre_content(opts: &crate::realm::RealmOpts) -> Finding {
    let kernel = jail::host::kernel_release();
    let f = |ok, uses: String| Finding::new("fanotify pre-content", ok, uses);
    if !nix::unistd::geteuid().is_root() {
        return f(
            false,
            format!("Linux {kernel}; the image needs root (a loop mount, fanotify in the initial namespace): this user's realms use FUSE"),
        );
    }
    match image_unavailable(&cache_root(opts)) {
        None => f(
            true,
            format!("Linux {kernel}: root's realms get the ext4 image, filled on first touch"),
        ),
        Some(why) => f(false, format!("Linux {kernel}: no image ({why})"))
            .fix("Linux 6.14 or later, e2fsprogs, the loop module"),
    }
}

/// `fusermount3` and `/dev/fuse` for this user ([`crate::fuse::unavailable`]).
pub fn fuse() -> Finding {
    match crate::fuse::unavailable() {
        None => Finding::new(
            "FUSE",
            true,
            "fusermount3 and /dev/fuse usable: a realm's FUSE server can be mounted",
        ),
        Some(why) => {
            Finding::new("FUSE", false, why).fix("package fuse3; /dev/fuse mode 0666 (udev's)")
        }
    }
}

/// The backend a realm that is not completely installed is served by, from its second run
/// (its first fetches the index snapshot and is served by notification; `--lazy` tries at
/// once). Words as `--stats` prints them on the realm's line.
pub fn backend(opts: &crate::realm::RealmOpts, jailed: bool) -> Finding {
    let f = |ok, uses: String| Finding::new("realm backend", ok, uses);
    if opts.lazy == crate::realm::Lazy::Never {
        return f(
            true,
            "backend notification (lazy backend: off (--lazy=never))".into(),
        );
    }
    let cache_root = &cache_root(opts);
    let root = nix::unistd::geteuid().is_root();
    if !root && !jailed {
        return f(
            false,
            "backend notification (the lazy backend needs root or a jail)".into(),
        )
        .fix("user namespaces for this user (see above)");
    }
    let image_why = if root {
        match image_unavailable(cache_root) {
            None => {
                return f(
                    true,
                    "backend lazy (ext4 image, pre-content events) from a realm's second run; \
                     its first by notification"
                        .into(),
                )
                .fix("--lazy=never keeps notification")
            }
            Some(why) => Some(why),
        }
    } else {
        None
    };
    if !jailed {
        let why = image_why.unwrap_or_default();
        return f(
            false,
            format!("backend notification (no image: {why}; FUSE needs a jail)"),
        )
        .fix("Linux 6.14 and mkfs.ext4 for the image");
    }
    let note = image_why
        .as_ref()
        .map(|w| format!(", no image: {w}"))
        .unwrap_or_default();
    match crate::fuse::unavailable() {
        None => f(
            image_why.is_none(),
            format!(
                "backend lazy (FUSE{note}) from a realm's second run; its first by notification"
            ),
        )
        .fix(if root {
            "Linux 6.14 and mkfs.ext4 give root the ext4 image"
        } else {
            "root gets the ext4 image (Linux 6.14); --lazy=never keeps notification"
        }),
        Some(why) => f(false, format!("backend notification (FUSE: {why}{note})"))
            .fix("package fuse3 (fusermount3), /dev/fuse mode 0666"),
    }
}

/// The cache root's filesystem (the realms' libraries, their images' files, the filters).
pub fn cache_fs(cache_root: &Path) -> Finding {
    let at = existing(cache_root);
    // The magic numbers themselves (linux/magic.h): libcs differ in which they name (musl has
    // no XFS_SUPER_MAGIC), and in f_type's width.
    let kind = match nix::sys::statfs::statfs(&at).map(|st| st.filesystem_type()) {
        Err(e) => return Finding::new("cache root", false, format!("{}: {e}", at.display())),
        Ok(t) => match t.0 as u64 {
            0xEF53 => "ext4",
            0x0102_1994 => "tmpfs (lost at reboot)",
            0x5846_5342 => "xfs",
            0x9123_683E => "btrfs",
            0x794C_7630 => "overlayfs",
            0x6969 => "nfs (locks and hard links may not hold)",
            _ => {
                return Finding::new(
                    "cache root",
                    true,
                    format!("{} (filesystem {t:?})", cache_root.display()),
                )
            }
        },
    };
    let made = if at == cache_root {
        ""
    } else {
        ", made on first use"
    };
    Finding::new(
        "cache root",
        true,
        format!("{} on {kind}{made}", cache_root.display()),
    )
    .fix("--cache-dir DIR")
}

/// The cache root a run with `opts` uses (`--cache-dir`, else the default).
pub fn cache_root(opts: &crate::realm::RealmOpts) -> PathBuf {
    opts.cache_dir
        .clone()
        .unwrap_or_else(fetcher::default_cache_root)
}

/// The bucket `opts` names (`--bucket`, `SIGMA_LIB_BUCKET`), reached as a run's index snapshot
/// reaches it: the same store, credentials and `--fetch-timeout`, its index read and parsed
/// (nothing kept).
pub fn bucket(opts: &crate::realm::RealmOpts) -> Option<Finding> {
    use fetcher::store::{lazy::LazyStore, StoreOptions};
    let url = opts.bucket.as_deref()?;
    let cfg = fetcher::FetchConfig {
        overall_timeout: std::time::Duration::from_secs_f64(opts.fetch_timeout),
        ..fetcher::FetchConfig::default()
    };
    let got = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            let store =
                LazyStore::new(url, &StoreOptions::default(), &cfg).map_err(|e| e.to_string())?;
            let data = rt
                .block_on(fetcher::store::get_bytes(
                    &store,
                    fetcher::index::INDEX_KEY,
                    &cfg,
                ))
                .map_err(|e| e.to_string())?;
            fetcher::Index::from_json(url, &data).map_err(|e| e.to_string())
        });
    Some(match got {
        Ok(index) => Finding::new(
            "bucket",
            true,
            format!(
                "{url}: reachable, its index read ({} packages)",
                index.packages().len()
            ),
        ),
        Err(e) => Finding::new(
            "bucket",
            false,
            format!("{e}: a realm's imports fail (ImportError) within --fetch-timeout"),
        )
        .fix(if url.starts_with("s3://") {
            "AWS_ENDPOINT_URL, AWS_PROFILE or the standard AWS credentials; `sigma-supervise publish` makes the index"
        } else {
            "the directory must exist and be readable; `sigma-supervise publish` makes the index"
        }),
    })
}

/// Every finding of `sigma-supervise doctor` for a run with `opts`, in order, and whether a
/// proc can run at all here (jailed, with a seccomp listener).
pub fn findings(opts: &crate::realm::RealmOpts) -> (Vec<Finding>, bool) {
    use jail::host;
    let userns = host::userns();
    let jailed = userns.ok;
    let seccomp = host::seccomp();
    let runs = jailed
        && seccomp
            .iter()
            .all(|f| f.ok || f.feature != "seccomp user-notify");
    let root = cache_root(opts);
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let mut found = vec![userns, host::landlock()];
    found.extend(seccomp);
    found.extend([host::cgroup(), host::idmap(&cwd), cache_fs(&root)]);
    found.extend([pre_content(opts), fuse(), backend(opts, jailed)]);
    found.extend(bucket(opts));
    (found, runs)
}
