//! Calls that block — Open with wait, a read of a DirWatch fd with nothing new, WaitEvict —
//! are parked here instead of holding a thread. One waiter thread per server retries them
//! when the server changes the realm (create, put, remove, rename, close of a written
//! object), when the realm is evicted, and every [`POLL`] for changes made outside the
//! server. However many calls wait, the thread count stays the same; a parked call costs a
//! few hundred bytes and is dropped when its connection ends.
//!
//! The thread knows neither the connection nor dispatch: a parked call carries its
//! connection as a [`Peer`] (where the reply goes), and the thread retries calls through the
//! server's [`Retry`] handle, which it holds weakly (it ends when the server is gone).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use super::reply::Frames;
use super::session::Session;
use super::sync::lock;

/// How often parked calls look for changes made outside the server.
pub const POLL: Duration = Duration::from_millis(200);

pub enum Wait {
    Open { path: String, mode: u32 },
    WatchRead { fd: u32, size: u64 },
    Evict,
}

/// A parked call's connection.
pub trait Peer: Send + Sync {
    /// The connection's fds and identity, for the retry.
    fn session(&self) -> &Session;
    /// The connection ended: its parked calls are dropped.
    fn is_closed(&self) -> bool;
    /// Queues a reply without waiting (the waiter thread never blocks on a client).
    fn push(&self, seqno: u64, frames: Frames);
}

/// The server, as the waiter thread sees it.
pub trait Retry: Send + Sync + 'static {
    fn waiters(&self) -> &Waiters;
    /// The reply of `wait` on `session`, or `None` while it still cannot complete.
    fn retry(&self, session: &Session, wait: &Wait) -> Option<Frames>;
}

struct Parked {
    conn: Arc<dyn Peer>,
    seqno: u64,
    wait: Wait,
}

#[derive(Default)]
struct State {
    parked: Vec<Parked>,
    dirty: bool,
    thread: bool,
    /// Calls parked, including those the thread is retrying now.
    count: usize,
}

#[derive(Default)]
pub struct Waiters {
    state: Mutex<State>,
    cv: Condvar,
    /// WaitEvict calls parked now.
    evict_waiting: AtomicUsize,
}

impl Waiters {
    pub fn len(&self) -> usize {
        lock(&self.state).count
    }

    /// WaitEvict calls parked now.
    pub fn evict_waiting(&self) -> usize {
        self.evict_waiting.load(Ordering::SeqCst)
    }

    /// Something changed: retry every parked call now.
    pub fn wake(&self) {
        lock(&self.state).dirty = true;
        self.cv.notify_all();
    }
}

/// Parks a call; the waiter thread retries it through `server` and answers it on `conn`
/// when it can complete.
pub fn park<R: Retry>(server: &Arc<R>, conn: Arc<dyn Peer>, seqno: u64, wait: Wait) {
    let w = server.waiters();
    conn.session().waiting.fetch_add(1, Ordering::SeqCst);
    if matches!(wait, Wait::Evict) {
        w.evict_waiting.fetch_add(1, Ordering::SeqCst);
    }
    let start = {
        let mut st = lock(&w.state);
        st.parked.push(Parked { conn, seqno, wait });
        st.count += 1;
        st.dirty = true;
        !std::mem::replace(&mut st.thread, true)
    };
    w.cv.notify_all();
    if start {
        let weak = Arc::downgrade(server);
        let spawned = std::thread::Builder::new()
            .name("spproxy-wait".into())
            .spawn(move || run(weak));
        if spawned.is_err() {
            lock(&w.state).thread = false;
        }
    }
}

fn run(weak: Weak<dyn Retry>) {
    loop {
        let batch = {
            let Some(server) = weak.upgrade() else { return };
            let w = server.waiters();
            let mut st = lock(&w.state);
            if !st.dirty {
                st =
                    w.cv.wait_timeout(st, POLL)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
            }
            st.dirty = false;
            std::mem::take(&mut st.parked)
        };
        if batch.is_empty() {
            continue;
        }
        let Some(server) = weak.upgrade() else { return };
        let w = server.waiters();
        let mut kept = Vec::with_capacity(batch.len());
        let mut done = 0usize;
        // Paths found missing in this pass: the other waiters on them need not look again.
        let mut missing: HashSet<String> = HashSet::new();
        let finish = |p: &Parked| {
            p.conn.session().waiting.fetch_sub(1, Ordering::SeqCst);
            if matches!(p.wait, Wait::Evict) {
                w.evict_waiting.fetch_sub(1, Ordering::SeqCst);
            }
        };
        for p in batch {
            if p.conn.is_closed() {
                finish(&p);
                done += 1;
                continue;
            }
            if let Wait::Open { path, .. } = &p.wait {
                if missing.contains(path) {
                    kept.push(p);
                    continue;
                }
            }
            match server.retry(p.conn.session(), &p.wait) {
                Some(frames) => {
                    p.conn.push(p.seqno, frames);
                    finish(&p);
                    done += 1;
                }
                None => {
                    if let Wait::Open { path, .. } = &p.wait {
                        missing.insert(path.clone());
                    }
                    kept.push(p);
                }
            }
        }
        let mut st = lock(&w.state);
        st.count = st.count.saturating_sub(done);
        kept.append(&mut st.parked);
        st.parked = kept;
    }
}
