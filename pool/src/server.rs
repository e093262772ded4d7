//! The pool: `sigma-supervise pool` in the foreground. It makes its socket's directory (0700,
//! ours), starts the zygotes (one without preloads, one per `--preload` set), then answers
//! connections one at a time: a peer of another uid is refused, a run is handed to the zygote
//! with the most preloads that fit, `--status` and `--stop` are answered. A zygote found dead
//! is restarted after the run that found it was told to go cold.
//!
//! Recycling (the trust model: siblings share a zygote's ASLR layout and hash seed, so no zygote
//! serves forever): once a zygote has forked [`PoolOpts::recycle_after_forks`] procs or is
//! [`PoolOpts::recycle_after`] old, its replacement is started between requests; the old one
//! serves until the new one is ready, then is retired (it forks no more, its procs end as they
//! would and their clients hear how). No request waits for a zygote to start.
//!
//! Learning ([`crate::learn`]): each zygote sends what its ended procs imported; between
//! requests the pool records it and starts a zygote for a set that earned one (at most
//! [`LearnOpts::zygotes`], the least recently used replaced once the new one is ready).
#![forbid(unsafe_code)]

use crate::learn::{valid_name, LearnOpts, Learner};
use crate::zygote::{Jailed, Zygote};
use crate::{choose, wire, PoolError};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    accept4, bind, getsockopt, listen, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    UnixAddr,
};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the pool keeps warm.
#[derive(Debug, Clone)]
pub struct PoolOpts {
    /// The interpreter (as named; resolved on PATH).
    pub python: PathBuf,
    /// One zygote per set, besides the one without preloads.
    pub preloads: Vec<Vec<String>>,
    /// A zygote is replaced after this many forks.
    pub recycle_after_forks: u64,
    /// A zygote is replaced once it is this old.
    pub recycle_after: Duration,
    /// Preloads learned from runs.
    pub learn: LearnOpts,
    /// Zygotes in a σcontainer each, for jailed runs with this profile (the default); else
    /// (`None`) zygotes for `--no-jail` runs.
    pub jail: Option<Jailed>,
}

/// At most this many import names in one request (a longer list takes the cold path).
const MAX_IMPORTS: usize = 1024;

/// Make the socket's directory ours and 0700, refusing one that another user owns.
fn own_dir(dir: &Path) -> Result<(), PoolError> {
    let setup =
        |what: &str, e: std::io::Error| PoolError::Setup(format!("{what} {}: {e}", dir.display()));
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(setup("cannot create", e)),
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| setup("cannot read", e))?;
    if !m.is_dir() || m.uid() != nix::unistd::getuid().as_raw() {
        return Err(PoolError::Setup(format!(
            "{} is not a directory of ours: remove it or set XDG_RUNTIME_DIR",
            dir.display()
        )));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| setup("cannot chmod", e))
}

fn listen_on(path: &Path) -> Result<OwnedFd, PoolError> {
    let io = |what, errno| PoolError::Io { what, errno };
    if crate::client::connect().is_ok() {
        return Err(PoolError::Setup(format!(
            "a pool already serves {}",
            path.display()
        )));
    }
    let _ = std::fs::remove_file(path);
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| io("socket", e))?;
    // Bound under another name and renamed once listening: a client that finds the socket
    // can connect (between bind and listen it would be refused, and start cold).
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{}", std::process::id()));
    let bound = PathBuf::from(name);
    let _ = std::fs::remove_file(&bound);
    let addr = UnixAddr::new(&bound).map_err(|e| io("socket path", e))?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).map_err(|e| io("bind", e))?;
    listen(&fd, Backlog::new(128).expect("backlog")).map_err(|e| io("listen", e))?;
    std::fs::rename(&bound, path).map_err(|e| {
        let _ = std::fs::remove_file(&bound);
        PoolError::Setup(format!("cannot name the socket {}: {e}", path.display()))
    })?;
    Ok(fd)
}

struct Pool {
    python: PathBuf,
    /// Its zygotes are jailed, so ([`PoolOpts::jail`]).
    jail: Option<Jailed>,
    /// The serving zygotes, one per preload set.
    zygotes: Vec<Zygote>,
    /// Replacements being started: (the slot in `zygotes`, the new zygote); a learned zygote
    /// without a slot yet is added (or takes the least recently used learned one's).
    coming: Vec<(Option<usize>, Zygote)>,
    learner: Learner,
    /// Something learning depends on changed (a report, a refused name, a learned zygote in
    /// place): look for a set that earned a zygote (not on every round: the window may be
    /// long).
    relearn: bool,
    /// Retired zygotes whose last procs still run.
    retired: Vec<Zygote>,
    recycle_after_forks: u64,
    recycle_after: Duration,
    /// A replacement that failed to start is tried again after a while, not in a loop.
    failed_at: Option<Instant>,
}

impl Pool {
    /// Between requests: start the replacement of each zygote that is due, put in place those
    /// that are ready (retiring the old), reap the retired that have ended.
    fn tend(&mut self) {
        let retry = self
            .failed_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
        for z in &mut self.zygotes {
            for names in z.reports() {
                self.learner.record(&names);
                self.relearn = true;
            }
        }
        self.learn(retry);
        for i in 0..self.zygotes.len() {
            let z = &self.zygotes[i];
            let due = z.forks >= self.recycle_after_forks || z.born.elapsed() >= self.recycle_after;
            if due && retry && !self.coming.iter().any(|(slot, _)| *slot == Some(i)) {
                match Zygote::spawn(
                    z.python.clone(),
                    z.preloads.clone(),
                    z.learned,
                    z.jail.clone(),
                ) {
                    Ok(new) => self.coming.push((Some(i), new)),
                    Err(e) => {
                        tracing::warn!("pool: recycling {}: {e}", z.describe());
                        self.failed_at = Some(Instant::now());
                    }
                }
            }
        }
        let mut k = 0;
        while k < self.coming.len() {
            match self.coming[k].1.poll_ready() {
                Ok(false) => k += 1,
                Ok(true) => {
                    let (slot, new) = self.coming.swap_remove(k);
                    self.relearn |= new.learned;
                    let Some(slot) = self.slot_for(slot, &new) else {
                        self.zygotes.push(new);
                        continue;
                    };
                    let mut old = std::mem::replace(&mut self.zygotes[slot], new);
                    tracing::info!(
                        "pool: zygote {} replaced by pid {} after {} forks, {} s",
                        old.describe(),
                        self.zygotes[slot].pid(),
                        old.forks,
                        old.born.elapsed().as_secs()
                    );
                    old.retire();
                    self.retired.push(old);
                }
                Err(e) => {
                    let (_, gone) = self.coming.swap_remove(k);
                    match gone.failed_preload().filter(|_| gone.learned) {
                        // One line, and the name is learned no more.
                        Some(names) => {
                            eprintln!("sigma-supervise pool: {e}: not learned again");
                            for name in names.split(',') {
                                self.learner.refuse(name);
                            }
                            self.relearn = true;
                        }
                        None => {
                            tracing::warn!("pool: {e}");
                            self.failed_at = Some(Instant::now());
                        }
                    }
                }
            }
        }
        self.retired.retain_mut(Zygote::alive);
    }

    /// Start a zygote for a set the runs have earned, unless one is already coming.
    fn learn(&mut self, retry: bool) {
        let learning = self.coming.iter().any(|(slot, _)| slot.is_none());
        if !self.relearn || learning || !retry {
            return;
        }
        self.relearn = false;
        let have: Vec<Vec<String>> = self.zygotes.iter().map(|z| z.preloads.clone()).collect();
        let Some(set) = self.learner.candidate(&have) else {
            return;
        };
        // At the cap, the set takes the least recently used learned zygote's place only if more
        // of the remembered runs imported it (else two sets would replace each other in turn).
        let learned = self.zygotes.iter().filter(|z| z.learned);
        if learned.clone().count() >= self.learner.opts.zygotes.max(1) {
            let lru = learned.min_by_key(|z| z.last_used).map(|z| &z.preloads);
            if lru.is_some_and(|l| self.learner.used_by(l) >= self.learner.used_by(&set)) {
                return;
            }
        }
        match Zygote::spawn(self.python.clone(), set, true, self.jail.clone()) {
            Ok(z) => {
                eprintln!(
                    "sigma-supervise pool: learned preloads [{}]: starting a zygote",
                    z.preloads.join(",")
                );
                self.coming.push((None, z));
            }
            Err(e) => {
                tracing::warn!("pool: a learned zygote: {e}");
                self.failed_at = Some(Instant::now());
            }
        }
    }

    /// Where a ready zygote goes: its slot; for a new learned one, none while fewer than the
    /// cap are learned, else the least recently used learned one's (whose own replacement, if
    /// one is coming, is dropped).
    fn slot_for(&mut self, slot: Option<usize>, new: &Zygote) -> Option<usize> {
        if slot.is_some() || !new.learned {
            return slot;
        }
        let learned = self.zygotes.iter().filter(|z| z.learned).count();
        if learned < self.learner.opts.zygotes.max(1) {
            return None;
        }
        let lru = (0..self.zygotes.len())
            .filter(|&i| self.zygotes[i].learned)
            .min_by_key(|&i| self.zygotes[i].last_used)?;
        self.coming.retain(|(s, _)| *s != Some(lru));
        Some(lru)
    }

    /// How long the loop may sleep before [`Pool::tend`] has work: a zygote coming of age.
    fn next_due(&self) -> Duration {
        let oldest = self
            .zygotes
            .iter()
            .map(|z| self.recycle_after.saturating_sub(z.born.elapsed()))
            .min()
            .unwrap_or(Duration::MAX);
        let busy = !(self.coming.is_empty() && self.retired.is_empty());
        // While a replacement starts or a retired zygote finishes, look again soon.
        oldest.min(Duration::from_millis(if busy { 20 } else { 60_000 }))
    }

    /// Answer one connection; true when asked to stop.
    fn answer(&mut self, conn: OwnedFd) -> Result<bool, PoolError> {
        let cred = getsockopt(&conn, sockopt::PeerCredentials).map_err(|errno| PoolError::Io {
            what: "SO_PEERCRED",
            errno,
        })?;
        // A client that connects and says nothing holds the pool up a second at most.
        let second = nix::sys::time::TimeVal::new(1, 0);
        let _ = nix::sys::socket::setsockopt(&conn, sockopt::ReceiveTimeout, &second);
        let Some((req, _)) = wire::recv::<wire::Request>(conn.as_fd())? else {
            return Ok(false);
        };
        let ours = nix::unistd::getuid().as_raw();
        if cred.uid() != ours {
            tracing::warn!(
                "refused a connection of uid {} (this pool serves uid {ours})",
                cred.uid()
            );
            let why = format!("the pool serves uid {ours} only");
            let _ = wire::send(conn.as_fd(), &wire::Answer::Cold { why }, &[]);
            // (Answered after its request is read: a socket closed with a message unread
            // resets, and the peer would see no answer.)
            return Ok(false);
        }
        match req {
            wire::Request::Stop => {
                let _ = wire::send_raw(conn.as_fd(), b"\"stopping\"", &[]);
                Ok(true)
            }
            wire::Request::Status => {
                let zygotes: Vec<wire::ZygoteStatus> = self
                    .zygotes
                    .iter_mut()
                    .map(|z| wire::ZygoteStatus {
                        python: z.python.display().to_string(),
                        preloads: z.preloads.clone(),
                        pid: z.pid(),
                        forks: z.forks,
                        age_secs: z.born.elapsed().as_secs(),
                        alive: z.alive(),
                        replacing: None,
                        learned: z.learned,
                        starting: false,
                    })
                    .collect();
                let ready = self.zygotes.iter().map(Zygote::pid).collect::<Vec<_>>();
                let coming = self.coming.iter().map(|(slot, z)| wire::ZygoteStatus {
                    python: z.python.display().to_string(),
                    preloads: z.preloads.clone(),
                    pid: z.pid(),
                    forks: 0,
                    age_secs: 0,
                    alive: true,
                    replacing: slot.map(|s| ready[s]),
                    learned: z.learned,
                    starting: true,
                });
                let l = &self.learner;
                let status = wire::PoolStatus {
                    zygotes: zygotes.into_iter().chain(coming).collect(),
                    learning: wire::LearnStatus {
                        enabled: l.opts.enabled,
                        threshold: l.opts.threshold,
                        window: l.opts.window,
                        zygotes: l.opts.zygotes,
                        runs: l.runs(),
                        counts: l.counts().into_iter().take(10).collect(),
                        refused: l.refused(),
                    },
                };
                wire::send(conn.as_fd(), &status, &[])?;
                Ok(false)
            }
            wire::Request::Run {
                python,
                imports,
                startup,
                view,
                profile,
            } => {
                let (view, profile) = (view.as_ref(), profile.as_deref());
                self.run(conn.as_fd(), &python, &imports, &startup, view, profile)?;
                Ok(false)
            }
        }
    }

    fn run(
        &mut self,
        conn: BorrowedFd<'_>,
        python: &str,
        imports: &[String],
        startup: &[String],
        view: Option<&jail::warm::ViewKey>,
        profile: Option<&str>,
    ) -> Result<(), PoolError> {
        let cold = |why: String| wire::send(conn, &wire::Answer::Cold { why }, &[]);
        // The names come from the client: refused unless each is a plain module name.
        if imports.len() > MAX_IMPORTS || !imports.iter().all(|n| valid_name(n)) {
            return cold("the request names modules that are not plain module names".into());
        }
        if Path::new(python) != self.python {
            return cold(format!(
                "the pool's interpreter is {}",
                self.python.display()
            ));
        }
        // A jailed zygote serves a jailed run whose view is its own plus binds of the run's.
        let fits = |z: &Zygote| match (&z.view, view) {
            (None, None) => true,
            (Some(zv), Some(rv)) => {
                z.jail.as_ref().map(|j| j.profile.as_str()) == profile
                    && zv.differs(rv).is_none()
                    && zv.binds.iter().all(|b| rv.binds.contains(b))
            }
            _ => false,
        };
        if !self.zygotes.iter().any(fits) {
            let jailed = self.jail.is_some();
            let ours = self.jail.as_ref().map(|j| j.profile.as_str());
            return cold(match (jailed, view) {
                (true, None) => {
                    "the pool's zygotes are jailed (`pool --no-jail` serves --no-jail runs)".into()
                }
                (false, Some(_)) => {
                    "the pool's zygotes are --no-jail (a pool without it serves jailed runs)".into()
                }
                (_, Some(_)) if ours != profile => format!(
                    "the pool's zygotes run the profile {} (`pool --profile`)",
                    ours.unwrap_or_default()
                ),
                (_, Some(rv)) => match self
                    .zygotes
                    .iter()
                    .find_map(|z| z.view.as_ref()?.differs(rv))
                {
                    Some(part) => format!("its σcontainer differs from the zygotes': {part}"),
                    None => "the zygotes' views show what the run's does not".into(),
                },
                _ => "no zygote fits".into(),
            });
        }
        let best = self
            .zygotes
            .iter()
            .enumerate()
            .filter(|(_, z)| fits(z) && choose::preloads_fit(&z.preloads, imports))
            .max_by_key(|(_, z)| z.preloads.len())
            .map(|(i, _)| i);
        let Some(i) = best else {
            return cold("no zygote's preloads are among the program's imports".into());
        };
        if self.zygotes[i].startup != startup {
            return cold("the PYTHON* or locale variables differ from the pool's".into());
        }
        let hand = wire::Hand {
            imports: imports.to_vec(),
            learn: self.learner.opts.enabled,
        };
        let z = &mut self.zygotes[i];
        if !z.alive() || z.hand(conn, &hand).is_err() {
            let why = format!("the zygote {} is gone (restarted)", z.describe());
            cold(why)?;
            let (python, preloads, learned) = (z.python.clone(), z.preloads.clone(), z.learned);
            self.zygotes[i] = Zygote::start(python, preloads, learned, self.jail.clone())?;
            return Ok(());
        }
        let z = &self.zygotes[i];
        let mapper: Vec<_> = z.mapper.iter().map(|m| m.as_fd()).collect();
        wire::send(
            conn,
            &wire::Answer::Warm {
                zygote: z.describe(),
                view: z.view.clone(),
            },
            &mapper,
        )
    }
}

/// The variables of systemd's socket activation: read by the pool, passed to no zygote.
pub const ACTIVATION: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];

/// The socket systemd listens on for the pool (a user unit's `ListenSequentialPacket=` at the
/// pool's path; README), when it started this process for it: `LISTEN_PID` ours and
/// `LISTEN_FDS` 1.
fn activated() -> Result<Option<OwnedFd>, PoolError> {
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    match std::env::var("LISTEN_FDS").ok().filter(|_| ours).as_deref() {
        None => Ok(None),
        Some("1") => wire::activated_listener()
            .map(Some)
            .map_err(|e| PoolError::Setup(format!("socket activation: {e}"))),
        Some(n) => Err(PoolError::Setup(format!(
            "socket activation passed {n} sockets: the pool listens on one"
        ))),
    }
}

/// Run the pool in the foreground until `--stop` (or a signal); on the socket systemd passes
/// it when socket-activated.
pub fn serve(opts: &PoolOpts) -> Result<(), PoolError> {
    let python = which(&opts.python)?;
    let path = crate::socket_path();
    let activated = activated()?;
    let by_systemd = activated.is_some();
    let listener = match activated {
        Some(l) => l,
        None => {
            own_dir(&crate::socket_dir())?;
            listen_on(&path)?
        }
    };
    let mut zygotes = vec![Zygote::start(
        python.clone(),
        Vec::new(),
        false,
        opts.jail.clone(),
    )?];
    for set in &opts.preloads {
        zygotes.push(Zygote::start(
            python.clone(),
            set.clone(),
            false,
            opts.jail.clone(),
        )?);
    }
    for z in &zygotes {
        eprintln!("sigma-supervise pool: zygote {}", z.describe());
    }
    eprintln!(
        "sigma-supervise pool: serving uid {} on {}",
        nix::unistd::getuid(),
        path.display()
    );
    let mut pool = Pool {
        jail: opts.jail.clone(),
        python,
        zygotes,
        coming: Vec::new(),
        retired: Vec::new(),
        recycle_after_forks: opts.recycle_after_forks.max(1),
        recycle_after: opts.recycle_after,
        failed_at: None,
        learner: Learner::new(opts.learn),
        relearn: false,
    };
    loop {
        pool.tend();
        let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        // A replacement's "ready" wakes the loop at once, and so does a zygote's report of what
        // a proc imported (when learning).
        fds.extend(
            pool.coming
                .iter()
                .map(|(_, z)| PollFd::new(z.ctl(), PollFlags::POLLIN)),
        );
        if pool.learner.opts.enabled {
            // Not a dead one's (its socket would wake the loop forever).
            let live: Vec<bool> = pool.zygotes.iter_mut().map(Zygote::alive).collect();
            fds.extend(
                pool.zygotes
                    .iter()
                    .zip(live)
                    .filter(|(_, live)| *live)
                    .map(|(z, _)| PollFd::new(z.ctl(), PollFlags::POLLIN)),
            );
        }
        let wait = pool
            .next_due()
            .clamp(Duration::from_millis(1), Duration::from_secs(60));
        let wait = PollTimeout::try_from(wait).unwrap_or(PollTimeout::NONE);
        match poll(&mut fds, wait) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(errno) => {
                return Err(PoolError::Io {
                    what: "poll",
                    errno,
                })
            }
        }
        let incoming = fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        drop(fds);
        if !incoming {
            continue;
        }
        let conn = match accept4(
            std::os::fd::AsRawFd::as_raw_fd(&listener),
            SockFlag::SOCK_CLOEXEC,
        ) {
            Ok(fd) => wire::accepted(fd),
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::ECONNABORTED) => continue,
            Err(errno) => {
                return Err(PoolError::Io {
                    what: "accept",
                    errno,
                })
            }
        };
        match pool.answer(conn) {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::warn!("pool: {e}"),
        }
    }
    if !by_systemd {
        // systemd's socket stays, to start the pool again at the next connection.
        let _ = std::fs::remove_file(&path);
    }
    Ok(())
}

/// PROGRAM resolved on PATH, then to its real path (what a client's interpreter is compared by).
pub fn which(program: &Path) -> Result<PathBuf, PoolError> {
    let found = if program.components().count() > 1 {
        Some(program.to_path_buf())
    } else {
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    };
    found
        .and_then(|p| std::fs::canonicalize(p).ok())
        .ok_or_else(|| PoolError::Setup(format!("{} not found", program.display())))
}
