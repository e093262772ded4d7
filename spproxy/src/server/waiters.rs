//! Calls that block — Open with wait, a read of a DirWatch fd with nothing new, WaitEvict —
//! are parked here instead of holding a thread. One waiter thread per server retries them
//! when the server changes the realm (create, put, remove, rename, close of a written
//! object), when the realm is evicted, and every [`POLL`] for changes made outside the
//! server. However many calls wait, the thread count stays the same; a parked call costs a
//! few hundred bytes and is dropped when its connection ends.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use crate::consts::ECODE_NOTFOUND;

use super::conn::Conn;
use super::dispatch;
use super::lock;
use super::reply::Frames;
use super::Inner;

/// How often parked calls look for changes made outside the server.
pub const POLL: Duration = Duration::from_millis(200);

pub enum Wait {
    Open { path: String, mode: u32 },
    WatchRead { fd: u32, size: u64 },
    Evict,
}

struct Parked {
    conn: Arc<Conn>,
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
}

impl Waiters {
    pub fn len(&self) -> usize {
        lock(&self.state).count
    }

    /// Something changed: retry every parked call now.
    pub fn wake(&self) {
        lock(&self.state).dirty = true;
        self.cv.notify_all();
    }
}

/// Parks a call; the waiter thread answers it on `conn` when it can complete.
pub fn park(inner: &Arc<Inner>, conn: &Arc<Conn>, seqno: u64, wait: Wait) {
    conn.waiting.fetch_add(1, Ordering::SeqCst);
    if matches!(wait, Wait::Evict) {
        inner.evict_waiting.fetch_add(1, Ordering::SeqCst);
    }
    let start = {
        let mut st = lock(&inner.waiters.state);
        st.parked.push(Parked {
            conn: conn.clone(),
            seqno,
            wait,
        });
        st.count += 1;
        st.dirty = true;
        !std::mem::replace(&mut st.thread, true)
    };
    inner.waiters.cv.notify_all();
    if start {
        let weak = Arc::downgrade(inner);
        let spawned = std::thread::Builder::new()
            .name("spproxy-wait".into())
            .spawn(move || run(weak));
        if spawned.is_err() {
            lock(&inner.waiters.state).thread = false;
        }
    }
}

fn run(weak: Weak<Inner>) {
    loop {
        let batch = {
            let Some(inner) = weak.upgrade() else { return };
            let w = &inner.waiters;
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
        let Some(inner) = weak.upgrade() else { return };
        let mut kept = Vec::with_capacity(batch.len());
        let mut done = 0usize;
        // Paths found missing in this pass: the other waiters on them need not look again.
        let mut missing: HashSet<String> = HashSet::new();
        let finish = |p: &Parked| {
            p.conn.waiting.fetch_sub(1, Ordering::SeqCst);
            if matches!(p.wait, Wait::Evict) {
                inner.evict_waiting.fetch_sub(1, Ordering::SeqCst);
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
            match try_complete(&inner, &p) {
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
        let mut st = lock(&inner.waiters.state);
        st.count = st.count.saturating_sub(done);
        kept.append(&mut st.parked);
        st.parked = kept;
    }
}

fn try_complete(inner: &Arc<Inner>, p: &Parked) -> Option<Frames> {
    match &p.wait {
        Wait::Evict => inner
            .evicted
            .load(Ordering::SeqCst)
            .then(|| super::reply::err_rep(Ok(()))),
        Wait::Open { path, mode } => match dispatch::open(inner, &p.conn, path, *mode) {
            Err(e) if e.err_code == ECODE_NOTFOUND => None,
            r => Some(super::reply::fd_rep(r)),
        },
        Wait::WatchRead { fd, size } => {
            dispatch::watch_read(inner, &p.conn, *fd, *size).map(super::reply::data_rep)
        }
    }
}
