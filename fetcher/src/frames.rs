//! An archive's zstd frames decoded on several threads, delivered in order.
//!
//! A published archive is a sequence of independent zstd frames (see
//! [`crate::publish::FRAME_BYTES`]), each declaring its decoded size. A [`Splitter`], on a
//! thread of its own, reads the compressed stream and cuts it at frame boundaries (reading the
//! frame and block headers, never decoding), hands each frame that declares at most
//! [`MAX_FRAME`] decoded bytes to a [`Pool`]'s threads, and queues the results in stream order
//! for [`Frames`], the reader: what has arrived is read at once, never held up by a frame still
//! arriving. A frame that declares no size or a larger one (an archive written as one frame)
//! is decoded as a stream by the splitter: any valid zstd stream reads the same as with one
//! decoder, and memory stays bounded by [`IN_FLIGHT`] frames of [`MAX_FRAME`] bytes.
//!
//! Input is hostile: sizes are checked before anything is allocated from them, a frame that
//! decodes to other than its declared size, a reserved block type or a truncated frame is
//! `InvalidData`.

use std::io::{self, Read};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use zstd::stream::raw::{Decoder as RawDecoder, InBuffer, Operation, OutBuffer};

/// The largest decoded size of a frame decoded off the reader's thread.
pub const MAX_FRAME: usize = 8 << 20;

/// Frames (or streamed pieces) queued and not yet read.
pub const IN_FLIGHT: usize = 4;

const ZSTD_MAGIC: u32 = 0xFD2F_B528;
const SKIPPABLE_MASK: u32 = 0xFFFF_FFF0;
const SKIPPABLE_MAGIC: u32 = 0x184D_2A50;
/// Compressed bytes read from the input at a time.
const READ_CHUNK: usize = 64 << 10;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// A frame for a decoding thread: its bytes, its declared size, where the result goes.
type Job = (Vec<u8>, usize, SyncSender<io::Result<Vec<u8>>>);

/// Decoding threads: they stop when the [`Frames`] holding the job sender is dropped.
pub struct Pool {
    jobs: Arc<Mutex<Receiver<Job>>>,
}

impl Pool {
    /// Run one decoding thread's loop (call from a thread of the caller's choosing).
    pub fn work(&self) {
        loop {
            let next = self
                .jobs
                .lock()
                .map_err(|_| ())
                .and_then(|rx| rx.recv().map_err(|_| ()));
            let Ok((frame, size, reply)) = next else {
                return;
            };
            let out = decode_frame(&frame, size);
            let _ = reply.send(out);
        }
    }
}

fn decode_frame(frame: &[u8], size: usize) -> io::Result<Vec<u8>> {
    let out = zstd::bulk::decompress(frame, size)?;
    if out.len() != size {
        return Err(invalid(format!(
            "zstd frame decodes to {} bytes, declares {size}",
            out.len()
        )));
    }
    Ok(out)
}

/// The decoded stream, in order: what [`Splitter::run`] queued, as the frames finish.
pub struct Frames {
    order: Receiver<Receiver<io::Result<Vec<u8>>>>,
    /// Decoded bytes being read (`out[out_pos..]`).
    out: Vec<u8>,
    out_pos: usize,
    done: bool,
}

/// Cuts the compressed input into frames, on a thread of its own, so the reader is never held
/// up by input that has not arrived yet: small frames go to the [`Pool`], anything else is
/// decoded here as a stream, and every piece is queued in stream order.
pub struct Splitter<R> {
    input: R,
    /// Compressed bytes read and not yet consumed (`buf[pos..]`).
    buf: Vec<u8>,
    pos: usize,
    input_done: bool,
    jobs: mpsc::Sender<Job>,
    order: SyncSender<Receiver<io::Result<Vec<u8>>>>,
}

/// The reader of `input`'s decoded bytes, the splitter to run on a thread of its own
/// ([`Splitter::run`]), and the pool whose threads ([`Pool::work`], as many as wanted) decode
/// its frames.
pub fn frames<R: Read>(input: R) -> (Frames, Splitter<R>, Pool) {
    let (jobs, rx) = mpsc::channel();
    let (order, queued) = mpsc::sync_channel(IN_FLIGHT);
    (
        Frames {
            order: queued,
            out: Vec::new(),
            out_pos: 0,
            done: false,
        },
        Splitter {
            input,
            buf: Vec::new(),
            pos: 0,
            input_done: false,
            jobs,
            order,
        },
        Pool {
            jobs: Arc::new(Mutex::new(rx)),
        },
    )
}

/// A piece that is already decoded (or an error), queued like a frame.
fn ready(r: io::Result<Vec<u8>>) -> Receiver<io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::sync_channel(1);
    let _ = tx.send(r);
    rx
}

impl<R: Read> Splitter<R> {
    /// Split until the input ends, fails (the error is queued in order), or the reader is gone.
    pub fn run(mut self) {
        if let Err(e) = self.split() {
            let _ = self.order.send(ready(Err(e)));
        }
    }

    fn split(&mut self) -> io::Result<()> {
        while self.fill(1)? {
            if !self.next_frame()? {
                // The reader is gone.
                return Ok(());
            }
        }
        Ok(())
    }

    /// Make at least `n` unconsumed bytes available; false if the input ends first.
    fn fill(&mut self, n: usize) -> io::Result<bool> {
        while self.buf.len() - self.pos < n {
            if self.input_done {
                return Ok(false);
            }
            if self.pos > 0 {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            let len = self.buf.len();
            self.buf.resize(len + READ_CHUNK, 0);
            let k = loop {
                match self.input.read(&mut self.buf[len..]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            };
            let k = match k {
                Ok(k) => k,
                Err(e) => {
                    self.buf.truncate(len);
                    return Err(e);
                }
            };
            self.buf.truncate(len + k);
            if k == 0 {
                self.input_done = true;
            }
        }
        Ok(true)
    }

    fn peek(&self, at: usize, n: usize) -> u64 {
        let b = &self.buf[self.pos + at..self.pos + at + n];
        b.iter().rev().fold(0u64, |v, &x| (v << 8) | u64::from(x))
    }

    /// Queue the next frame (at least one byte of it is buffered): to a decoding thread,
    /// skipped (skippable), or decoded here. False if the reader is gone.
    fn next_frame(&mut self) -> io::Result<bool> {
        if !self.fill(4)? {
            return Err(invalid("truncated zstd frame"));
        }
        let magic = self.peek(0, 4) as u32;
        if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC {
            if !self.fill(8)? {
                return Err(invalid("truncated skippable frame"));
            }
            let len = self.peek(4, 4) as usize;
            // Consumed as it arrives, never held.
            let mut left = 8 + len;
            while left > 0 {
                if !self.fill(1)? {
                    return Err(invalid("truncated skippable frame"));
                }
                let k = left.min(self.buf.len() - self.pos);
                self.pos += k;
                left -= k;
            }
            return Ok(true);
        }
        if magic != ZSTD_MAGIC {
            return Err(invalid("not a zstd frame"));
        }
        if !self.fill(5)? {
            return Err(invalid("truncated zstd frame header"));
        }
        let fhd = self.buf[self.pos + 4];
        let single = fhd & 0x20 != 0;
        let checksum = fhd & 0x04 != 0;
        let dict = [0usize, 1, 2, 4][usize::from(fhd & 3)];
        let fcs_len = match fhd >> 6 {
            0 if single => 1,
            0 => 0,
            1 => 2,
            2 => 4,
            _ => 8,
        };
        let header = 5 + usize::from(!single) + dict + fcs_len;
        if !self.fill(header)? {
            return Err(invalid("truncated zstd frame header"));
        }
        let size = match fcs_len {
            0 => None,
            2 => Some(self.peek(header - 2, 2) + 256),
            n => Some(self.peek(header - n, n)),
        };
        let size = match size.and_then(|s| usize::try_from(s).ok()) {
            Some(s) if s <= MAX_FRAME => s,
            _ => return self.stream_frame(),
        };
        // Walk the blocks to the frame's end; the frame is then taken whole.
        let mut end = header;
        loop {
            if !self.fill(end + 3)? {
                return Err(invalid("truncated zstd frame"));
            }
            let h = self.peek(end, 3) as usize;
            let (last, kind, len) = (h & 1 == 1, (h >> 1) & 3, h >> 3);
            let payload = match kind {
                0 | 2 => len,
                1 => 1,
                _ => return Err(invalid("reserved zstd block type")),
            };
            end += 3 + payload;
            // A frame's compressed size is bounded by its declared size (raw blocks at worst)
            // plus block headers: a stream that claims more is not a frame of this size.
            if end > size + size / 8 + 4096 {
                return Err(invalid("zstd frame larger than its declared size allows"));
            }
            if last {
                break;
            }
        }
        if checksum {
            end += 4;
        }
        if !self.fill(end)? {
            return Err(invalid("truncated zstd frame"));
        }
        let frame = self.buf[self.pos..self.pos + end].to_vec();
        self.pos += end;
        let (tx, rx) = mpsc::sync_channel(1);
        if self.jobs.send((frame, size, tx)).is_err() {
            return Err(io::Error::other("no zstd decoding thread"));
        }
        Ok(self.order.send(rx).is_ok())
    }

    /// Decode the frame that starts here as a stream, queueing its output as it comes.
    fn stream_frame(&mut self) -> io::Result<bool> {
        let mut dec = RawDecoder::new()?;
        loop {
            if self.buf.len() == self.pos && !self.fill(1)? {
                return Err(invalid("truncated zstd frame"));
            }
            let mut out = vec![0u8; 128 << 10];
            let mut input = InBuffer::around(&self.buf[self.pos..]);
            let mut output = OutBuffer::around(&mut out[..]);
            let hint = dec.run(&mut input, &mut output)?;
            let (used, made) = (input.pos(), output.pos());
            self.pos += used;
            out.truncate(made);
            if !out.is_empty() && self.order.send(ready(Ok(out))).is_err() {
                return Ok(false);
            }
            if hint == 0 {
                // The frame is decoded and flushed.
                return Ok(true);
            }
        }
    }
}

impl Read for Frames {
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.out_pos < self.out.len() {
                let n = dst.len().min(self.out.len() - self.out_pos);
                dst[..n].copy_from_slice(&self.out[self.out_pos..self.out_pos + n]);
                self.out_pos += n;
                return Ok(n);
            }
            if self.done {
                return Ok(0);
            }
            let Ok(next) = self.order.recv() else {
                // The splitter is done.
                self.done = true;
                return Ok(0);
            };
            match next.recv() {
                Ok(Ok(out)) => {
                    self.out = out;
                    self.out_pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => {
                    self.done = true;
                    return Err(io::Error::other("a zstd decoding thread stopped"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read `input` through [`Frames`] with `threads` decoding threads.
    fn read_all(input: &[u8], threads: usize) -> io::Result<Vec<u8>> {
        let (mut f, splitter, pool) = frames(input);
        std::thread::scope(|s| {
            s.spawn(|| splitter.run());
            for _ in 0..threads {
                s.spawn(|| pool.work());
            }
            let mut out = Vec::new();
            let r = f.read_to_end(&mut out).map(|_| out);
            drop(f);
            r
        })
    }

    fn data(n: usize) -> Vec<u8> {
        let mut x = 0x2545F4914F6CDD1Du64;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % 3 == 0 {
                    (x >> 32) as u8
                } else {
                    (i / 100) as u8
                }
            })
            .collect()
    }

    #[test]
    fn frames_small_and_large_read_as_one_stream_in_order() {
        let raw = data(30 << 20);
        let mut archive = Vec::new();
        // Small frames, a skippable frame, a frame larger than MAX_FRAME, a streamed frame
        // without a declared size, small frames again.
        let pieces = [
            (0, 3 << 20),
            (3 << 20, 7 << 20),
            (7 << 20, 17 << 20),
            (17 << 20, 18 << 20),
        ];
        for (a, b) in pieces {
            archive.extend(zstd::bulk::compress(&raw[a..b], 3).unwrap());
        }
        archive.extend([0x50, 0x2A, 0x4D, 0x18, 3, 0, 0, 0, 1, 2, 3]);
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        std::io::Write::write_all(&mut enc, &raw[18 << 20..20 << 20]).unwrap();
        archive.extend(enc.finish().unwrap());
        for c in raw[20 << 20..].chunks(1 << 20) {
            archive.extend(zstd::bulk::compress(c, 1).unwrap());
        }
        for threads in [1, 3] {
            let got = read_all(&archive, threads).unwrap();
            assert!(
                got == raw,
                "{threads} threads: the same bytes in the same order"
            );
        }
    }

    /// Input that arrives in pieces, when the test sends them.
    struct Trickle(Receiver<Vec<u8>>, Vec<u8>);

    impl Read for Trickle {
        fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
            if self.1.is_empty() {
                match self.0.recv() {
                    Ok(v) => self.1 = v,
                    Err(_) => return Ok(0),
                }
            }
            let n = dst.len().min(self.1.len());
            dst[..n].copy_from_slice(&self.1[..n]);
            self.1.drain(..n);
            Ok(n)
        }
    }

    #[test]
    fn what_has_arrived_is_read_while_the_next_frame_is_still_arriving() {
        let (a, b) = (data(1 << 20), data(3 << 20));
        let fa = zstd::bulk::compress(&a, 3).unwrap();
        let fb = zstd::bulk::compress(&b, 3).unwrap();
        let (tx, rx) = mpsc::channel();
        let (mut f, splitter, pool) = frames(Trickle(rx, Vec::new()));
        std::thread::scope(|s| {
            s.spawn(|| splitter.run());
            s.spawn(|| pool.work());
            // The first frame whole, the second one half.
            tx.send(fa.clone()).unwrap();
            tx.send(fb[..fb.len() / 2].to_vec()).unwrap();
            let (got_tx, got_rx) = mpsc::channel();
            let reader = s.spawn(move || {
                let mut first = vec![0u8; a.len()];
                f.read_exact(&mut first).unwrap();
                got_tx.send(first == a).unwrap();
                let mut rest = Vec::new();
                f.read_to_end(&mut rest).unwrap();
                rest
            });
            let first = got_rx.recv_timeout(std::time::Duration::from_secs(10));
            assert_eq!(
                first,
                Ok(true),
                "the first frame is read before the second arrives"
            );
            tx.send(fb[fb.len() / 2..].to_vec()).unwrap();
            drop(tx);
            assert!(reader.join().unwrap() == b);
        });
    }

    #[test]
    fn hostile_frames_are_invalid_data_not_a_panic_or_a_huge_allocation() {
        let raw = data(1 << 20);
        let good = zstd::bulk::compress(&raw, 3).unwrap();
        // Truncated anywhere.
        for cut in [1, 4, 6, 100, good.len() - 1] {
            let e = read_all(&good[..cut], 2).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "cut at {cut}: {e}");
        }
        // A declared size that is a lie (smaller than the content).
        let mut lie = good.clone();
        // Single-segment frames put the size right after the descriptor byte.
        let fhd = lie[4];
        assert_eq!(fhd >> 6, 2, "a 4-byte size");
        let at = 5 + usize::from(fhd & 0x20 == 0);
        lie[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(read_all(&lie, 2).is_err());
        // Garbage that is not zstd.
        assert!(read_all(b"not a zstd stream at all", 2).is_err());
        // A corrupt byte anywhere: an error or other bytes (the reader's hashes judge those),
        // never a panic.
        for at in (0..good.len()).step_by(997) {
            let mut bad = good.clone();
            bad[at] ^= 0xff;
            let _ = read_all(&bad, 2);
        }
        // Empty input: an empty stream.
        assert!(read_all(&[], 2).unwrap().is_empty());
    }
}
