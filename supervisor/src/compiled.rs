//! Compiled profiles: the run's policy and seccomp programs, from the compiled-profile cache
//! ([`policies::compiled`]: an entry per profile text, this program and the options that shape
//! the filter) or built and stored there.
#![forbid(unsafe_code)]

use crate::policy::Policy;
use anyhow::Context as _;
use notify::CompiledFilter;
pub use policies::compiled::Options;
use policies::compiled::{self as cache, Entry, STALE_AFTER};
use std::path::Path;

/// What a run needs: the policy, whether path calls run un-notified, the profile's program
/// and the jail's guard (jailed runs only).
pub struct Compiled {
    pub policy: Policy,
    pub elide: bool,
    pub filter: CompiledFilter,
    pub guard: Option<jail::guard::Guard>,
    /// The filter allows sendmsg(2) outright: the jailed target can pass its listener with it
    /// (spawn's `Prepared::pass_listener`). Kept with the program: deciding it means building
    /// the whole filter spec (~50 µs).
    pub sendmsg_allowed: bool,
    /// The filter allows execve(2) outright: nothing is notified before the target's program
    /// runs, so the notification thread can wait for a first notification to start.
    pub execve_allowed: bool,
    /// Taken from the cache (for `-v`).
    pub cached: bool,
}

/// Load `opts.profile` and compile it, from the cache under `root` when an entry for exactly
/// these inputs is there. A cache that cannot be read or written only costs the compile.
pub fn compile(opts: &Options, root: Option<&Path>) -> anyhow::Result<Compiled> {
    let source = policies::source(opts.profile)?;
    // This very program (a rebuild changes the handlers, the profile format, the guard).
    let exe = std::fs::metadata("/proc/self/exe")
        .map(|m| fetcher::cache::identity(&m))
        .unwrap_or_default();
    let key = cache::key(opts, &source, &exe, env!("CARGO_PKG_VERSION"));
    let file = root.map(|r| cache::entry_file(r, &key));
    if let Some(entry) = file.as_deref().and_then(|f| cache::read(f, &key)) {
        if let Ok(c) = from_entry(opts, entry) {
            return Ok(c);
        }
    }
    // The entries this run's jail makes safe (`needs`), resolved before anything is built.
    let profile = source.parse()?.for_run(opts.jailed, opts.own_net);
    let (mut policy, elide) = policy_of(opts, profile.clone())?;
    let root_fixed = policy.root_is_fixed();
    policy.set_root_fixed(root_fixed);
    let spec = policy.filter_spec(elide);
    let cwd_seen = cwd_changes_seen(&spec);
    policy.set_cwd_changes_seen(cwd_seen);
    let sendmsg_allowed = spec.allows_outright("sendmsg");
    let execve_allowed = spec.allows_outright("execve");
    let filter = spec.compile().context("compiling the seccomp filter")?;
    let guard = if opts.jailed {
        Some(jail::guard::Guard::new().context("building the jail's seccomp guard")?)
    } else {
        None
    };
    if let Some(f) = &file {
        let entry = Entry {
            key,
            profile,
            filter: hex::encode(filter.to_bytes()),
            guard: guard.as_ref().map(|g| hex::encode(g.program().to_bytes())),
            sendmsg_allowed,
            execve_allowed,
            root_fixed,
            cwd_seen,
        };
        let write_renamed =
            |p: &Path, d: &[u8]| fetcher::cache::write_renamed(p, d).map_err(std::io::Error::other);
        if let Err(e) = cache::write(f, &entry, write_renamed) {
            tracing::debug!("not caching the compiled profile at {}: {e:#}", f.display());
        }
        cache::prune(f, STALE_AFTER);
    }
    Ok(Compiled {
        policy,
        elide,
        filter,
        guard,
        sendmsg_allowed,
        execve_allowed,
        cached: false,
    })
}

/// What a pool's zygote calls beyond its procs' profile, to complete each child's jail in the
/// child (the proc's own filter, stacked on it there, refuses each again):
/// - `unshare`, `setns`: the zygote's nested user namespace, and per child a pid, network,
///   IPC and UTS namespace made ahead and joined, and a mount namespace of its own;
/// - `mount`, `umount2`, `pivot_root`, `move_mount`: the child's root (a tmpfs with the
///   zygote's view bound in, the run's own binds attached as the client cloned them);
/// - `capset`, `prctl`: the child drops every capability of the nested namespace, and sets
///   no_new_privs and its securebits;
/// - `landlock_*`, `seccomp`: the child's Landlock and the proc's filter;
/// - `pidfd_open`, `pidfd_send_signal`: the child's pidfd for its client, a spare namespace's
///   init ended with its proc.
pub const ZYGOTE_CALLS: &[&str] = &[
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "capset",
    "prctl",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    "seccomp",
    "pidfd_open",
    "pidfd_send_signal",
];

/// A pool zygote's filter: the profile's, notifying nothing, with [`ZYGOTE_CALLS`].
pub fn for_zygote(policy: &Policy, elide: bool) -> anyhow::Result<CompiledFilter> {
    policy
        .filter_spec(elide)
        .for_forking(ZYGOTE_CALLS)
        .compile()
        .context("compiling the zygote's seccomp filter")
}

/// Whether the filter lets no target change its cwd unheard (chdir and fchdir notified or
/// refused): see [`notify::path::ProcView::set_cwd_changes_seen`].
fn cwd_changes_seen(spec: &notify::FilterSpec) -> bool {
    ["chdir", "fchdir"]
        .into_iter()
        .all(|n| spec.never_silent(n))
}

fn policy_of(opts: &Options, profile: policies::Profile) -> anyhow::Result<(Policy, bool)> {
    let mut policy =
        Policy::from_profile(profile, opts.serves, opts.audit, crate::handlers::handled())?;
    // In the σcontainer's PID namespace signals reach only the proc's own tree (the kernel's
    // job); without it the supervisor confines them.
    policy.set_jailed(opts.jailed);
    policy.set_read_only_hints(opts.read_only_hints);
    let elide = !opts.notify_paths && !policy.has_path_rules();
    Ok((policy, elide))
}

fn from_entry(opts: &Options, entry: Entry) -> anyhow::Result<Compiled> {
    let (mut policy, elide) = policy_of(opts, entry.profile)?;
    policy.set_root_fixed(entry.root_fixed);
    policy.set_cwd_changes_seen(entry.cwd_seen);
    let filter = CompiledFilter::from_bytes(&hex::decode(&entry.filter)?)?;
    let guard = match (&entry.guard, opts.jailed) {
        (Some(g), true) => Some(jail::guard::Guard::from_program(
            CompiledFilter::from_bytes(&hex::decode(g)?)?,
        )),
        (None, false) => None,
        _ => anyhow::bail!("guard does not match the key"),
    };
    Ok(Compiled {
        policy,
        elide,
        filter,
        guard,
        sendmsg_allowed: entry.sendmsg_allowed,
        execve_allowed: entry.execve_allowed,
        cached: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(profile: &str) -> Options<'_> {
        Options {
            profile,
            serves: &[],
            audit: false,
            jailed: true,
            notify_paths: false,
            read_only_hints: false,
            own_net: true,
        }
    }

    #[test]
    fn a_cached_entry_gives_the_same_programs_and_policy() {
        let dir = tempfile::tempdir().unwrap();
        let first = compile(&opts("sigmaos"), Some(dir.path())).unwrap();
        assert!(!first.cached);
        let again = compile(&opts("sigmaos"), Some(dir.path())).unwrap();
        assert!(again.cached);
        assert_eq!(first.filter.to_bytes(), again.filter.to_bytes());
        assert_eq!(
            first.guard.unwrap().program().to_bytes(),
            again.guard.unwrap().program().to_bytes()
        );
        assert_eq!(first.elide, again.elide);
        assert_eq!(
            (first.sendmsg_allowed, first.execve_allowed),
            (again.sendmsg_allowed, again.execve_allowed)
        );
        assert_eq!(
            first.policy.filter_spec(first.elide),
            again.policy.filter_spec(again.elide)
        );
        assert!(again.policy.root_is_fixed());
    }

    #[test]
    fn execve_is_notified_only_where_a_path_rule_needs_it() {
        let elided = compile(&opts("sigmaos"), None).unwrap();
        assert!(elided.elide && elided.execve_allowed && elided.sendmsg_allowed);
        let serves = vec!["/sigma/lib=/tmp".to_string()];
        let mut o = opts("sigmaos");
        o.serves = &serves;
        let served = compile(&o, None).unwrap();
        assert!(!served.elide && !served.execve_allowed);
    }

    #[test]
    fn each_option_has_its_own_entry() {
        let dir = tempfile::tempdir().unwrap();
        let plain = compile(&opts("sigmaos"), Some(dir.path())).unwrap();
        let mut o = opts("sigmaos");
        o.audit = true;
        let audit = compile(&o, Some(dir.path())).unwrap();
        assert!(!audit.cached, "a different option is not a hit");
        assert_ne!(plain.filter.to_bytes(), audit.filter.to_bytes());
        let mut o = opts("sigmaos");
        o.jailed = false;
        let bare = compile(&o, Some(dir.path())).unwrap();
        assert!(!bare.cached && bare.guard.is_none());
        assert_eq!(
            std::fs::read_dir(dir.path().join("filters"))
                .unwrap()
                .count(),
            3
        );
    }

    #[test]
    fn realms_served_from_different_dirs_share_one_entry_and_get_their_own_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let serve = |d: &std::path::Path| vec![format!("/sigma/lib={}", d.display())];
        let (sa, sb) = (serve(&a), serve(&b));
        let mut o = opts("sigmaos");
        o.serves = &sa;
        let first = compile(&o, Some(dir.path())).unwrap();
        assert!(!first.cached);
        o.serves = &sb;
        let second = compile(&o, Some(dir.path())).unwrap();
        assert!(second.cached, "another realm's lib dir is a hit");
        let fresh = compile(&o, None).unwrap();
        assert_eq!(second.filter.to_bytes(), fresh.filter.to_bytes());
        assert_eq!(
            second.policy.filter_spec(second.elide),
            fresh.policy.filter_spec(fresh.elide)
        );
        let served = |c: &Compiled| {
            c.policy
                .served()
                .iter()
                .map(|s| s.dir.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(served(&second), served(&fresh));
        assert_ne!(served(&second), served(&first));
    }

    #[test]
    fn entries_left_unwritten_for_long_go_when_another_is_made() {
        let dir = tempfile::tempdir().unwrap();
        compile(&opts("sigmaos"), Some(dir.path())).unwrap();
        let filters = dir.path().join("filters");
        let old = std::fs::read_dir(&filters)
            .unwrap()
            .flatten()
            .next()
            .unwrap()
            .path();
        let stray = filters.join("notes.txt");
        std::fs::write(&stray, "kept: not an entry").unwrap();
        let long_ago = std::time::SystemTime::now() - 2 * STALE_AFTER;
        for p in [&old, &stray] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        // A hit prunes nothing.
        assert!(compile(&opts("sigmaos"), Some(dir.path())).unwrap().cached);
        assert!(old.exists());
        // A miss (other options) makes its entry and removes the stale one.
        let mut o = opts("sigmaos");
        o.audit = true;
        assert!(!compile(&o, Some(dir.path())).unwrap().cached);
        assert!(!old.exists(), "a stale entry is removed");
        assert!(stray.exists(), "only entries are removed");
        assert_eq!(
            std::fs::read_dir(&filters)
                .unwrap()
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count(),
            1
        );
    }

    #[test]
    fn a_corrupt_or_truncated_entry_is_built_again() {
        let dir = tempfile::tempdir().unwrap();
        let good = compile(&opts("sigmaos"), Some(dir.path())).unwrap();
        let entry = std::fs::read_dir(dir.path().join("filters"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let text = std::fs::read_to_string(&entry).unwrap();
        // One flipped hex digit of the program: the digest no longer matches.
        let i = text.find("\"filter\":\"").unwrap() + 20;
        let mut bytes = text.clone().into_bytes();
        bytes[i] = if bytes[i] == b'0' { b'1' } else { b'0' };
        std::fs::write(&entry, &bytes).unwrap();
        let again = compile(&opts("sigmaos"), Some(dir.path())).unwrap();
        assert!(!again.cached);
        assert_eq!(good.filter.to_bytes(), again.filter.to_bytes());
        std::fs::write(&entry, &text[..text.len() / 2]).unwrap();
        assert!(!compile(&opts("sigmaos"), Some(dir.path())).unwrap().cached);
        assert!(compile(&opts("sigmaos"), Some(dir.path())).unwrap().cached);
    }

    #[test]
    fn a_profile_file_is_keyed_by_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.toml");
        let text = policies::source("permissive").unwrap().text.into_owned();
        std::fs::write(&file, &text).unwrap();
        let name = file.to_str().unwrap();
        let first = compile(&opts(name), Some(dir.path())).unwrap();
        assert!(compile(&opts(name), Some(dir.path())).unwrap().cached);
        // The same file, edited: the old entry is not used.
        let edited = text.replacen("action = \"allow\"", "action = \"kill\"", 1);
        assert_ne!(edited, text);
        std::fs::write(&file, &edited).unwrap();
        let second = compile(&opts(name), Some(dir.path())).unwrap();
        assert!(!second.cached);
        assert_ne!(first.filter.to_bytes(), second.filter.to_bytes());
        // A broken file is an error, cached entries notwithstanding.
        std::fs::write(&file, "name = ").unwrap();
        let err = compile(&opts(name), Some(dir.path())).err().unwrap();
        assert!(err.to_string().contains("p.toml"), "{err}");
    }

    #[test]
    fn no_cache_root_still_compiles() {
        let c = compile(&opts("sigmaos"), None).unwrap();
        assert!(!c.cached && c.guard.is_some());
    }
}
