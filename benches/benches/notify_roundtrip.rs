//! One notified syscall round trip against a real forked child under a real filter.
//!
//! Each sample is a batch timed with `iter_custom`: the probe child is told to make `iters`
//! `getppid` calls; this thread receives and answers each one; the batch ends when the child
//! reports back. One pipe round trip per batch is included (amortised over the batch).
//!
//! Variants: `plain` (scheduler places both sides), `sync_wakeup` (listener flagged with
//! SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP), `same_cpu` / `same_cpu_sync_wakeup` (this thread and
//! the child both pinned to CPU 0). The addfd variants include the child's close(2).
//!
//! `path_continue` / `relative_path_continue` answer `continue` after the work the supervisor's
//! path routine does for a call that names a path outside every rule: read the path from the
//! target (`args[0]`, absolute, or `args[1]`, relative to the cwd; the id re-checked after the
//! read), resolve it in the target's view, decide it against the sigmaos profile with a serve
//! rule, and for the relative path look up the mount of the cwd (served-directory check). Set
//! side by side with `continue` in the same run, the difference is the handler's cost.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use notify::mem::TargetMem;
use notify::path::ProcView;
use notify::probe::{ProbeChild, ProbeOptions};
use notify::Response;
use sigma_benches::getppid_notify_filter;
use std::ffi::OsStr;
use std::hint::black_box;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum Answer {
    Continue,
    Errno,
    AddfdSend,
    PathContinue,
    RelativePathContinue,
}

/// What the path routine keeps between calls, and the policy it decides against.
struct PathWork {
    profile: policies::Profile,
    view: ProcView,
    raw: Vec<u8>,
    abs: Vec<u8>,
}

impl PathWork {
    fn new() -> Self {
        let mut profile = policies::load("sigmaos").expect("the sigmaos profile");
        profile
            .add_serve("/sigma/bench=/tmp")
            .expect("a serve rule");
        PathWork {
            profile,
            view: ProcView::default(),
            raw: Vec::new(),
            abs: Vec::new(),
        }
    }

    /// Read, resolve and decide the path in `args[arg]`; panics unless the decision is continue.
    fn decide(&mut self, l: &notify::Listener, n: &notify::Notification, arg: usize) {
        TargetMem::new(l, n)
            .read_path_into(n.args[arg], &mut self.raw)
            .expect("read the path");
        self.view
            .absolute_into(n.pid, libc::AT_FDCWD, &self.raw, &mut self.abs)
            .expect("resolve the path");
        if self.raw.first() != Some(&b'/') {
            black_box(
                self.view
                    .mount_id(n.pid, libc::AT_FDCWD)
                    .expect("cwd mount"),
            );
        }
        let d = self.profile.decide(Path::new(OsStr::from_bytes(&self.abs)));
        assert_eq!(d, policies::PathDecision::Continue);
    }
}

impl Answer {
    fn name(self) -> &'static str {
        match self {
            Answer::Continue => "continue",
            Answer::Errno => "errno",
            Answer::AddfdSend => "addfd_send",
            Answer::PathContinue => "path_continue",
            Answer::RelativePathContinue => "relative_path_continue",
        }
    }
}

fn run_batch(
    child: &ProbeChild,
    answer: Answer,
    fd: std::os::fd::BorrowedFd<'_>,
    work: &mut PathWork,
    n: u64,
) -> Duration {
    let l = child.listener();
    let start = Instant::now();
    child.start(n).expect("probe child alive");
    for _ in 0..n {
        let notif = l.recv().expect("recv");
        match answer {
            Answer::Continue => l
                .respond(notif.id, Response::continue_unchecked())
                .expect("respond"),
            Answer::Errno => l
                .respond(notif.id, Response::Errno(libc::EPERM))
                .expect("respond"),
            Answer::AddfdSend => {
                black_box(l.addfd_send(notif.id, fd, true).expect("addfd"));
            }
            Answer::PathContinue | Answer::RelativePathContinue => {
                let arg = usize::from(matches!(answer, Answer::RelativePathContinue));
                work.decide(l, &notif, arg);
                l.respond(notif.id, Response::continue_unchecked())
                    .expect("respond")
            }
        }
    }
    let last = child.finish().expect("probe child finished the batch");
    let elapsed = start.elapsed();
    match answer {
        Answer::Continue | Answer::PathContinue | Answer::RelativePathContinue => {
            assert!(last > 0, "continued getppid returns our pid")
        }
        Answer::Errno => assert_eq!(last, -1),
        Answer::AddfdSend => assert!(last >= 0, "addfd answer is an fd"),
    }
    elapsed
}

fn notify_roundtrip(c: &mut Criterion) {
    let filter = getppid_notify_filter();
    // The fd injected by the addfd answers (the child closes each copy).
    let devnull = std::fs::File::open("/dev/null").expect("/dev/null");
    let mut g = c.benchmark_group("notify_roundtrip");
    g.bench_function("bare_getppid", |b| {
        b.iter(|| black_box(nix::unistd::getppid()))
    });
    let unpinned = sched_getaffinity(Pid::from_raw(0)).expect("sched_getaffinity");
    let mut work = PathWork::new();
    let all = [(false, false), (true, false), (false, true), (true, true)];
    let sync_only = [(true, false), (true, true)];
    for answer in [
        Answer::Continue,
        Answer::PathContinue,
        Answer::RelativePathContinue,
        Answer::Errno,
        Answer::AddfdSend,
    ] {
        let variants = match answer {
            Answer::PathContinue | Answer::RelativePathContinue => &sync_only[..],
            _ => &all[..],
        };
        // (sync wake-up, both sides pinned to CPU 0)
        for &(sync, pinned) in variants {
            let opts = ProbeOptions {
                close_results: matches!(answer, Answer::AddfdSend),
                cpu: pinned.then_some(0),
            };
            let child = ProbeChild::spawn(&filter, opts).expect("spawn probe child");
            if sync {
                child
                    .listener()
                    .set_sync_wakeup()
                    .expect("SYNC_WAKE_UP on this kernel");
            }
            let mut cpu0 = CpuSet::new();
            cpu0.set(0).expect("cpu 0");
            let here = if pinned { cpu0 } else { unpinned };
            sched_setaffinity(Pid::from_raw(0), &here).expect("sched_setaffinity");
            let variant = match (sync, pinned) {
                (false, false) => "plain",
                (true, false) => "sync_wakeup",
                (false, true) => "same_cpu",
                (true, true) => "same_cpu_sync_wakeup",
            };
            g.bench_function(BenchmarkId::new(answer.name(), variant), |b| {
                b.iter_custom(|iters| run_batch(&child, answer, devnull.as_fd(), &mut work, iters))
            });
            sched_setaffinity(Pid::from_raw(0), &unpinned).expect("sched_setaffinity");
        }
    }
    g.finish();
}

criterion_group!(benches, notify_roundtrip);
criterion_main!(benches);
