//! Optional cgroup limits (memory, CPU, pids) for one proc: a child group the supervisor creates
//! under the cgroup v2 hierarchy or the v1 controllers it can write to, removed when the proc
//! ends. Without a writable hierarchy, `RLIMIT_NPROC` (set in the target, counted per user in
//! the proc's own user namespace) still caps processes.
use crate::spec::Limits;
use std::path::{Path, PathBuf};

/// A created group: the `cgroup.procs` (or `tasks`) files to join, and the dirs to remove.
#[derive(Debug, Default)]
pub struct Cgroup {
    dirs: Vec<PathBuf>,
}

impl Cgroup {
    /// Create groups named `name` carrying `limits`. Returns `Ok(None)` when no limit needs a
    /// cgroup; an error names the controller that could not be used.
    pub fn create(name: &str, limits: &Limits) -> Result<Option<Cgroup>, String> {
        let mut wants: Vec<(&str, Vec<(String, String)>)> = Vec::new();
        if let Some(m) = limits.memory {
            wants.push((
                "memory",
                vec![
                    ("memory.max".into(), m.to_string()),
                    ("memory.limit_in_bytes".into(), m.to_string()),
                ],
            ));
        }
        if let Some(c) = limits.cpus {
            let period = 100_000u64;
            let quota = ((c * period as f64) as u64).max(1000);
            wants.push((
                "cpu",
                vec![
                    ("cpu.max".into(), format!("{quota} {period}")),
                    ("cpu.cfs_period_us".into(), period.to_string()),
                    ("cpu.cfs_quota_us".into(), quota.to_string()),
                ],
            ));
        }
        if wants.is_empty() {
            return Ok(None);
        }
        if let Some(p) = limits.pids {
            wants.push((
                "pids",
                vec![
                    ("pids.max".into(), p.to_string()),
                    ("pids.max".into(), p.to_string()),
                ],
            ));
        }
        let mut cg = Cgroup::default();
        for (ctrl, files) in wants {
            let (base, v2) = hierarchy(ctrl).ok_or_else(|| {
                format!(
                    "no writable cgroup hierarchy with the `{ctrl}` controller for --{ctrl} limits"
                )
            })?;
            let dir = base.join(name);
            if !cg.dirs.contains(&dir) {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("creating cgroup {}: {e}", dir.display()))?;
                cg.dirs.push(dir.clone());
            }
            let (file, value) = if v2 { &files[0] } else { &files[1] };
            let f = dir.join(file);
            std::fs::write(&f, value).map_err(|e| format!("writing {}: {e}", f.display()))?;
        }
        Ok(Some(cg))
    }

    /// Whether the kernel killed a process of the group for want of memory (`oom_kill` in
    /// v2's `memory.events` or v1's `memory.oom_control`): the proc reached its `--memory`.
    pub fn oom_killed(&self) -> bool {
        self.dirs.iter().any(|d| {
            ["memory.events", "memory.oom_control"].iter().any(|f| {
                std::fs::read_to_string(d.join(f)).is_ok_and(|s| {
                    s.lines().any(|l| {
                        l.strip_prefix("oom_kill ")
                            .and_then(|n| n.trim().parse::<u64>().ok())
                            .is_some_and(|n| n > 0)
                    })
                })
            })
        })
    }

    /// Move `pid` (and so its future descendants) into the groups.
    pub fn join(&self, pid: i32) -> Result<(), String> {
        for d in &self.dirs {
            let procs = if d.join("cgroup.procs").exists() {
                d.join("cgroup.procs")
            } else {
                d.join("tasks")
            };
            std::fs::write(&procs, pid.to_string())
                .map_err(|e| format!("joining cgroup {}: {e}", d.display()))?;
        }
        Ok(())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The hierarchy carrying `ctrl`: cgroup v2 at /sys/fs/cgroup when it lists the controller,
/// else the v1 mount of that controller.
pub(crate) fn hierarchy(ctrl: &str) -> Option<(PathBuf, bool)> {
    let v2 = Path::new("/sys/fs/cgroup");
    if let Ok(s) = std::fs::read_to_string(v2.join("cgroup.controllers")) {
        if s.split_whitespace().any(|c| c == ctrl) {
            return Some((v2.to_path_buf(), true));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == ctrl) {
            let p = PathBuf::from(f[1]);
            if nix::unistd::access(&p, nix::unistd::AccessFlags::W_OK).is_ok() {
                return Some((p, false));
            }
        }
    }
    None
}
