//! The proc's σOS connection, relayed through the supervisor so it sees Started and Exited:
//! σOS's procd records nothing for a proc that exits with status 0 without Exited, and whoever
//! waits for it waits forever; the supervisor turns that into an error instead.
//!
//! ```text
//! proc ──SIGMA_SPPROXY_FD──▶ [target end │ relay end] ──relay thread──▶ spproxyd.sock
//!                                               scans requests (method) and replies (Exited's)
//! ```
//!
//! Nothing is started for a proc that never calls σOS: the relay end is watched by the
//! supervisor's loop ([`Unstarted`], an fd to poll), and spproxyd is dialled and the relay
//! thread started on the first request ([`Unstarted::start_if_asked`]). The thread moves bytes as they come, in one `poll` loop over both
//! sockets (no hand-off to another thread per call), and only looks at messages: their
//! headers and the first frame of each request, and the reply to an Exited.
#![forbid(unsafe_code)]

use crate::frame::Message;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::cell::RefCell;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the relay saw of the proc's σOS calls.
#[derive(Debug, Default)]
pub struct Seen {
    /// A request was relayed.
    pub used: AtomicBool,
    /// spproxyd answered a Started without error.
    pub started: AtomicBool,
    /// spproxyd answered an Exited without error.
    pub exited: AtomicBool,
    /// The requests could not be followed (a malformed stream): nothing is known.
    pub lost: AtomicBool,
}

/// The relay before the proc's first request.
pub struct Unstarted {
    ours: UnixStream,
    socket: PathBuf,
    seen: Arc<Seen>,
}

/// A socket pair: the proc's end (close-on-exec cleared by the caller) and the relay, not yet
/// started.
pub fn pair(socket: PathBuf, seen: Arc<Seen>) -> std::io::Result<(OwnedFd, Unstarted)> {
    let (ours, theirs) = UnixStream::pair()?;
    Ok((OwnedFd::from(theirs), Unstarted { ours, socket, seen }))
}

impl AsFd for Unstarted {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ours.as_fd()
    }
}

impl Unstarted {
    /// Called when the relay end is readable: dials spproxyd and starts the relay thread on
    /// the proc's first request (`None`), or finds the proc gone (`None`) or nothing there yet
    /// (`Some`: go on watching).
    pub fn start_if_asked(self) -> Option<Unstarted> {
        let mut b = [0u8; 1];
        match nix::sys::socket::recv(
            self.ours.as_raw_fd(),
            &mut b,
            nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ) {
            // Every process of the proc closed its end without a word.
            Ok(0) => return None,
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => return Some(self),
            _ => {}
        }
        let up = match UnixStream::connect(&self.socket) {
            Ok(s) => s,
            Err(e) => {
                // The proc's call fails with the connection closed; the run's end says why.
                eprintln!(
                    "sigma-supervise: the proc's σOS call: cannot connect to spproxyd at {}: {e}",
                    self.socket.display()
                );
                return None;
            }
        };
        let Unstarted { ours, seen, .. } = self;
        let spawned = std::thread::Builder::new()
            .name("sigma-relay".into())
            .spawn(move || relay(ours, up, &seen));
        if let Err(e) = spawned {
            eprintln!("sigma-supervise: starting the σOS relay: {e}");
        }
        None
    }
}

/// One direction's bytes in flight.
struct Leg {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The source reached end of file (its half is shut down at the destination).
    eof: bool,
}

impl Leg {
    fn new() -> Leg {
        Leg {
            buf: vec![0; 64 << 10].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
        }
    }
    fn pending(&self) -> bool {
        self.start < self.end
    }
    fn wants_read(&self) -> bool {
        !self.pending() && !self.eof
    }
}

/// Moves what `from` has to `to`: read when the leg is empty, then write as much as goes.
/// `Err` when a side is gone for good.
fn pump(
    leg: &mut Leg,
    mut from: &UnixStream,
    mut to: &UnixStream,
    scan: &mut dyn FnMut(&[u8]),
) -> Result<(), ()> {
    if leg.wants_read() {
        match from.read(&mut leg.buf) {
            Ok(n) if n > 0 => {
                scan(&leg.buf[..n]);
                (leg.start, leg.end) = (0, n);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            // End of file, or the connection reset: this direction is over.
            _ => {
                leg.eof = true;
                let _ = to.shutdown(Shutdown::Write);
            }
        }
    }
    while leg.pending() {
        match to.write(&leg.buf[leg.start..leg.end]) {
            Ok(n) => leg.start += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(()),
        }
    }
    Ok(())
}

/// The relay thread: until both directions ended, or either side is gone.
fn relay(proc_side: UnixStream, spproxyd: UnixStream, seen: &Seen) {
    if proc_side.set_nonblocking(true).is_err() || spproxyd.set_nonblocking(true).is_err() {
        return;
    }
    let (mut up, mut down) = (Leg::new(), Leg::new());
    let mut requests = Scanner::default();
    let mut replies = Scanner::default();
    // Seqnos of the Started and Exited requests awaiting their replies.
    let awaited: RefCell<Vec<(u64, Call)>> = RefCell::new(Vec::new());
    loop {
        let mut ev_proc = PollFlags::empty();
        let mut ev_spp = PollFlags::empty();
        if up.wants_read() {
            ev_proc |= PollFlags::POLLIN;
        }
        if up.pending() {
            ev_spp |= PollFlags::POLLOUT;
        }
        if down.wants_read() {
            ev_spp |= PollFlags::POLLIN;
        }
        if down.pending() {
            ev_proc |= PollFlags::POLLOUT;
        }
        if ev_proc.is_empty() && ev_spp.is_empty() {
            return;
        }
        let mut fds = Vec::with_capacity(2);
        if !ev_proc.is_empty() {
            fds.push(PollFd::new(proc_side.as_fd(), ev_proc));
        }
        if !ev_spp.is_empty() {
            fds.push(PollFd::new(spproxyd.as_fd(), ev_spp));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
        let mut on_request = |m: Message| {
            seen.used.store(true, Ordering::Relaxed);
            let Ok(req) = crate::rpc::Request::from_message(m) else {
                return;
            };
            let call = match req.method.as_str() {
                crate::api::STARTED => Call::Started,
                crate::api::EXITED => Call::Exited,
                _ => return,
            };
            awaited.borrow_mut().push((req.seqno, call));
        };
        let r = pump(&mut up, &proc_side, &spproxyd, &mut |b| {
            requests.feed(b, |_| 1, &mut on_request)
        });
        if requests.broken {
            seen.lost.store(true, Ordering::Relaxed);
        }
        if r.is_err() {
            return;
        }
        let mut on_reply = |m: Message| {
            let mut awaited = awaited.borrow_mut();
            let Some(i) = awaited.iter().position(|(s, _)| *s == m.seqno) else {
                return;
            };
            let (_, call) = awaited.swap_remove(i);
            let ok = crate::rpc::decode_reply::<crate::proto::SigmaErrRep>(m.frames)
                .is_ok_and(|r| r.err.is_none_or(|e| e.err_code == 0));
            if ok {
                match call {
                    Call::Started => seen.started.store(true, Ordering::Relaxed),
                    Call::Exited => seen.exited.store(true, Ordering::Relaxed),
                }
            }
        };
        // Only the replies awaited are kept (their two leading frames), the rest skipped.
        let keep = |seqno| {
            if awaited.borrow().iter().any(|(s, _)| *s == seqno) {
                2
            } else {
                0
            }
        };
        let r = pump(&mut down, &spproxyd, &proc_side, &mut |b| {
            replies.feed(b, keep, &mut on_reply)
        });
        if r.is_err() {
            return;
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Call {
    Started,
    Exited,
}

/// Follows a stream of spproxy messages (`u64 seqno | u32 nframes | frames of u32 len |
/// payload`) as its bytes pass, keeping only the leading frames asked for.
#[derive(Debug, Default)]
pub struct Scanner {
    /// A header or a frame length read in part.
    head: Vec<u8>,
    in_message: bool,
    seqno: u64,
    /// Frames of the message not yet ended (the current one included).
    frames_left: u32,
    /// The current frame's index.
    index: usize,
    /// Payload bytes left in the current frame (`None`: its length is being read).
    payload_left: Option<u64>,
    keep: usize,
    kept: Vec<Vec<u8>>,
    keeping_current: bool,
    /// The stream is not spproxy's framing: nothing more is followed.
    pub broken: bool,
}

/// Longest leading frame kept (a request's method, an error reply).
const MAX_KEPT: u64 = 64 << 10;

impl Scanner {
    /// Feeds bytes; `keep(seqno)` says how many leading frames of a message to keep, `done`
    /// gets each message whose kept frames are complete, once it has ended.
    pub fn feed(
        &mut self,
        mut b: &[u8],
        keep: impl Fn(u64) -> usize,
        done: &mut dyn FnMut(Message),
    ) {
        while !b.is_empty() && !self.broken {
            if !self.in_message {
                let n = (12 - self.head.len()).min(b.len());
                self.head.extend_from_slice(&b[..n]);
                b = &b[n..];
                if self.head.len() < 12 {
                    return;
                }
                let (seqno, nframes) = self.head.split_at(8);
                self.seqno = u64::from_le_bytes(seqno.try_into().unwrap_or_default());
                self.frames_left = u32::from_le_bytes(nframes.try_into().unwrap_or_default());
                self.head.clear();
                self.in_message = true;
                self.index = 0;
                self.keep = keep(self.seqno).min(self.frames_left as usize);
                self.kept.clear();
                if self.frames_left == 0 {
                    self.finish(done);
                }
                continue;
            }
            match self.payload_left {
                None => {
                    let n = (4 - self.head.len()).min(b.len());
                    self.head.extend_from_slice(&b[..n]);
                    b = &b[n..];
                    if self.head.len() < 4 {
                        return;
                    }
                    let len = u32::from_le_bytes(self.head[..4].try_into().unwrap_or_default());
                    self.head.clear();
                    let Some(len) = len.checked_sub(4).map(u64::from) else {
                        self.broken = true;
                        return;
                    };
                    self.keeping_current = self.index < self.keep && len <= MAX_KEPT;
                    if self.index < self.keep && !self.keeping_current {
                        // Too large to be what is looked for: the message is skipped.
                        self.keep = 0;
                        self.kept.clear();
                    }
                    if self.keeping_current {
                        self.kept.push(Vec::with_capacity(len as usize));
                    }
                    self.payload_left = Some(len);
                    if len == 0 {
                        self.end_frame(done);
                    }
                }
                Some(left) => {
                    let n = left.min(b.len() as u64) as usize;
                    if self.keeping_current {
                        if let Some(f) = self.kept.last_mut() {
                            f.extend_from_slice(&b[..n]);
                        }
                    }
                    b = &b[n..];
                    self.payload_left = Some(left - n as u64);
                    if left == n as u64 {
                        self.end_frame(done);
                    }
                }
            }
        }
    }

    fn end_frame(&mut self, done: &mut dyn FnMut(Message)) {
        self.payload_left = None;
        self.keeping_current = false;
        self.index += 1;
        self.frames_left -= 1;
        if self.frames_left == 0 {
            self.finish(done);
        }
    }

    fn finish(&mut self, done: &mut dyn FnMut(Message)) {
        self.in_message = false;
        if self.keep > 0 && self.kept.len() == self.keep {
            done(Message {
                seqno: self.seqno,
                frames: std::mem::take(&mut self.kept),
            });
        }
        self.kept.clear();
        self.keep = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split of a stream of three messages gives the same messages.
    #[test]
    fn the_scanner_follows_messages_split_anywhere() {
        let mut stream = crate::frame::encode(7, &[b"method".as_slice(), b"body", b"blob"]);
        stream.extend(crate::frame::encode(8, &[] as &[&[u8]]));
        stream.extend(crate::frame::encode(9, &[b"".as_slice(), b"x"]));
        for cut in 0..stream.len() {
            for cut2 in cut..stream.len() {
                let mut s = Scanner::default();
                let mut got = Vec::new();
                for part in [&stream[..cut], &stream[cut..cut2], &stream[cut2..]] {
                    s.feed(part, |seq| if seq == 8 { 0 } else { 2 }, &mut |m| {
                        got.push(m)
                    });
                }
                assert!(!s.broken);
                let want = vec![
                    Message {
                        seqno: 7,
                        frames: vec![b"method".to_vec(), b"body".to_vec()],
                    },
                    Message {
                        seqno: 9,
                        frames: vec![b"".to_vec(), b"x".to_vec()],
                    },
                ];
                assert_eq!(got, want, "cut at {cut}, {cut2}");
            }
        }
    }

    #[test]
    fn a_bad_frame_length_stops_the_scanner() {
        let mut b = 1u64.to_le_bytes().to_vec();
        b.extend(1u32.to_le_bytes());
        b.extend(2u32.to_le_bytes());
        let mut s = Scanner::default();
        s.feed(&b, |_| 1, &mut |_| panic!("no message"));
        assert!(s.broken);
    }
}
