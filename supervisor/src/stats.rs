//! `--trace` lines and `--stats` counters. Counters are relaxed atomics written by the
//! notification thread only and read once at exit; trace lines are formatted only when tracing.
#![forbid(unsafe_code)]

use anyhow::Context as _;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What happened to one notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Path calls the kernel performs itself.
    Continue,
    /// A path rule's errno.
    Deny(i32),
    /// Performed by the supervisor under a served directory (or failed with this errno there).
    Serve(Option<i32>),
    /// A syscall outside the allow-list, answered with the profile's errno.
    Refused(i32),
    /// The call failed before a decision (bad pointer, target gone...).
    Error(i32),
    /// Continued, and the kernel will refuse it with EROFS: it writes where the jail shows a
    /// read-only directory (see `readonly.rs`).
    ReadOnly,
}

impl Decision {
    const KINDS: [&'static str; 6] = ["continue", "deny", "serve", "refused", "error", "read-only"];
    fn kind(self) -> usize {
        match self {
            Decision::Continue => 0,
            Decision::Deny(_) => 1,
            Decision::Serve(_) => 2,
            Decision::Refused(_) => 3,
            Decision::Error(_) => 4,
            Decision::ReadOnly => 5,
        }
    }
}

fn errno_name(e: i32) -> String {
    let s = format!("{:?}", nix::errno::Errno::from_raw(e));
    s
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Decision::Continue => f.write_str("continue"),
            Decision::Deny(e) => write!(f, "deny({})", errno_name(e)),
            Decision::Serve(None) => f.write_str("serve"),
            Decision::Serve(Some(e)) => write!(f, "serve({})", errno_name(e)),
            Decision::Refused(e) => write!(f, "refused({})", errno_name(e)),
            Decision::Error(e) => write!(f, "error({})", errno_name(e)),
            Decision::ReadOnly => f.write_str("continue(read-only in the jail)"),
        }
    }
}

pub const MAX_SYSCALL: usize = 512;

pub struct Stats {
    counts: Vec<[AtomicU64; Decision::KINDS.len()]>,
    nanos: AtomicU64,
    total: AtomicU64,
}

impl Stats {
    pub fn new() -> Self {
        Stats {
            counts: (0..MAX_SYSCALL).map(|_| Default::default()).collect(),
            nanos: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }

    pub fn record(&self, nr: i32, d: Decision, nanos: u64) {
        if let Some(row) = usize::try_from(nr).ok().and_then(|n| self.counts.get(n)) {
            row[d.kind()].fetch_add(1, Ordering::Relaxed);
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The `--stats` report: a header line, then `  <syscall> <decision> <count>` rows, most
    /// frequent first.
    pub fn report(&self, wall: std::time::Duration) -> String {
        let mut rows = Vec::new();
        for (nr, row) in self.counts.iter().enumerate() {
            for (k, c) in row.iter().enumerate() {
                let c = c.load(Ordering::Relaxed);
                if c > 0 {
                    rows.push((c, syscall_name(nr as i32), Decision::KINDS[k]));
                }
            }
        }
        rows.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let total = self.total.load(Ordering::Relaxed);
        let nanos = self.nanos.load(Ordering::Relaxed);
        let mut out = format!(
            "sigma-supervise stats: {total} notifications, {:.3} ms deciding, {:.3} ms wall\n",
            nanos as f64 / 1e6,
            wall.as_secs_f64() * 1e3
        );
        for (c, name, kind) in rows {
            let _ = writeln!(out, "  {name} {kind} {c}");
        }
        out
    }
}

/// The syscall's name on this architecture (`syscall_<nr>` if libseccomp does not know it).
pub fn syscall_name(nr: i32) -> String {
    libseccomp::ScmpSyscall::from(nr)
        .get_name()
        .unwrap_or_else(|_| format!("syscall_{nr}"))
}

/// Where `--trace` lines go.
pub struct TraceSink {
    out: Mutex<Box<dyn Write + Send>>,
}

/// Create (or truncate) the trace file: through no symlink, unless it lies in `/dev` or `/proc`
/// (`/dev/stderr`, `/dev/fd/N`). The supervisor may be root and the file in a directory a proc
/// was shown writable: a symlink planted there would have it overwrite whatever it points at.
fn create(target: &Path) -> anyhow::Result<std::fs::File> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let system = target.starts_with("/dev") || target.starts_with("/proc");
    let how = OpenHow::new()
        .flags(OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_CLOEXEC)
        .mode(nix::sys::stat::Mode::from_bits_truncate(0o644))
        .resolve(if system {
            ResolveFlag::empty()
        } else {
            ResolveFlag::RESOLVE_NO_SYMLINKS
        });
    match nix::fcntl::openat2(nix::fcntl::AT_FDCWD, target, how) {
        Ok(fd) => Ok(std::fs::File::from(fd)),
        Err(nix::errno::Errno::ELOOP) => Err(anyhow::anyhow!(
            "--trace: {} goes through a symlink (a proc may have planted it): give the real path",
            target.display()
        )),
        Err(e) => Err(anyhow::Error::from(e))
            .with_context(|| format!("--trace: cannot create {}", target.display())),
    }
}

impl TraceSink {
    pub fn open(target: Option<&Path>) -> anyhow::Result<Option<TraceSink>> {
        let Some(target) = target else {
            return Ok(None);
        };
        let out: Box<dyn Write + Send> = if target == Path::new("-") {
            Box::new(std::io::LineWriter::new(std::io::stderr()))
        } else {
            Box::new(std::io::BufWriter::new(create(target)?))
        };
        Ok(Some(TraceSink {
            out: Mutex::new(out),
        }))
    }

    /// `pid<TAB>syscall<TAB>path<TAB>decision<TAB>µs`; path is `-` for calls without one.
    pub fn line(&self, pid: u32, name: &str, path: Option<&Path>, d: Decision, micros: u64) {
        let mut line = String::with_capacity(128);
        let _ = write!(line, "{pid}\t{name}\t");
        match path {
            Some(p) => {
                for ch in p.to_string_lossy().chars() {
                    match ch {
                        '\t' => line.push_str("\\t"),
                        '\n' => line.push_str("\\n"),
                        '\\' => line.push_str("\\\\"),
                        c => line.push(c),
                    }
                }
            }
            None => line.push('-'),
        }
        let _ = writeln!(line, "\t{d}\t{micros}");
        if let Ok(mut out) = self.out.lock() {
            let _ = out.write_all(line.as_bytes());
        }
    }

    pub fn flush(&self) {
        if let Ok(mut out) = self.out.lock() {
            let _ = out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_display_with_errno_names() {
        assert_eq!(Decision::Continue.to_string(), "continue");
        assert_eq!(Decision::Deny(libc::EACCES).to_string(), "deny(EACCES)");
        assert_eq!(Decision::Serve(None).to_string(), "serve");
        assert_eq!(
            Decision::Serve(Some(libc::ENOENT)).to_string(),
            "serve(ENOENT)"
        );
        assert_eq!(Decision::Refused(libc::EPERM).to_string(), "refused(EPERM)");
        assert_eq!(
            Decision::ReadOnly.to_string(),
            "continue(read-only in the jail)"
        );
    }

    #[test]
    fn report_counts_per_syscall_and_decision() {
        let s = Stats::new();
        let openat = libc::SYS_openat as i32;
        let stat = libc::SYS_newfstatat as i32;
        for _ in 0..3 {
            s.record(stat, Decision::Continue, 1000);
        }
        s.record(openat, Decision::Serve(None), 2000);
        s.record(openat, Decision::Deny(libc::EACCES), 1000);
        let r = s.report(std::time::Duration::from_millis(10));
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(
            lines[0],
            "sigma-supervise stats: 5 notifications, 0.006 ms deciding, 10.000 ms wall"
        );
        assert_eq!(
            &lines[1..],
            [
                "  newfstatat continue 3",
                "  openat deny 1",
                "  openat serve 1"
            ]
        );
    }

    #[test]
    fn trace_line_escapes_tabs_and_newlines() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
        let t = TraceSink::open(Some(&f)).unwrap().unwrap();
        t.line(
            7,
            "openat",
            Some(Path::new("/a\tb\nc")),
            Decision::Continue,
            12,
        );
        t.line(7, "getppid", None, Decision::Refused(libc::EPERM), 1);
        t.flush();
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "7\topenat\t/a\\tb\\nc\tcontinue\t12\n7\tgetppid\t-\trefused(EPERM)\t1\n"
        );
    }
}
