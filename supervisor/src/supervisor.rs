//! The event loop. A dedicated thread receives notifications eagerly and answers each on the
//! spot (continue/errno immediately; served opens/stats are a few host syscalls); anything slow
//! is handed to [`crate::serve::Deferred`] workers. The main thread reaps children (we are a
//! subreaper, so orphans come back to us), forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to the child,
//! and ends once every process using the filter is gone (no children left, listener POLLHUP).
//!
//! A proc ends when its program ends: once the main child has exited, the processes it left
//! behind get SIGTERM, and SIGKILL after the grace period, so no orphan holds the proc open.
#![forbid(unsafe_code)]

use crate::failure::Failure;
use crate::handlers::signal::{self, Tree};
use crate::handlers::{self, CallInfo, Context, Kind};
use crate::policy::Policy;
use crate::reply::{answer, Reply};
use crate::serve::Resolver;
use crate::spawn::{handled_signals, Child};
use crate::stats::{self, Decision, Stats, TraceSink, MAX_SYSCALL};
use crate::sys;
use anyhow::{anyhow, Context as _};
use jail::init::Ended;
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use notify::{Listener, Notification, Response};
use std::os::fd::AsFd as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::on_demand::OnDemand;

/// The loop's state: what the handlers share ([`Context`]) and what only the loop keeps.
struct Shared {
    cx: Arc<Context>,
    kinds: Vec<Option<Kind>>,
    /// Syscall names, built on first use (logging a denial, tracing).
    names: std::sync::OnceLock<Vec<String>>,
    stats: Stats,
    trace: Option<TraceSink>,
    /// No target can change its root: path resolution reads it once.
    root_fixed: bool,
    /// No target can change its cwd unheard (see `Policy::cwd_changes_seen`).
    cwd_seen: bool,
    /// The proc's process tree (signals without a jail are confined to it).
    tree: Tree,
    /// Notifications being handled: an answer may let the proc end before its call is counted
    /// and traced, so the run's end waits for this to drop to 0 before it reports.
    in_flight: std::sync::atomic::AtomicUsize,
}

/// Holds one notification in [`Shared::in_flight`] until dropped.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Shared {
    fn name(&self, nr: usize) -> &str {
        self.names
            .get_or_init(|| (0..MAX_SYSCALL as i32).map(stats::syscall_name).collect())
            .get(nr)
            .map_or("?", String::as_str)
    }
}

struct LoopState {
    info: CallInfo,
    refused_logged: Vec<bool>,
}

fn handle(sh: &Arc<Shared>, st: &mut LoopState, n: &Notification) {
    let _counted = InFlight::enter(&sh.in_flight);
    let t0 = sh.cx.timing.then(Instant::now);
    st.info.reset();
    st.info.task_seen(n.pid);
    let nr = usize::try_from(n.syscall).ok().filter(|&i| i < MAX_SYSCALL);
    let kind = nr.and_then(|i| sh.kinds[i]);
    let result = match kind {
        Some(Kind::Path(spec)) => handlers::path_call(&sh.cx, n, spec, &mut st.info),
        Some(Kind::Socket(call)) => handlers::socket::handle(&sh.cx, n, call, &mut st.info),
        Some(Kind::Signal(call)) => {
            let r = signal::handle(&sh.tree, n, call);
            st.info.decision = Some(match &r {
                Ok(Reply::Respond(Response::Continue(_))) => Decision::Continue,
                Ok(_) => Decision::Serve(None),
                Err(e) => Decision::Deny(*e as i32),
            });
            r
        }
        Some(Kind::Refused(errno)) => {
            if let Some(i) = nr {
                if !st.refused_logged[i] {
                    st.refused_logged[i] = true;
                    tracing::warn!("denied {} (pid {})", sh.name(i), n.pid);
                }
            }
            st.info.decision = Some(Decision::Refused(errno));
            Err(Errno::from_raw(errno))
        }
        None => {
            // The filter never notifies this; refuse loudly rather than guess.
            tracing::error!(
                "unexpected notification for syscall {} (pid {}): refused",
                n.syscall,
                n.pid
            );
            st.info.decision = Some(Decision::Refused(libc::EPERM));
            Err(Errno::EPERM)
        }
    };
    // Timed up to the answer: with SYNC_WAKE_UP the answer itself may run the target on this
    // CPU before the ioctl returns, which is the target's time, not ours.
    let nanos = t0.map(|t0| t0.elapsed().as_nanos() as u64);
    let delivered = answer(&sh.cx.listener, n.id, result);
    // A notification gone before its answer is not recorded: what was read for it may not
    // have been its target's (see `TargetMem::read_path_for_answer`).
    if let (Some(nanos), true) = (nanos, delivered) {
        let d = st.info.decision.unwrap_or(Decision::Continue);
        sh.stats.record(n.syscall, d, nanos);
        if let Some(tr) = &sh.trace {
            let name = nr.map_or("?", |i| sh.name(i));
            tr.line(n.pid, name, st.info.path.as_deref(), d, nanos / 1000);
        }
    }
}

fn receive_loop(sh: Arc<Shared>, pin_cpu: Option<usize>) {
    if let Some(cpu) = pin_cpu {
        let mut set = nix::sched::CpuSet::new();
        let r = set
            .set(cpu)
            .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
        if let Err(e) = r {
            tracing::warn!("pinning the notification thread to CPU {cpu}: {e}");
        }
    }
    let mut st = LoopState {
        info: CallInfo::new(sh.root_fixed, sh.cwd_seen),
        refused_logged: vec![false; MAX_SYSCALL],
    };
    loop {
        match sh.cx.listener.recv_or_hup() {
            Ok(Some(n)) => handle(&sh, &mut st, &n),
            Ok(None) => {
                tracing::debug!("no task uses the filter any more: receive loop ends");
                return;
            }
            Err(e) => {
                // Only a broken listener gets here; the main thread ends the run by reaping.
                tracing::warn!("receive loop ends: {e}");
                return;
            }
        }
    }
}

/// The notification thread, started on demand (see [`OnDemand`]).
struct NotifyThread {
    sh: Arc<Shared>,
    pin_cpu: Option<usize>,
}

impl NotifyThread {
    fn spawn(&self) -> std::io::Result<()> {
        let (sh, pin_cpu) = (Arc::clone(&self.sh), self.pin_cpu);
        std::thread::Builder::new()
            .name("sigma-notify".into())
            .spawn(move || receive_loop(sh, pin_cpu))
            .map(drop)
    }
}

impl std::os::fd::AsFd for NotifyThread {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sh.cx.listener.as_fd()
    }
}

impl OnDemand for NotifyThread {
    /// A notification waits: the thread starts. The listener hung up (no task uses the
    /// filter any more) without one: nothing to start.
    fn readable(self: Box<Self>) -> Option<Box<dyn OnDemand>> {
        use nix::poll::{PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(self.sh.cx.listener.as_fd(), PollFlags::POLLIN)];
        let revents = match nix::poll::poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => fds[0].revents().unwrap_or(PollFlags::empty()),
            Err(_) => PollFlags::POLLIN,
        };
        if !revents.contains(PollFlags::POLLIN) {
            // Nothing at all: a spurious wake-up, go on watching. A hang-up (or anything else
            // without a notification): never to be needed, and never to be polled again.
            return revents.is_empty().then_some(self as Box<dyn OnDemand>);
        }
        if let Err(e) = self.spawn() {
            // No thread to be had: answer here, until no task uses the filter (the reaping
            // waits meanwhile) rather than leave the target waiting for a decision.
            tracing::warn!("starting the notification thread: {e}; answering on the main thread");
            receive_loop(self.sh, self.pin_cpu);
        }
        None
    }
}

/// Reap until no child is left; forward terminating signals to the main child. Once the main
/// child has exited, what it left behind gets SIGTERM, then SIGKILL after `grace`.
///
/// With `only_main` (the main child is the jail's init) only it is waited for: once the init of
/// a pid namespace is gone, so is every process of the jail (init saw to the grace period), and
/// no process of the proc can be orphaned to us. Other children are the supervisor's own
/// helpers, which outlive it by design (the lazy backend's group holder).
///
/// `ended` is the jail init's pipe: the status it gives there is the answer, without waiting
/// for init's own exit (the namespaces' teardown), which is reaped by whoever inherits it.
///
/// `evict` is asked on the first SIGTERM: true when a proc that waits for eviction was told
/// (σOS's WaitEvict) and exits by itself; the signal is then not forwarded.
///
/// `on_demand` is work started only once its fd becomes readable (the notification thread,
/// the embedded σOS server's connection): a program that never needs it costs no thread.
///
/// `warm` is a warm proc's pidfd (not our child): signals are passed on by it.
#[allow(clippy::too_many_arguments)]
fn wait_all(
    main_pid: i32,
    grace: Duration,
    only_main: bool,
    mut ended: Option<std::os::fd::BorrowedFd<'_>>,
    wait_for_init: bool,
    mut on_demand: Vec<Box<dyn OnDemand>>,
    evict: fn() -> bool,
    warm: Option<std::os::fd::BorrowedFd<'_>>,
) -> anyhow::Result<Ended> {
    // init's report, kept while init itself is waited for (`wait_for_init`): its own exit
    // status cannot tell a signal from an exit status of 128+N.
    let mut reported = None;
    let set = handled_signals();
    let signals = nix::sys::signalfd::SignalFd::with_flags(
        &set,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
    )
    .context("signalfd")?;
    let tree = Tree {
        root: main_pid,
        supervisor: std::process::id() as i32,
    };
    let mut main_status = None;
    // When the leftovers get SIGKILL (set once SIGTERM went out); None before, or after.
    let mut kill_at: Option<Instant> = None;
    let mut terminated = false;
    loop {
        loop {
            let which = only_main.then_some(nix::unistd::Pid::from_raw(main_pid));
            match waitpid(which, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(status) => {
                    if status.pid().map(|p| p.as_raw()) == Some(main_pid) {
                        if let Some(e) = Ended::of(status) {
                            main_status = Some(e);
                            if only_main {
                                // init gone before its report was read: it is in the pipe.
                                if reported.is_none() {
                                    reported =
                                        ended.and_then(|fd| sys::read_report(fd).ok()).flatten();
                                }
                                return Ok(reported.unwrap_or(e));
                            }
                        }
                    }
                }
                Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) if ended.is_some() => break, // a warm proc: its report tells
                Err(Errno::ECHILD) => {
                    return main_status.ok_or_else(|| match warm {
                        // Its pid namespace ends with its zygote's.
                        Some(_) => anyhow!("the proc's zygote was killed, and the proc with it"),
                        None => anyhow!("lost the child's exit status"),
                    });
                }
                Err(e) => return Err(e).context("waitpid"),
            }
        }
        if main_status.is_some() && !terminated {
            terminated = true;
            let n = signal::signal_all(&tree, libc::SIGTERM);
            tracing::debug!("the program ended: SIGTERM to {n} leftover processes");
            kill_at = Some(Instant::now() + grace);
        }
        let left = kill_at.map(|at| at.saturating_duration_since(Instant::now()));
        let watch: Vec<_> = on_demand.iter().map(|w| w.as_fd()).collect();
        let waited = match sys::wait_signal_or_fds(&signals, ended, &watch, left) {
            Ok(sys::Woke::Signal(sig, code)) => Ok((sig, code)),
            Ok(sys::Woke::Report(Some(e))) if !wait_for_init => return Ok(e),
            Ok(sys::Woke::Report(Some(e))) => {
                reported = Some(e);
                ended = None;
                continue;
            }
            // init died without a word (killed): its reaping tells.
            Ok(sys::Woke::Report(None)) => {
                ended = None;
                continue;
            }
            Ok(sys::Woke::Ready(i)) => {
                drop(watch);
                let w = on_demand.swap_remove(i);
                if let Some(w) = w.readable() {
                    on_demand.push(w);
                }
                continue;
            }
            Ok(sys::Woke::Timeout) => Err(Errno::EAGAIN),
            Err(e) => Err(e),
        };
        let (sig, code) = match waited {
            Ok(v) => v,
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => {
                let n = signal::signal_all(&tree, libc::SIGKILL);
                tracing::debug!("grace period over: SIGKILL to {n} leftover processes");
                // Keep killing what the survivors may still fork, once per grace period.
                kill_at = Some(Instant::now() + grace.max(Duration::from_millis(100)));
                continue;
            }
            Err(e) => return Err(e).context("waiting for signals"),
        };
        if sig == libc::SIGCHLD {
            continue;
        }
        if main_status.is_some() {
            // Asked to stop while leftovers are in their grace period: no more grace.
            signal::signal_all(&tree, libc::SIGKILL);
            continue;
        }
        // The first SIGTERM evicts a proc that waits for eviction (σOS's WaitEvict): it
        // exits by itself. Otherwise, and after that, the signal is forwarded.
        if sig == libc::SIGTERM && evict() {
            continue;
        }
        // A warm proc is in no group of the terminal's: it gets every signal from us.
        if let Some(pidfd) = warm {
            let _ = pool::client::forward_signal(pidfd, sig);
            continue;
        }
        // A terminal's ^C reaches the whole foreground group (SI_KERNEL): the child has it.
        if code != libc::SI_KERNEL {
            if let Ok(s) = nix::sys::signal::Signal::try_from(sig) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(main_pid), s);
            }
        }
    }
}

/// Run the loop for `child` until every supervised process is gone; returns how the main child
/// ended. Processes left when the main child exits get
/// A pool's zygote (`--zygote-ctl`): its filter notifies nothing, and its listener is closed at
/// once, so that each proc it forks may install a listener of its own (the kernel allows one
/// per filter chain); then only its end is awaited.
pub fn wait_unheard(
    mut child: Child,
    grace: Duration,
    evict: fn() -> bool,
) -> Result<Ended, Failure> {
    child.listener = std::fs::File::open("/dev/null")
        .context("/dev/null")?
        .into();
    child.release();
    let ended = child.ended_rx.as_ref().map(|f| f.as_fd());
    let cgroup = child.cgroup.is_some();
    Ok(wait_all(
        child.pid,
        grace,
        child.jailed,
        ended,
        cgroup,
        Vec::new(),
        evict,
        None,
    )?)
}

/// SIGTERM, then SIGKILL after `grace`.
#[allow(clippy::too_many_arguments)]
pub fn supervise(
    mut child: Child,
    policy: Policy,
    trace: Option<TraceSink>,
    want_stats: bool,
    pin_cpu: Option<usize>,
    sync_wakeup: bool,
    resolver: Box<dyn Resolver>,
    grace: Duration,
    hints: Option<crate::readonly::Hints>,
    mut on_demand: Vec<Box<dyn OnDemand>>,
    notify_on_demand: bool,
    evict: fn() -> bool,
) -> Result<Ended, Failure> {
    let started = Instant::now();
    let (kinds, warnings) = handlers::kinds(&policy, MAX_SYSCALL)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    let listener = Listener::from_fd(child.listener.try_clone().context("dup listener")?);
    match if sync_wakeup {
        listener.set_sync_wakeup()
    } else {
        Ok(())
    } {
        Ok(()) => tracing::debug!("SYNC_WAKE_UP set on the listener"),
        Err(e) => tracing::warn!(
            "SYNC_WAKE_UP unsupported ({e}): each notification pays a cross-CPU wakeup"
        ),
    }
    let read_paths = trace.is_some() || policy.has_path_rules();
    let timing = want_stats || trace.is_some();
    let sh = Arc::new(Shared {
        root_fixed: policy.root_is_fixed(),
        cwd_seen: policy.cwd_changes_seen(),
        cx: Arc::new(Context::new(
            listener, policy, resolver, timing, read_paths, hints,
        )),
        kinds,
        names: std::sync::OnceLock::new(),
        stats: Stats::new(),
        trace,
        tree: Tree {
            root: child.pid,
            supervisor: std::process::id() as i32,
        },
        in_flight: std::sync::atomic::AtomicUsize::new(0),
    });
    let starter = NotifyThread {
        sh: Arc::clone(&sh),
        pin_cpu,
    };
    if notify_on_demand {
        // Nothing is notified before the program runs (its execve is allowed outright): the
        // thread starts with the first notification, and a run without one has none.
        on_demand.push(Box::new(starter));
    } else {
        // The target's own execve waits for a decision: the thread must be there first.
        starter
            .spawn()
            .context("starting the notification thread")?;
    }
    let pid = child.pid;
    let jailed = child.jailed;
    let display = child.display.clone();
    let cgroup = child.cgroup.take();
    let _host_lock = child.host_lock.take();
    let ended = child.ended_rx.take();
    let warm = child.warm.take();
    if let Err(errno) = child.exec_result() {
        let _ = wait_all(pid, grace, jailed, None, false, on_demand, evict, None);
        let e = Errno::from_raw(errno);
        return Err(Failure {
            error: anyhow!("cannot execute {display}: {}", e.desc()),
            code: if e == Errno::ENOENT { 127 } else { 126 },
        });
    }
    let end = wait_all(
        pid,
        grace,
        jailed,
        ended.as_ref().map(|f| f.as_fd()),
        cgroup.is_some(),
        on_demand,
        evict,
        warm.as_ref().map(|f| f.as_fd()),
    )?;
    jail::mark("ended");
    let code = end.code();
    if code == 128 + libc::SIGKILL as u8 && cgroup.as_ref().is_some_and(|c| c.oom_killed()) {
        eprintln!(
            "sigma-supervise: the proc ran out of memory: the kernel killed it at its --memory \
             limit"
        );
    }
    if code < 128 {
        // Not for a proc killed by a signal: the user wants the run over.
        sh.cx.resolver.finish();
    }
    // No child is left; once the last task using the filter is released the listener hangs up.
    let mut fds = [nix::poll::PollFd::new(
        sh.cx.listener.as_fd(),
        nix::poll::PollFlags::POLLHUP,
    )];
    match nix::poll::poll(&mut fds, 1000u16) {
        Ok(_)
            if fds[0]
                .revents()
                .is_some_and(|r| r.contains(nix::poll::PollFlags::POLLHUP)) => {}
        _ => tracing::warn!("the seccomp listener did not hang up after the last child exited"),
    }
    // The last answers may have let the proc end before their calls were counted and traced
    // (with SYNC_WAKE_UP the answered task runs at once, on the answering thread's CPU).
    let settle = Instant::now();
    while sh.in_flight.load(std::sync::atomic::Ordering::Acquire) > 0
        && settle.elapsed() < Duration::from_secs(1)
    {
        std::thread::sleep(Duration::from_micros(200));
    }
    if let Some(tr) = &sh.trace {
        tr.flush();
    }
    if want_stats {
        eprint!("{}", sh.stats.report(started.elapsed()));
        if let Some(h) = &sh.cx.hints {
            eprint!("{}", h.report());
        }
        if let Some(r) = sh.cx.resolver.report() {
            eprint!("{r}");
        }
    }
    Ok(end)
}
