//! One run, top to bottom: the program found, the realm shown ([`realmfs::show()`]), the profile
//! compiled ([`crate::compiled`]), the σOS API made, the jail's spec built, the target prepared
//! and spawned ([`crate::spawn`]), the resolver started, then the event loop
//! ([`crate::supervisor::supervise`]) until the proc ends, and what the run ends with.
#![forbid(unsafe_code)]

use crate::cli::{Cli, Pin};
use crate::failure::Failure;
use crate::{
    compiled, container, handlers, readonly, serve, sigma_api, spawn, stats, supervisor, sys,
    trampoline,
};
use std::ffi::OsString;
use std::path::PathBuf;

/// `--trace FILE` (without `=`) is `--trace` to stderr with FILE as the program: when that
/// program is not found, say how to name the file.
fn trace_hint(f: Failure, cli: &Cli) -> Failure {
    let args: Vec<OsString> = std::env::args_os().collect();
    let after_trace = args
        .windows(2)
        .any(|w| w[0] == "--trace" && w[1] == cli.command[0]);
    if f.code == 127 && cli.trace.as_deref() == Some(std::path::Path::new("-")) && after_trace {
        let error = anyhow::anyhow!("{} (--trace takes its file as --trace=FILE)", f.error);
        return Failure { error, code: 127 };
    }
    f
}

/// The processes a pool's zygote and all its procs may have together (each proc has the
/// run's own `--pids` in a user namespace of its own).
const ZYGOTE_PIDS: u64 = 1 << 16;

/// One run of PROGRAM under the supervisor, as `cli` asks (and, in trampoline mode, its
/// `plan`): how it ended.
pub fn run(mut cli: Cli, mut plan: Option<trampoline::Plan>) -> Result<jail::init::Ended, Failure> {
    // A pool's zygote: no working directory, no Landlock (its children apply their own), no
    // σOS server (each proc's client serves its own).
    let zygote = cli.zygote_ctl;
    if let Some(n) = zygote {
        cli.jail.cwd = container::CwdArg::None;
        cli.jail.no_landlock = true;
        cli.sigma.sigma = Some(sigma_api::SigmaMode::Off);
        // Its procs' limit is each one's own (see the pool's zygote.py); this one bounds them all.
        cli.jail.pids = ZYGOTE_PIDS;
        cli.pass_fd.push(n);
    }
    // Trampoline mode: the proc's binary, read from binfs into a memfd.
    let memfd = plan.as_ref().and_then(trampoline::Plan::exec_path);
    let program = match memfd {
        Some(memfd) => memfd,
        None => spawn::find_program(&cli.command[0]).map_err(|f| trace_hint(f, &cli))?,
    };
    // A realm is mounted, or shown by the lazy backend, or its lib dir is one more served dir
    // (see realmfs); its prefix is on the target's PYTHONPATH.
    let realm = realmfs::show(
        &cli.realm,
        &program,
        &cli.command,
        !cli.jail.no_jail,
        handlers::signal::register_helper,
    )?;
    let mut serves = cli.serve.clone();
    if let Some(r) = &realm {
        serves.extend(r.serve_rule());
        std::env::set_var(
            "PYTHONPATH",
            r.pythonpath(std::env::var_os("PYTHONPATH").as_deref()),
        );
    }
    jail::mark("realm");
    let trace = stats::TraceSink::open(cli.trace.as_deref())?;
    // The compiled profiles' cache and the embedded server's scratch; none in a home that does
    // not exist.
    let cache_root = cli
        .realm
        .cache_dir
        .clone()
        .or_else(fetcher::default_cache_root_if_home);
    // Tracing or counting in the jail: writes it refuses as read-only are explained.
    let hints = !cli.jail.no_jail && (trace.is_some() || cli.stats);
    let compiled::Compiled {
        policy,
        elide,
        filter,
        guard,
        sendmsg_allowed,
        execve_allowed,
        cached,
    } = compiled::compile(
        &compiled::Options {
            profile: &cli.profile,
            serves: &serves,
            audit: cli.audit,
            jailed: !cli.jail.no_jail,
            notify_paths: cli.always_notify || trace.is_some(),
            read_only_hints: hints,
            own_net: cli.jail.net == crate::container::NetArg::None,
        },
        cache_root.as_deref(),
    )?;
    let filter = match zygote {
        Some(_) => compiled::for_zygote(&policy, elide)?,
        None => filter,
    };
    tracing::debug!(cached, "profile {} compiled", cli.profile);
    jail::mark("policy");
    // One CPU for both the target and the notification thread (chosen once).
    let pin_cpu = match cli.pin {
        Pin::Off => None,
        Pin::Auto if !sys::is_realtime() => None,
        Pin::Auto | Pin::Shared => sys::current_cpu(),
    };
    if elide {
        tracing::info!("no path rule and no --trace: path calls run without notification");
        if hints {
            tracing::info!("--stats: calls that write stay notified for the read-only hint");
        }
    }
    let mut api =
        sigma_api::SigmaApi::from_opts(&cli.sigma, &cli.realm.realm, cache_root.as_deref())?;
    jail::mark("api");
    let s3_dir = match &cli.sigma.s3 {
        sigma_api::S3Backend::Dir(d) => Some(format!("file://{}", d.display())),
        sigma_api::S3Backend::Aws => None,
    };
    let hidden = container::supervisor_paths(
        cli.realm.cache_dir.as_deref(),
        cli.realm.bucket.as_deref(),
        s3_dir.as_deref(),
        cli.sigma.scratch_dir.as_deref(),
    );
    let mut jail = cli.jail.spec(&program, &cli.command, &hidden, cli.grace)?;
    if let (Some(t), Some(spec)) = (&plan, jail.as_mut()) {
        t.shape(spec);
    }
    if let (Some(_), Some(spec)) = (zygote, jail.as_mut()) {
        spec.proc_masked = false;
    }
    jail::mark("spec");
    // Where the jail shows host paths at their own names, for the hint of a failed run.
    let shown: Option<Vec<PathBuf>> = jail.as_ref().map(|s| {
        s.binds
            .iter()
            .filter(|b| b.src == b.dst)
            .map(|b| b.dst.clone())
            .collect()
    });
    let mut prepared = spawn::prepare(
        &program,
        &cli.command,
        &policy,
        spawn::Programs { filter, guard },
        pin_cpu,
        jail,
        &cli.pass_env,
    )?;
    prepared.home_inside_jail()?;
    // The lazy backend marks its image once the target exists, before the program may touch it.
    prepared.pass_listener(!realm.as_ref().is_some_and(|r| r.marks_image()) && sendmsg_allowed);
    if let Some((fd, number)) = api.take_target_end() {
        prepared.pass_fd(fd, spproxy::ENV_SPPROXY_FD, &number)?;
    }
    // σOS's Go client dials /tmp/spproxyd/spproxyd.sock itself: the jail shows the server there.
    if let Some((socket, at)) = prepared.jail().and_then(|_| api.jail_socket()) {
        prepared.bind_read_only(&socket, &at)?;
    }
    prepared.keep_inherited(&cli.pass_fd);
    if let Some(t) = &mut plan {
        t.hand_over(&mut prepared)?;
    }
    if let Some(r) = &realm {
        for (src, dst) in r.mounts()? {
            prepared.bind_read_only(&src, &dst)?;
        }
        prepared.hide_also(r.hidden())?;
    }
    jail::mark("prepared");
    let hints = prepared.jail().filter(|_| hints).map(|spec| {
        let map = readonly::JailMap::new(
            spec,
            cli.jail.cwd == container::CwdArg::Ro,
            cli.jail.withheld_cwd().map(|(dir, _)| dir).as_deref(),
            &cli.jail.bind_dsts(),
        );
        readonly::Hints::new(map)
    });
    let (mut child, start) = match (zygote, prepared.jail()) {
        // The zygote says its view to the pool, which matches runs against it.
        (Some(n), Some(spec)) => {
            let key =
                serde_json::to_vec(&jail::warm::ViewKey::of(spec)).map_err(anyhow::Error::from)?;
            sys::say_on_passed(n, &key).map_err(|e| anyhow::anyhow!("--zygote-ctl: {e}"))?;
            let child = spawn::spawn(prepared)?;
            return supervisor::wait_unheard(child, cli.grace, sigma_api::evict);
        }
        (Some(_), None) => return Err(anyhow::anyhow!("--zygote-ctl needs the jail").into()),
        (None, _) => spawn::warm_or_cold(
            prepared,
            sendmsg_allowed,
            (cli.warm, cli.stats),
            &cli.profile,
        )?,
    };
    api.jail_built();
    if let Some(r) = &realm {
        r.forked();
    }
    // Our memory holds credentials and our /proc files lead to the host: not dumpable, so no
    // process of the user's (a proc included) can read or ptrace them. (Only now: the jail's
    // id maps are written through our child's /proc files, which dumpability guards too.)
    let _ = nix::sys::prctl::set_dumpable(false);
    // Threads (the fetch runtime) only after fork; the child waits to be released.
    let resolver: Box<dyn serve::Resolver> = match realm {
        Some(r) => r.resolver(child.pid, !cli.jail.no_jail, || child.release())?,
        None => Box::new(serve::LocalDirs),
    };
    // The program loads while the realm server and the notification thread start.
    child.release();
    let mut on_demand = api.on_demand();
    on_demand.extend(plan.as_mut().and_then(trampoline::Plan::on_demand));
    let status = supervisor::supervise(
        child,
        policy,
        trace,
        cli.stats,
        pin_cpu,
        !cli.no_sync_wakeup,
        resolver,
        cli.grace,
        hints,
        on_demand,
        execve_allowed,
        sigma_api::evict,
    )?;
    if status.code() != 0 && plan.is_none() {
        if let (Some(shown), Ok(cwd)) = (&shown, std::env::current_dir()) {
            for p in jail::view::unshown_named(&cli.command, &cwd, shown, 3) {
                eprintln!(
                    "sigma-supervise: {} is named on the command line but not shown in the jail: \
                     --bind {0} shows it read-only (--bind-rw {0} writable)",
                    p.display()
                );
            }
        }
    }
    cli.stats
        .then(|| eprintln!("sigma-supervise: {}", start.line()));
    let end = api.finish(status, cli.stats, cli.sigma.require_started)?;
    match &plan {
        Some(t) => t.finish(end),
        None => Ok(end),
    }
}
