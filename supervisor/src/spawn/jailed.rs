//! The target in its σcontainer: clone init into new namespaces, map its ids, let it build the
//! root and fork the target (pid 2), which sheds privilege, installs the filter and hands its
//! listener over (or passes it, [`super::Prepared::pass_listener`]) before execve.
#![forbid(unsafe_code)]

use super::child::{describe_stage, pin_to, send, Child, STAGE_AFFINITY, STAGE_EXEC, STAGE_FILTER};
use super::prepared::{handled_signals, Prepared};
use crate::failure::Failure;
use crate::sys;
use anyhow::{anyhow, Context as _};
use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// Jailed start-up messages (child → supervisor, one SEQPACKET datagram each):
/// [kind, a, b, c] as native-endian 32-bit words.
const J_LISTENER: u32 = 1;
const J_JAIL_STAGE: u32 = 2;
const J_STAGE: u32 = 3;
/// The listener itself rides along (SCM_RIGHTS) and the target is already on its way to execve.
const J_LISTENER_PASSED: u32 = 4;

fn jsend(fd: &OwnedFd, kind: u32, a: u32, b: u32, c: i32) {
    let mut msg = [0u8; 16];
    msg[..4].copy_from_slice(&kind.to_ne_bytes());
    msg[4..8].copy_from_slice(&a.to_ne_bytes());
    msg[8..12].copy_from_slice(&b.to_ne_bytes());
    msg[12..].copy_from_slice(&c.to_ne_bytes());
    let _ = nix::unistd::write(fd, &msg);
}

/// [`J_LISTENER_PASSED`] with the listener itself (SCM_RIGHTS); false if sendmsg failed (a
/// filter that refuses it), and the caller falls back to [`J_LISTENER`].
fn jsend_fd(fd: &OwnedFd, listener: BorrowedFd<'_>) -> bool {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let mut msg = [0u8; 16];
    msg[..4].copy_from_slice(&J_LISTENER_PASSED.to_ne_bytes());
    let fds = [listener.as_raw_fd()];
    let iov = [std::io::IoSlice::new(&msg)];
    loop {
        match sendmsg::<()>(
            fd.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        ) {
            Ok(16) => return true,
            Err(Errno::EINTR) => continue,
            _ => return false,
        }
    }
}

/// One jailed start-up message, the sender's pid in our pid namespace (SO_PASSCRED) and the
/// descriptor it passed, if any.
fn jrecv(fd: &OwnedFd) -> Option<([u32; 4], Option<i32>, Option<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixCredentials};
    let mut buf = [0u8; 16];
    let mut cmsg = nix::cmsg_space!(UnixCredentials, [RawFd; 1]);
    loop {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            fd.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) if m.bytes == 16 => {
                let mut pid = None;
                let mut passed = None;
                if let Ok(cmsgs) = m.cmsgs() {
                    for c in cmsgs {
                        match c {
                            ControlMessageOwned::ScmCredentials(cred) => pid = Some(cred.pid()),
                            ControlMessageOwned::ScmRights(fds) => {
                                // Owned at once, so extra ones close.
                                for f in fds.into_iter().map(sys::received_fd) {
                                    if passed.is_none() {
                                        passed = Some(f);
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                let w = |i: usize| u32::from_ne_bytes(buf[i * 4..i * 4 + 4].try_into().expect("4"));
                return Some(([w(0), w(1), w(2), w(3)], pid, passed));
            }
            Ok(_) => return None,
            Err(Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

/// Read one byte from `fd` (a "go" from the supervisor); false on EOF or error.
fn wait_byte(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    loop {
        match nix::unistd::read(fd, &mut b) {
            Ok(1) => return true,
            Err(Errno::EINTR) => continue,
            _ => return false,
        }
    }
}

/// The target's end of the start-up handshake with init.
struct WithInit {
    /// "network ready" (our network namespace exists; init joins it).
    net_tx: OwnedFd,
    /// "world ready" (the root is built and we are in it), then "world final" (the old root
    /// detached, `/` read-only: see `jail::world::finish`).
    world_rx: OwnedFd,
    /// The supervisor's "id maps written" (a pipe init reads too).
    maps_rx: OwnedFd,
}

/// The target inside the jail (pid 2): its network namespace while init builds the root, then
/// shed privilege, filter, hand the listener over, exec.
fn jailed_target(
    p: &Prepared,
    plan: &jail::Plan,
    status: &OwnedFd,
    go_rx: &OwnedFd,
    exec_tx: &OwnedFd,
    old_mask: &SigSet,
    init: WithInit,
) -> ! {
    let _ = old_mask.thread_set_mask();
    sys::default_disposition(Signal::SIGPIPE);
    let _ = sys::set_parent_death_kill();
    jail::world::own_session_without_terminal();
    if let Err(e) = jail::world::private_net(plan) {
        jsend(status, J_JAIL_STAGE, e.step, e.detail, e.errno);
        sys::exit_now(125)
    }
    // The supervisor's word that the id maps are written (one byte of the two it writes; init
    // reads the other).
    if !wait_byte(&init.maps_rx) {
        sys::exit_now(125)
    }
    drop(init.maps_rx);
    if let Err(e) = jail::world::identity(plan) {
        jsend(status, J_JAIL_STAGE, e.step, e.detail, e.errno);
        sys::exit_now(125)
    }
    // The supervisor takes our listener with pidfd_getfd, and init our network namespace with
    // setns: both need us dumpable (after the change of ids, which resets it; execve decides
    // afresh for the program).
    let _ = nix::sys::prctl::set_dumpable(true);
    let _ = nix::unistd::write(&init.net_tx, b"n");
    drop(init.net_tx);
    // What needs no root, while init builds it.
    if let Err(e) = jail::shed::drop_privileges(plan) {
        jsend(status, J_JAIL_STAGE, e.step, e.detail, e.errno);
        sys::exit_now(125)
    }
    // EOF: init failed (and said why) or died.
    if !wait_byte(&init.world_rx) {
        sys::exit_now(125)
    }
    jail::mark("world-seen");
    if let Err(e) = jail::shed::confine(plan) {
        jsend(status, J_JAIL_STAGE, e.step, e.detail, e.errno);
        sys::exit_now(125)
    }
    jail::mark("shed");
    if let Some(cpu) = p.pin_cpu {
        if let Err(e) = pin_to(cpu) {
            jsend(status, J_STAGE, STAGE_AFFINITY, 0, e as i32);
            sys::exit_now(125)
        }
    }
    let listener = match p.filter.install() {
        Ok(fd) => fd,
        Err(e) => {
            jsend(status, J_STAGE, STAGE_FILTER, 0, e as i32);
            sys::exit_now(125)
        }
    };
    jail::mark("filter");
    // The listener in flight in the socket stays open after our exec closes ours; else the
    // supervisor takes it from us (pidfd_getfd) and says when.
    if !(p.pass_listener && jsend_fd(status, listener.as_fd())) {
        jsend(status, J_LISTENER, listener.as_raw_fd() as u32, 0, 0);
        if !wait_byte(go_rx) {
            sys::exit_now(125)
        }
    }
    jail::mark("released");
    drop(listener);
    // Init detached the old root meanwhile (EOF: it failed, and said why).
    if !wait_byte(&init.world_rx) {
        sys::exit_now(125)
    }
    drop(init.world_rx);
    // Nothing of the supervisor's caller but stdio and what was asked for.
    jail::cloexec_fds_from_except(3, &p.kept);
    let e = sys::execve(&p.path, &p.argv_ptrs, &p.envp_ptrs);
    send(exec_tx, STAGE_EXEC, e as i32);
    sys::exit_now(if e == Errno::ENOENT { 127 } else { 126 })
}

/// Start the target in its σcontainer: clone init into new namespaces, map its ids, let it
/// build the root and fork the target, then take the target's listener.
pub(super) fn spawn_jailed(mut p: Prepared, spec: jail::JailSpec) -> Result<Child, Failure> {
    use nix::sys::socket::{setsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType};
    jail::userns_available().map_err(|why| anyhow!(jail::JailError::NoUserns { why }))?;
    let cgroup = jail::limits::Cgroup::create(
        &format!("sigma-supervise.{}", std::process::id()),
        &spec.limits,
    )
    .map_err(|e| anyhow!("{e}"))?;
    jail::mark("cgroup");
    let grace = spec.grace;
    let mut plan = spec.prepare().map_err(anyhow::Error::from)?;
    jail::mark("plan");
    plan.guard = match p.guard.take() {
        Some(g) => Some(g),
        None => Some(jail::guard::Guard::new().context("building the jail's seccomp guard")?),
    };
    sys::set_child_subreaper().context("PR_SET_CHILD_SUBREAPER")?;
    sys::default_disposition(Signal::SIGCHLD);
    let old_mask = handled_signals()
        .thread_swap_mask(SigmaskHow::SIG_BLOCK)
        .context("blocking signals")?;
    let (status_rx, status_tx) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .context("socketpair")?;
    setsockopt(&status_rx, sockopt::PassCred, &true).context("SO_PASSCRED")?;
    let (maps_rx, maps_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    // The idmapped trees, made while init clones the other sources (see jail's idmap.rs).
    let (ids_rx, ids_tx) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .context("socketpair")?;
    let (go_rx, go_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    let (exec_rx, exec_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    // init's word of how the program ended (see jail::init). With a cgroup the supervisor still
    // waits for init itself to leave (removing the group must wait until it has).
    // Non-blocking: the report is read once init has gone too, when it may not be there.
    let (ended_rx, ended_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .context("pipe2")?;
    jail::mark("clone");
    let pid = jail::clone_into_namespaces(&plan.spec)
        .map_err(|e| anyhow!("cannot create the jail's namespaces: {}", e.desc()))?;
    if pid == 0 {
        // init: pid 1 of the proc's pid namespace.
        drop(status_rx);
        drop(maps_tx);
        drop(ids_tx);
        drop(go_tx);
        drop(exec_rx);
        drop(ended_rx);
        let _ = sys::set_parent_death_kill();
        let fail = |e: jail::StageError| -> ! {
            jsend(&status_tx, J_JAIL_STAGE, e.step, e.detail, e.errno);
            sys::exit_now(125)
        };
        let pipes = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .and_then(|n| Ok((n, nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)));
        let ((net_rx, net_tx), (world_rx, world_tx)) = match pipes {
            Ok(p) => p,
            Err(e) => {
                jsend(&status_tx, J_STAGE, STAGE_EXEC, 0, e as i32);
                sys::exit_now(125)
            }
        };
        // The target makes its network namespace while we build the root (see jail's docs),
        // starting at once: it is the longest step of a jailed start and needs only the
        // capabilities the new user namespace gave us, not the id maps. With a cgroup, only
        // once the supervisor has moved us into it (before the maps' byte): a process forked
        // before stays in the cgroup it was forked in, and the limits would miss the proc.
        let joined_first = cgroup.is_some();
        if joined_first && !wait_byte(&maps_rx) {
            sys::exit_now(125)
        }
        let target = match sys::fork() {
            Ok(0) => {
                drop(net_rx);
                drop(world_tx);
                drop(ids_rx);
                let init = WithInit {
                    net_tx,
                    world_rx,
                    maps_rx,
                };
                jailed_target(&p, &plan, &status_tx, &go_rx, &exec_tx, &old_mask, init)
            }
            Ok(t) => t,
            Err(e) => {
                jsend(&status_tx, J_STAGE, STAGE_EXEC, 0, e as i32);
                sys::exit_now(125)
            }
        };
        drop(net_tx);
        drop(world_rx);
        // What needs no id mapping is done while the supervisor writes the maps.
        let mut trees = match jail::world::clone_sources(&plan) {
            Ok(t) => t,
            Err(e) => fail(e),
        };
        // Dumpable only until the supervisor has written the id maps, which it does through
        // our /proc files; then nobody in the jail may read init's memory (a copy of the
        // supervisor's) or its /proc files.
        if !joined_first && !wait_byte(&maps_rx) {
            sys::exit_now(125)
        }
        let _ = nix::sys::prctl::set_dumpable(false);
        drop(maps_rx);
        jail::mark("init-maps");
        if let Err(e) = jail::world::receive_idmapped(&plan, &mut trees, ids_rx.as_fd()) {
            fail(e)
        }
        drop(ids_rx);
        if let Err(e) = jail::world::build(&plan, trees) {
            fail(e)
        }
        jail::mark("world");
        // EOF: the target failed (and said why) or died.
        if !wait_byte(&net_rx) {
            sys::exit_now(125)
        }
        if let Err(e) = jail::world::join_net(&plan, target) {
            fail(e)
        }
        let _ = nix::unistd::write(&world_tx, b"w");
        // While the target sheds its privileges (it waits for this before its execve).
        if let Err(e) = jail::world::finish(&plan) {
            fail(e)
        }
        jail::mark("world-final");
        let _ = nix::unistd::write(&world_tx, b"f");
        // init keeps nothing of the target's: no pipe, no inherited socket.
        jail::close_fds_from_except(3, ended_tx.as_fd());
        jail::init::run(target, &handled_signals(), grace, Some(ended_tx))
    }
    drop(ended_tx);
    drop(status_tx);
    drop(maps_rx);
    drop(go_rx);
    drop(exec_tx);
    let setup_failed = |msg: String| -> Failure {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        anyhow!("cannot start {}: {msg}", p.display).into()
    };
    if let Err(e) = plan.write_id_maps(pid) {
        return Err(setup_failed(e.to_string()));
    }
    if let Some(cg) = &cgroup {
        if let Err(e) = cg.join(pid) {
            return Err(setup_failed(e));
        }
    }
    jail::mark("maps");
    // One byte for init, one for the target (each reads one).
    let _ = nix::unistd::write(&maps_tx, b"gg");
    drop(maps_tx);
    drop(ids_rx);
    if plan.idmapped_later {
        if let Err(e) = plan
            .prepare_idmapped()
            .and_then(|trees| jail::send_idmapped(&trees, ids_tx.as_fd()))
        {
            return Err(setup_failed(e));
        }
        jail::mark("idmapped");
    }
    drop(ids_tx);
    let (listener, go_tx) = match jrecv(&status_rx) {
        // Already on its way to execve: nothing left to release.
        Some(([J_LISTENER_PASSED, ..], Some(_), Some(listener))) if p.pass_listener => {
            jail::mark("listener");
            (listener, None)
        }
        Some(([J_LISTENER, fd, _, _], Some(tpid), _)) => {
            jail::mark("listener");
            let pidfd = sys::pidfd_open(tpid, 0).context("pidfd_open")?;
            let listener = sys::pidfd_getfd(pidfd.as_fd(), fd as i32).map_err(|e| {
                setup_failed(format!(
                    "taking the seccomp listener (pidfd_getfd): {}",
                    e.desc()
                ))
            })?;
            (listener, Some(go_tx))
        }
        Some(([J_JAIL_STAGE, step, detail, errno], _, _)) => {
            return Err(setup_failed(plan.describe(jail::StageError {
                step,
                detail,
                errno: errno as i32,
            })))
        }
        Some(([J_STAGE, stage, _, errno], _, _)) => {
            return Err(setup_failed(describe_stage(&p, stage, errno as i32)))
        }
        _ => return Err(setup_failed("the jail's init exited during setup".into())),
    };
    Ok(Child {
        pid,
        display: p.display.clone(),
        listener,
        status_rx: exec_rx,
        go_tx,
        ended_rx: Some(ended_rx),
        cgroup,
        host_lock: plan.spec.host_lock.take(),
        jailed: true,
        warm: None,
    })
}
