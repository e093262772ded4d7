//! The σcontainer options of `sigma-supervise` and the [`jail::JailSpec`] they describe: the
//! standard view ([`jail::ViewOptions`]) plus the user's binds, limits and identity, with the
//! supervisor's own state (cache, buckets, scratch) hidden wherever a bind would show it.
#![forbid(unsafe_code)]

use anyhow::{anyhow, Context as _};
use clap::ValueEnum;
use realmfs::confine::file_url_dir;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How the working directory appears in the proc's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CwdArg {
    /// Read-write, unless it is a home directory, a temporary directory every user shares or
    /// (started by root) a system directory: then not shown (the proc starts at its path, in an
    /// empty read-only directory holding only the files the command line names there).
    Auto,
    /// Read-write (the proc may write where the user chose to run it), wherever that is.
    Rw,
    /// Read-only.
    Ro,
    /// Not shown; the proc starts in `/`.
    None,
}

/// The proc's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetArg {
    /// A network namespace with loopback only.
    None,
    /// The host's network (the `sigmaos` profile has no socket(2) anyway).
    Host,
}

/// Options of the jail every proc runs in.
#[derive(Debug, Clone, clap::Args)]
pub struct JailOpts {
    /// Run without the σcontainer: the proc shares the host's namespaces, files and processes,
    /// confined by the seccomp list alone. For debugging only.
    #[arg(long)]
    pub no_jail: bool,

    /// Show host SRC read-only at DST (default: the same path) in the proc's root (repeatable).
    #[arg(long, value_name = "SRC[:DST]")]
    pub bind: Vec<String>,

    /// Show host SRC read-write at DST (default: the same path) (repeatable).
    #[arg(long, value_name = "SRC[:DST]")]
    pub bind_rw: Vec<String>,

    /// How the working directory appears in the proc's root.
    #[arg(long, value_enum, default_value_t = CwdArg::Auto)]
    pub cwd: CwdArg,

    /// `--cwd auto`'s decision ([`JailOpts::withheld_cwd`]).
    #[arg(skip)]
    withheld: std::sync::OnceLock<Option<(PathBuf, &'static str)>>,

    /// The proc's network.
    #[arg(long, value_enum, default_value_t = NetArg::None)]
    pub net: NetArg,

    /// The proc's uid inside its user namespace (its host uid is the supervisor's, or one of
    /// the proc's own when the supervisor is root).
    #[arg(long, value_name = "UID", default_value_t = 1000)]
    pub uid: u32,

    /// The proc's gid inside its user namespace.
    #[arg(long, value_name = "GID", default_value_t = 1000)]
    pub gid: u32,

    /// Most processes (and threads) the proc may have at once.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub pids: u64,

    /// Memory cap, e.g. 512M or 2G (needs a writable cgroup hierarchy).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,

    /// CPU cap in CPUs, e.g. 0.5 (needs a writable cgroup hierarchy).
    #[arg(long, value_name = "CPUS")]
    pub cpus: Option<f64>,

    /// Do not add Landlock as a second layer.
    #[arg(long, hide = true)]
    pub no_landlock: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n >= 1 << 20)
        .ok_or_else(|| format!("`{s}`: a size of at least 1M, like 512M or 2G"))
}

/// `SRC[:DST]` split; DST defaults to SRC.
fn split_bind(s: &str) -> (&str, Option<&str>) {
    match s.split_once(':') {
        Some((src, dst)) => (src, Some(dst)),
        None => (s, None),
    }
}

/// Where `--bind SRC[:DST]` shows its source: DST, else SRC itself (a relative SRC in its
/// absolute form, `data` → `$PWD/data`, as the host's working directory resolves it).
fn bind_dst(s: &str) -> PathBuf {
    match split_bind(s) {
        (_, Some(dst)) => PathBuf::from(dst),
        (src, None) => {
            let src = Path::new(src);
            if src.is_absolute() {
                src.to_path_buf()
            } else {
                std::fs::canonicalize(src).unwrap_or_else(|_| src.to_path_buf())
            }
        }
    }
}

fn parse_bind(s: &str, rw: bool) -> anyhow::Result<jail::Bind> {
    let flag = if rw { "--bind-rw" } else { "--bind" };
    let src =
        std::fs::canonicalize(split_bind(s).0).with_context(|| format!("{flag} {s}: source"))?;
    let dst = bind_dst(s);
    if !dst.is_absolute() {
        return Err(anyhow!(
            "{flag} {s}: the destination must be an absolute path"
        ));
    }
    let b = if rw {
        jail::Bind::rw(src)
    } else {
        jail::Bind::ro(src)
    };
    Ok(b.at(dst).idmapped())
}

impl JailOpts {
    /// Where the user's read-only `--bind`s are shown in the jail.
    pub fn bind_dsts(&self) -> Vec<PathBuf> {
        self.bind.iter().map(|b| bind_dst(b)).collect()
    }

    /// The working directory, when the default `--cwd auto` does not show it, and why: decided
    /// once per run (for the jail, its line on stderr and the hints).
    pub fn withheld_cwd(&self) -> Option<(PathBuf, &'static str)> {
        self.withheld
            .get_or_init(|| {
                if self.no_jail || self.cwd != CwdArg::Auto {
                    return None;
                }
                let cwd = std::env::current_dir().ok()?;
                let why = jail::view::cwd_withheld(&cwd)?;
                Some((cwd, why))
            })
            .clone()
    }

    /// The jail for this run, or `None` with `--no-jail` (after a warning).
    pub fn spec(
        &self,
        program: &Path,
        command: &[OsString],
        hidden: &[PathBuf],
        grace: Duration,
    ) -> anyhow::Result<Option<jail::JailSpec>> {
        if self.no_jail {
            eprintln!(
                "sigma-supervise: warning: --no-jail: the proc shares the host's files, \
                 processes and network, confined by the seccomp list alone"
            );
            return Ok(None);
        }
        let cwd = std::env::current_dir().context("current dir")?;
        let withheld = self.withheld_cwd();
        if let Some((dir, why)) = &withheld {
            eprintln!(
                "sigma-supervise: the working directory {} is {why}: the proc starts there \
                 without it, seeing only the files its command line names (--cwd rw shows it)",
                dir.display()
            );
        }
        let view = jail::ViewOptions {
            program: program.to_path_buf(),
            args: command.to_vec(),
            cwd,
            cwd_mode: match self.cwd {
                CwdArg::Auto if withheld.is_some() => jail::CwdMode::Withheld,
                CwdArg::Auto => jail::CwdMode::Rw,
                CwdArg::Rw => jail::CwdMode::Rw,
                CwdArg::Ro => jail::CwdMode::Ro,
                CwdArg::None => jail::CwdMode::None,
            },
            uid: self.uid,
            gid: self.gid,
        };
        let mut spec = view.spec();
        for b in &self.bind {
            spec.binds.push(parse_bind(b, false)?);
        }
        for b in &self.bind_rw {
            spec.binds.push(parse_bind(b, true)?);
        }
        spec.hides.extend(
            hidden
                .iter()
                .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())),
        );
        spec.net = match self.net {
            NetArg::None => jail::Net::Loopback,
            NetArg::Host => jail::Net::Host,
        };
        spec.limits = jail::Limits {
            pids: Some(self.pids),
            memory: self.memory,
            cpus: self.cpus,
        };
        // Landlock where the kernel has it (jail::host::landlock says the same to doctor).
        let abi = jail::landlock_abi();
        spec.landlock = !self.no_landlock && abi > 0;
        if !self.no_landlock {
            match abi {
                0 => eprintln!(
                    "sigma-supervise: warning: Landlock is not available on this kernel: the \
                     jail runs without its second layer"
                ),
                n if n < 6 => eprintln!(
                    "sigma-supervise: warning: Landlock ABI {n} (< 6): signals and abstract \
                     sockets are not scoped by Landlock (the pid and network namespaces still are)"
                ),
                _ => {}
            }
        }
        spec.grace = grace;
        Ok(Some(spec))
    }
}

/// Host paths that are the supervisor's and never the proc's: the cache root (every realm's
/// libraries and scratch), `file://` buckets, the embedded server's scratch.
pub fn supervisor_paths(
    cache_dir: Option<&Path>,
    bucket: Option<&str>,
    s3_dir: Option<&str>,
    scratch: Option<&Path>,
) -> Vec<PathBuf> {
    let mut v = vec![cache_dir
        .map(Path::to_path_buf)
        .unwrap_or_else(fetcher::default_cache_root)];
    v.extend(bucket.and_then(file_url_dir));
    v.extend(s3_dir.and_then(file_url_dir));
    v.extend(scratch.map(Path::to_path_buf));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_binds_parse() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("12").is_err());
        assert!(parse_size("x").is_err());
        let b = parse_bind("/usr:/opt/u", false).unwrap();
        assert_eq!(
            (b.src.as_path(), b.dst.as_path(), b.rw),
            (Path::new("/usr"), Path::new("/opt/u"), false)
        );
        assert!(parse_bind("/usr:rel", true).is_err());
        assert!(parse_bind("/no/such/src", true).is_err());
        // A relative source without a destination is shown where the host resolves it.
        let here = std::env::current_dir().unwrap();
        let name = here.file_name().unwrap().to_str().unwrap().to_owned();
        let rel = format!("../{name}");
        let b = parse_bind(&rel, true).unwrap();
        let real = std::fs::canonicalize(&here).unwrap();
        assert_eq!(
            (b.src.as_path(), b.dst.as_path(), b.rw),
            (&*real, &*real, true)
        );
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            jail: JailOpts,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(["x", "--bind", &rel]).unwrap();
        assert_eq!(cli.jail.bind_dsts(), [real]);
    }
}
