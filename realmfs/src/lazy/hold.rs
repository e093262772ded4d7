//! The holder of a run's fanotify group: the group's end is left to a process that outlives
//! the run ([`HOLDER_ARG0`]), so the run's exit does not wait for it.
#![forbid(unsafe_code)]

use nix::sys::fanotify::Fanotify;

/// `argv[0]` of the process that holds a run's fanotify group until the run has exited
/// ([`hold`], started by [`spawn_holder`]).
pub const HOLDER_ARG0: &str = "sigma-supervise-hold";

/// Start the holder of `fan`: this binary again, with a duplicate of the group as its stdout
/// and the read end of a pipe as its stdin whose write end only this process holds (until it
/// exits). No other descriptor reaches it (the spawn closes every close-on-exec one).
pub(super) fn spawn_holder(fan: &Fanotify, init: std::os::fd::OwnedFd) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let group = std::os::fd::AsFd::as_fd(fan).try_clone_to_owned()?;
    std::process::Command::new("/proc/self/exe")
        .arg0(HOLDER_ARG0)
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::from(rx))
        .stdout(std::process::Stdio::from(group))
        .stderr(std::process::Stdio::from(init))
        .spawn()?;
    // Closed by the kernel when this process exits: the holder's signal to let go.
    std::mem::forget(tx);
    Ok(())
}

/// The holder's whole life: wait for end of file on stdin (the supervisor has exited), then
/// for the jail's init (a pidfd on stderr) to be gone, then exit, which drops the group on
/// stdout. The group's end answers the events still pending in it with "allow", which would
/// show a waiting reader its placeholder's zeros: after a supervisor killed mid-fill, the jail
/// dies with it (init's parent-death signal, then the pid namespace), and only once its init
/// has exited is no reader left to see them. Whatever else the holder inherited from the
/// supervisor's own parent (descriptors that are not close-on-exec) is closed first: it holds
/// nobody's pipe.
pub fn hold() -> ! {
    use std::os::fd::AsFd as _;
    jail::close_fds_from(3);
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    // A pidfd polls readable once its process has exited.
    let init = std::io::stderr();
    let mut fds = [nix::poll::PollFd::new(
        init.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    while let Err(nix::errno::Errno::EINTR) =
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE)
    {}
    std::process::exit(0)
}
