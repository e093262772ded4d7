//! The σOS API for the target: a pre-connected spproxy socket in `SIGMA_SPPROXY_FD`.
//!
//! The sigmaos profile refuses socket/connect, so the target cannot dial spproxyd itself. Before
//! fork the supervisor makes a connected pair (or connects to a running spproxyd), clears
//! close-on-exec on the target's end and names its number in `SIGMA_SPPROXY_FD`; the
//! `spproxy::Client` (pysigma) adopts it once per process and marks it close-on-exec, so a
//! subprocess of the target does not inherit the connection (it has no σOS API of its own).
//!
//! `--sigma embedded` (the default when no σOS is configured) serves the other end in this
//! process with [`spproxy::server::Server`]: `name/ux/~local/...` is a per-realm scratch
//! directory, `name/s3/~local/BUCKET/KEY` an object in bucket BUCKET of the fetcher's storage
//! backends ([`FetcherObjects`]). The server's thread is never joined: once every target process
//! has exited, the target's end is closed and the connection thread ends on EOF by itself; the
//! supervisor exits without waiting for it either way.
//!
//! σOS's own Go client does not use `SIGMA_SPPROXY_FD`: a proc with `UseSPProxy` dials
//! `/tmp/spproxyd/spproxyd.sock` itself. A jailed run of the embedded server therefore also
//! listens on that name: a socket in a private directory of the supervisor's
//! (`$TMPDIR/sigma-supervise-spproxyd.XXXXXX`, holding only the socket), the socket bound
//! read-only into the jail at `/tmp/spproxyd/spproxyd.sock` (the jail's `/tmp` is private). Once the jail's root is built the
//! directory is removed ([`SigmaApi::jail_built`]): the bind holds the socket's inode, which a
//! connect through it still reaches, so a supervisor killed later leaves nothing behind. Each
//! accepted connection is
//! served like the pre-connected one, by the same server; the accept is on demand, like the
//! first request (see [`Listening`]).
#![forbid(unsafe_code)]

use crate::failure::Failure;
use anyhow::{anyhow, Context as _};
pub use fetcher::objects::{FetcherObjects, S3Backend};
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use spproxy::server::{
    exited_line, LocalDirStore, ObjectStore, ProcState, Server, ServerConfig, ServerLimits,
};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The run's embedded server, for [`evict`] from the signal loop.
static EVICT: OnceLock<Server> = OnceLock::new();

/// The supervisor got SIGTERM: evict the proc (σOS's WaitEvict returns). Returns whether the
/// proc was waiting for eviction, and so exits by itself (with Exited(EVICTED)); if not, the
/// signal should be forwarded.
pub fn evict() -> bool {
    EVICT.get().is_some_and(|s| !s.is_evicted() && s.evict())
}

/// Exit status when `--require-started` is given and the proc never called Started.
pub const NOT_STARTED_EXIT: u8 = 125;

/// Where the target's σOS API comes from (`--sigma`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SigmaMode {
    /// An embedded realm server in the supervisor.
    Embedded,
    /// A running spproxyd listening at this socket; the supervisor connects for the target.
    Socket(PathBuf),
    /// No σOS API: `SIGMA_SPPROXY_FD` is not set.
    Off,
}

impl SigmaMode {
    /// `embedded`, `off`, or a socket path.
    pub fn parse(s: &str) -> Result<SigmaMode, String> {
        match s {
            "embedded" => Ok(SigmaMode::Embedded),
            "off" => Ok(SigmaMode::Off),
            "" => Err("expected embedded, off or a spproxyd socket path".into()),
            p => Ok(SigmaMode::Socket(PathBuf::from(p))),
        }
    }

    /// The default: a σOS-configured environment (SIGMACONFIG set) with spproxyd running at
    /// its fixed socket uses it; anything else gets the embedded server.
    pub fn default_from_env() -> SigmaMode {
        let configured =
            std::env::var_os(spproxy::procenv::SIGMACONFIG).is_some_and(|v| !v.is_empty());
        let sock = Path::new(spproxy::DEFAULT_SOCKET);
        let is_socket = std::fs::symlink_metadata(sock)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
        if configured && is_socket {
            SigmaMode::Socket(sock.to_owned())
        } else {
            SigmaMode::Embedded
        }
    }
}

/// The embedded server's settings.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    pub realm: String,
    pub scratch_dir: PathBuf,
    /// `scratch_dir` lies in a home directory that does not exist: it is not made, and the
    /// calls on name/ux/~local fail (see [`fetcher::default_cache_root_if_home`]).
    pub scratch_homeless: bool,
    pub s3: S3Backend,
    pub limits: ServerLimits,
}

/// `<cache-root>/realms/<realm>/ux`.
fn scratch_in(cache_root: &Path, realm: &str) -> PathBuf {
    cache_root.join("realms").join(realm).join("ux")
}

impl EmbeddedConfig {
    /// `scratch_dir`; `None` where there is no cache root (see
    /// [`fetcher::default_cache_root_if_home`]): the default root's, which is not made.
    pub fn new(realm: &str, scratch_dir: Option<PathBuf>, s3: S3Backend) -> EmbeddedConfig {
        let (scratch_dir, scratch_homeless) = match scratch_dir {
            Some(d) => (d, false),
            None => (scratch_in(&fetcher::default_cache_root(), realm), true),
        };
        EmbeddedConfig {
            realm: realm.to_owned(),
            scratch_dir,
            scratch_homeless,
            s3,
            limits: ServerLimits::default(),
        }
    }
}

/// Command-line options of the target's σOS API.
#[derive(Debug, Clone, clap::Args)]
pub struct SigmaOpts {
    /// The target's σOS API (an inherited socket named by SIGMA_SPPROXY_FD): `embedded` realm
    /// server in the supervisor, the socket PATH of a running spproxyd, or `off`
    /// [default: /tmp/spproxyd/spproxyd.sock when SIGMACONFIG is set and it exists, else
    /// embedded]. A jailed proc of the embedded server also finds it at
    /// /tmp/spproxyd/spproxyd.sock, where σOS's Go client (ProcEnv UseSPProxy) dials it.
    #[arg(long, value_name = "embedded|PATH|off", value_parser = SigmaMode::parse)]
    pub sigma: Option<SigmaMode>,

    /// Embedded server: backend of name/s3/~local/BUCKET/KEY, `s3` (standard AWS
    /// configuration, AWS_ENDPOINT_URL) or file:///DIR (bucket B is the directory DIR/B).
    #[arg(long, value_name = "s3|file:///DIR", default_value = "s3", value_parser = S3Backend::parse)]
    pub s3: S3Backend,

    /// Embedded server: host directory behind name/ux/~local (created)
    /// [default: <cache root>/realms/<realm>/ux].
    #[allow(rustdoc::invalid_html_tags)] // the help text's placeholders, not HTML
    #[arg(long, value_name = "DIR")]
    pub scratch_dir: Option<PathBuf>,

    /// Fail (exit 125, one line on stderr) if the proc never called Started. Needs the
    /// embedded server, which is what observes Started.
    #[arg(long)]
    pub require_started: bool,

    /// Embedded server: bytes the realm's scratch (name/ux/~local) may hold, what it already
    /// holds included (counted by the first call that writes or removes there), and the
    /// largest object a proc may write (K/M/G/T suffixes); a write beyond it fails with σOS's
    /// "no space left on device" error.
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = spproxy::server::parse_bytes)]
    pub scratch_quota: u64,

    /// Embedded server: largest frame a request may carry and a reply return (K/M/G
    /// suffixes); a larger announced frame closes the connection before it is read.
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = spproxy::server::parse_frame)]
    pub max_frame: u32,
}

/// Where σOS's clients dial spproxyd (sigmap/named.go `SIGMASOCKET`'s directory), inside the jail.
pub const SPPROXYD_DIR: &str = "/tmp/spproxyd";
/// The socket's name in [`SPPROXYD_DIR`].
const SPPROXYD_SOCK: &str = "spproxyd.sock";

/// The σOS API of one run: prepared before fork, started after it, reported at exit.
pub struct SigmaApi {
    /// The target's end, handed over at spawn.
    target_end: Option<OwnedFd>,
    /// The embedded server and its end of the pair (until started).
    server: Option<(Server, Option<UnixStream>)>,
    /// The embedded server's socket for σOS's Go client (see [`SigmaApi::jail_socket`]).
    listening: Option<Listening>,
    /// The private directory holding that socket, removed at the end of the run.
    socket_dir: Option<SocketDir>,
}

/// A private directory of the supervisor's, removed (with what it holds) when dropped.
struct SocketDir(PathBuf);

impl SocketDir {
    fn remove(&self) {
        let _ = std::fs::remove_file(self.0.join(SPPROXYD_SOCK));
        let _ = std::fs::remove_dir(&self.0);
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        self.remove();
    }
}

impl SigmaApi {
    /// From the options, the realm name and the cache root (`None`: there is none, as for a
    /// home that is not a directory).
    pub fn from_opts(
        opts: &SigmaOpts,
        realm: &str,
        cache_root: Option<&Path>,
    ) -> anyhow::Result<SigmaApi> {
        let mode = opts
            .sigma
            .clone()
            .unwrap_or_else(SigmaMode::default_from_env);
        if opts.require_started && mode != SigmaMode::Embedded {
            return Err(anyhow!(
                "--require-started needs the embedded server (--sigma embedded): only it \
                 observes Started"
            ));
        }
        let scratch = opts
            .scratch_dir
            .clone()
            .or_else(|| cache_root.map(|root| scratch_in(root, realm)));
        let mut embedded = EmbeddedConfig::new(realm, scratch, opts.s3.clone());
        embedded.limits.scratch_quota = opts.scratch_quota;
        embedded.limits.max_frame = opts.max_frame;
        SigmaApi::prepare(mode, &embedded)
    }

    /// Make the connection (no threads are started: the supervisor forks afterwards).
    pub fn prepare(mode: SigmaMode, embedded: &EmbeddedConfig) -> anyhow::Result<SigmaApi> {
        let (target, server) = match &mode {
            SigmaMode::Off => {
                return Ok(SigmaApi {
                    target_end: None,
                    server: None,
                    listening: None,
                    socket_dir: None,
                })
            }
            SigmaMode::Socket(path) => {
                let s = UnixStream::connect(path).with_context(|| {
                    format!(
                        "--sigma: cannot connect to spproxyd at {} (use --sigma embedded to run \
                         without σOS)",
                        path.display()
                    )
                })?;
                (s, None)
            }
            SigmaMode::Embedded => {
                // A local bucket directory is served by spproxy's own store, which resolves
                // every key beneath the bucket without following symbolic links.
                let store: Arc<dyn ObjectStore> = match &embedded.s3 {
                    S3Backend::Dir(root) => Arc::new(LocalDirStore::new(root)),
                    S3Backend::Aws => Arc::new(FetcherObjects::new(embedded.s3.clone())),
                };
                let mut cfg =
                    ServerConfig::new(embedded.realm.clone(), embedded.scratch_dir.clone(), store)
                        .with_limits(embedded.limits.clone());
                if embedded.scratch_homeless {
                    cfg = cfg.without_scratch(nix::errno::Errno::ENOENT);
                }
                let srv = Server::new(cfg).context("embedded realm server")?;
                if let Some(e) = srv.scratch_error() {
                    tracing::info!("{e}: the σOS calls on name/ux/~local will fail");
                }
                let _ = EVICT.set(srv.clone());
                let (ours, theirs) =
                    UnixStream::pair().context("socketpair for the embedded server")?;
                (theirs, Some((srv, Some(ours))))
            }
        };
        let fd = OwnedFd::from(target);
        // The target inherits this end across execve; the supervisor's copy is dropped once the
        // child is forked.
        fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty()))
            .context("clearing close-on-exec on the target's spproxy socket")?;
        tracing::debug!(?mode, fd = fd.as_raw_fd(), "σOS API for the target");
        Ok(SigmaApi {
            target_end: Some(fd),
            server,
            listening: None,
            socket_dir: None,
        })
    }

    /// For a jailed run of the embedded server: makes the socket σOS's Go client dials and
    /// returns it, to be bound (the socket alone) at [`SPPROXYD_DIR`]`/spproxyd.sock` in the
    /// jail.
    /// `None` without the embedded server, or (said at `-v`) where the socket cannot be made:
    /// the pre-connected one still works. Call before fork; nothing is accepted until
    /// [`SigmaApi::on_demand`]'s watcher sees a connection.
    pub fn jail_socket(&mut self) -> Option<(PathBuf, PathBuf)> {
        let (srv, _) = self.server.as_ref()?;
        match listen_in_private_dir() {
            Ok((dir, listener)) => {
                let paths = (
                    dir.0.join(SPPROXYD_SOCK),
                    Path::new(SPPROXYD_DIR).join(SPPROXYD_SOCK),
                );
                self.listening = Some(Listening {
                    srv: srv.clone(),
                    listener,
                });
                self.socket_dir = Some(dir);
                Some(paths)
            }
            Err(e) => {
                tracing::info!("no {SPPROXYD_DIR}/{SPPROXYD_SOCK} in the jail: {e:#}");
                None
            }
        }
    }

    /// The jail's root is built (its bind holds the socket): the host's path to the socket goes
    /// now, before the program runs. A connect through the bind still reaches the listening
    /// socket (it is found by its inode); nothing is left in `$TMPDIR` even if the supervisor is
    /// killed.
    pub fn jail_built(&mut self) {
        self.socket_dir = None;
    }

    /// What the supervisor starts once its fd is readable (call after fork): the embedded
    /// server's pre-connected end, and its listening socket.
    pub fn on_demand(&mut self) -> Vec<Box<dyn crate::on_demand::OnDemand>> {
        let mut v: Vec<Box<dyn crate::on_demand::OnDemand>> = Vec::new();
        if let Some(u) = self.unstarted() {
            v.push(Box::new(u));
        }
        if let Some(l) = self.listening.take() {
            v.push(Box::new(l));
        }
        v
    }

    /// The fd to leave open in the child and the `SIGMA_SPPROXY_FD` value naming it.
    pub fn take_target_end(&mut self) -> Option<(OwnedFd, String)> {
        self.target_end.take().map(|fd| {
            let n = fd.as_raw_fd().to_string();
            (fd, n)
        })
    }

    /// The embedded server's end of the target's connection, not yet served: the supervisor
    /// starts it once the target first writes there (see [`Unstarted`]). Call after fork.
    pub fn unstarted(&mut self) -> Option<Unstarted> {
        match &mut self.server {
            Some((srv, end @ Some(_))) => end.take().map(|stream| Unstarted {
                srv: srv.clone(),
                stream,
            }),
            _ => None,
        }
    }

    /// What the proc reported (embedded server only).
    pub fn proc_state(&self) -> Option<ProcState> {
        self.server.as_ref().map(|(s, _)| s.proc_state())
    }

    /// End of run: the Exited line, the `--stats` line, and the `--require-started` check.
    /// Returns how the run ends.
    pub fn finish(
        &self,
        end: jail::init::Ended,
        want_stats: bool,
        require_started: bool,
    ) -> Result<jail::init::Ended, Failure> {
        // The run is over: nobody dials the socket again (the supervisor may exit without
        // dropping this).
        if let Some(d) = &self.socket_dir {
            d.remove();
        }
        let Some(st) = self.proc_state() else {
            return Ok(end);
        };
        if let Some((status, msg)) = &st.exited {
            eprintln!("sigma-supervise: {}", exited_line(*status, msg));
        }
        if want_stats {
            eprintln!("sigma-supervise proc: {}", st.summary());
        }
        if require_started && !st.started {
            return Err(Failure {
                error: anyhow!(
                    "--require-started: the proc never called Started (program exit status {})",
                    end.code()
                ),
                code: NOT_STARTED_EXIT,
            });
        }
        Ok(end)
    }
}

/// The embedded server's end of the target's connection before anything arrived on it. Most
/// programs never call the σOS API: their runs start no server thread at all (its creation and
/// teardown are a fair part of a short run's cost). The supervisor watches [`Unstarted::as_fd`]
/// and calls `Unstarted::readable` once it is readable (a request, or the target's end closed).
pub struct Unstarted {
    srv: Server,
    stream: UnixStream,
}

impl crate::on_demand::OnDemand for Unstarted {
    /// A request waits: the connection is served on its own thread, detached, until every
    /// target process has closed its end. Or every target process closed its end without a
    /// word: nothing to serve.
    fn readable(self: Box<Self>) -> Option<Box<dyn crate::on_demand::OnDemand>> {
        let mut b = [0u8; 1];
        match nix::sys::socket::recv(
            self.stream.as_raw_fd(),
            &mut b,
            nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => None,
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => Some(self),
            // A request, or an error the server's first read reports.
            _ => {
                drop(self.srv.serve_stream(self.stream));
                tracing::debug!(realm = %self.srv.config().realm, "embedded realm server started");
                None
            }
        }
    }
}

impl AsFd for Unstarted {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

/// `$TMPDIR/sigma-supervise-spproxyd.XXXXXX` (searchable by the proc's ids, which are not
/// the supervisor's, listable only by its owner) with a listening `spproxyd.sock` (0777, as
/// spproxyd makes it), non-blocking.
fn listen_in_private_dir() -> anyhow::Result<(SocketDir, UnixListener)> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = nix::unistd::mkdtemp(&std::env::temp_dir().join("sigma-supervise-spproxyd.XXXXXX"))
        .context("making a private directory for the socket")?;
    let dir = SocketDir(dir);
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("chmod {}", dir.0.display()))?;
    let path = dir.0.join(SPPROXYD_SOCK);
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
        .with_context(|| format!("chmod {}", path.display()))?;
    listener
        .set_nonblocking(true)
        .context("making the listening socket non-blocking")?;
    Ok((dir, listener))
}

/// The embedded server's listening socket, watched by the supervisor: each connection is
/// accepted once the socket is readable and served on a thread of its own, like the
/// pre-connected one; the socket stays watched for the next.
pub struct Listening {
    srv: Server,
    listener: UnixListener,
}

impl crate::on_demand::OnDemand for Listening {
    fn readable(self: Box<Self>) -> Option<Box<dyn crate::on_demand::OnDemand>> {
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    if s.set_nonblocking(false).is_ok() && self.srv.serve_accepted(s) {
                        tracing::debug!("embedded realm server: a connection on {SPPROXYD_SOCK}");
                    }
                }
                // A connection gone before it was accepted; the socket is not.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Some(self),
                // Out of fds or memory: stop listening rather than spin on a readable socket.
                Err(e) => {
                    tracing::info!(
                        "accept on {SPPROXYD_DIR}/{SPPROXYD_SOCK}: {e}; no longer listening"
                    );
                    return None;
                }
            }
        }
    }
}

impl AsFd for Listening {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigma_mode_parses() {
        assert_eq!(SigmaMode::parse("embedded"), Ok(SigmaMode::Embedded));
        assert_eq!(SigmaMode::parse("off"), Ok(SigmaMode::Off));
        assert_eq!(
            SigmaMode::parse("/tmp/s.sock"),
            Ok(SigmaMode::Socket("/tmp/s.sock".into()))
        );
        assert!(SigmaMode::parse("").is_err());
    }
}
