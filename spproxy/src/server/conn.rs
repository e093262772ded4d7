//! A connection: the reader (framing, bounded by the limits, one request at a time) writes
//! each reply itself; replies of parked calls come from the waiter thread through an outbox
//! drained by the connection's writer thread (started by the first call that parks), so the
//! waiter thread never blocks on a client that stops reading (which stalls only its own
//! connection). One lock orders the writes.
//!
//! The connection is the top of a call's path: it owns the socket, the writer and its
//! [`Session`]; it hands each request to dispatch with the session, sends the reply or parks
//! the call on the waiter thread as a [`Peer`] (where the reply is pushed).

use std::collections::VecDeque;
use std::io::{self, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use nix::sys::socket::{send, MsgFlags};

use crate::frame::{self, FrameError, Limits};

use super::dispatch::{self, Outcome};
use super::error::ServerError;
use super::fds::FdTable;
use super::reply::Frames;
use super::session::Session;
use super::state::Inner;
use super::sync::lock;
use super::waiters::{self, Peer};

/// A peer that accepts no reply bytes for this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Replies of parked calls, for the writer thread (at most one per parked call).
#[derive(Default)]
struct Outbox {
    queue: VecDeque<Vec<u8>>,
    closed: bool,
}

struct Conn {
    /// The socket, for writes; `wlock` keeps one message's bytes together.
    sock: UnixStream,
    wlock: Mutex<()>,
    out: Mutex<Outbox>,
    /// Signalled when the outbox gains a message or closes (the writer waits on it).
    out_cv: Condvar,
    session: Session,
    closed: AtomicBool,
}

impl Peer for Conn {
    fn session(&self) -> &Session {
        &self.session
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Queues a reply without waiting (the waiter thread's replies are small).
    fn push(&self, seqno: u64, frames: Frames) {
        let buf = frame::encode(seqno, &frames);
        let mut o = lock(&self.out);
        if o.closed {
            return;
        }
        o.queue.push_back(buf);
        self.out_cv.notify_all();
    }
}

impl Conn {
    /// Writes a reply now, on the calling (reader) thread: no thread handoff per call.
    fn send_now(&self, seqno: u64, frames: Frames) {
        let buf = frame::encode(seqno, &frames);
        let _w = lock(&self.wlock);
        if write_all(&self.sock, &buf).is_err() {
            self.close();
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        lock(&self.out).closed = true;
        self.out_cv.notify_all();
    }
}

fn writer(conn: &Conn) {
    loop {
        let buf = {
            let mut o = lock(&conn.out);
            loop {
                if let Some(b) = o.queue.pop_front() {
                    break b;
                }
                if o.closed {
                    return;
                }
                o = conn.out_cv.wait(o).unwrap_or_else(|p| p.into_inner());
            }
        };
        let _w = lock(&conn.wlock);
        if write_all(&conn.sock, &buf).is_err() {
            conn.close();
            let _ = conn.sock.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

/// `send` with MSG_NOSIGNAL: a peer gone away is an error, never a SIGPIPE.
fn write_all(s: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match send(s.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Serves `s` until EOF or a malformed message.
pub fn serve(inner: &Arc<Inner>, s: UnixStream) -> Result<(), ServerError> {
    let lim = &inner.cfg.limits;
    inner.connections.fetch_add(1, Ordering::SeqCst);
    let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
    let ws = match s.try_clone() {
        Ok(ws) => ws,
        Err(e) => {
            inner.connections.fetch_sub(1, Ordering::SeqCst);
            return Err(e.into());
        }
    };
    let conn = Arc::new(Conn {
        sock: ws,
        wlock: Mutex::new(()),
        out: Mutex::new(Outbox::default()),
        out_cv: Condvar::new(),
        session: Session::new(FdTable::new(lim.max_fds, lim.conn_memory)),
        closed: AtomicBool::new(false),
    });
    let res = {
        // The writer is started by the first call that parks: most connections never park
        // one, and a thread's creation and teardown cost more than a short proc's calls.
        let mut wthread = None;
        let limits = Limits {
            max_frames: 4096,
            max_frame_len: lim.max_frame,
            max_message_len: u64::from(lim.max_frame) + (64 << 10),
        };
        let mut reader = BufReader::with_capacity(64 * 1024, &s);
        let res = loop {
            if conn.is_closed() {
                break Ok(());
            }
            match frame::read_message(&mut reader, &limits) {
                Ok(Some(m)) => {
                    let seqno = m.seqno;
                    match dispatch::handle(inner, &conn.session, m) {
                        Outcome::Reply(frames) => conn.send_now(seqno, frames),
                        Outcome::Park(wait) => {
                            waiters::park(inner, conn.clone(), seqno, wait);
                            // Its reply (perhaps queued already) goes out on the writer.
                            if wthread.is_none() {
                                let wconn = conn.clone();
                                match std::thread::Builder::new()
                                    .name("spproxy-write".into())
                                    .spawn(move || writer(&wconn))
                                {
                                    Ok(t) => wthread = Some(t),
                                    Err(e) => break Err(ServerError::Io(e)),
                                }
                            }
                        }
                    }
                }
                Ok(None) => break Ok(()),
                Err(FrameError::Io(e)) => break Err(ServerError::Io(e)),
                Err(e) => break Err(ServerError::Malformed(e)),
            }
        };
        conn.close();
        if let Some(t) = wthread {
            let _ = t.join();
        }
        res
    };
    conn.close();
    let _ = s.shutdown(std::net::Shutdown::Both);
    // Parked calls of this connection are dropped by the waiter thread on its next pass.
    inner.waiters.wake();
    inner.connections.fetch_sub(1, Ordering::SeqCst);
    res
}
