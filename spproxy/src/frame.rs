//! Message framing: `u64 seqno | u32 nframes | nframes × (u32 len | payload[len-4])`,
//! all little-endian; a frame's length counts its own 4 bytes.

use std::io::{self, Read, Write};

/// Bounds a reader enforces so a malformed or hostile header is an error, never an OOM.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most frames one message may carry.
    pub max_frames: u32,
    /// Largest payload of one frame, in bytes.
    pub max_frame_len: u32,
    /// Largest sum of payloads in one message, in bytes.
    pub max_message_len: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frames: 4096,
            max_frame_len: 1 << 30,
            max_message_len: 1 << 31,
        }
    }
}

/// One message: its sequence number and its frames' payloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    pub seqno: u64,
    pub frames: Vec<Vec<u8>>,
}

#[derive(thiserror::Error, Debug)]
pub enum FrameError {
    #[error("reading or writing a frame: {0}")]
    Io(#[from] io::Error),
    #[error("connection closed in the middle of a message (seqno {seqno})")]
    Truncated { seqno: u64 },
    #[error("frame {index} of message {seqno} has length {len} < 4")]
    BadLen { seqno: u64, index: u32, len: u32 },
    #[error("message {seqno} announces {nframes} frames (limit {limit})")]
    TooManyFrames {
        seqno: u64,
        nframes: u32,
        limit: u32,
    },
    #[error("message {seqno}: frame {index} of {len} bytes exceeds the limit of {limit}")]
    FrameTooLarge {
        seqno: u64,
        index: u32,
        len: u64,
        limit: u64,
    },
}

/// Bytes of a message holding `frames`: header plus 4 bytes and the payload per frame.
pub fn encoded_len<F: AsRef<[u8]>>(frames: &[F]) -> usize {
    12 + frames.iter().map(|f| 4 + f.as_ref().len()).sum::<usize>()
}

/// Appends one whole message to `out`.
///
/// # Panics
/// If a frame is longer than `u32::MAX - 4` bytes or there are more than `u32::MAX` frames,
/// which the wire format cannot express.
pub fn encode_into<F: AsRef<[u8]>>(out: &mut Vec<u8>, seqno: u64, frames: &[F]) {
    out.reserve(encoded_len(frames));
    out.extend_from_slice(&seqno.to_le_bytes());
    let n = u32::try_from(frames.len()).expect("frame count fits in u32");
    out.extend_from_slice(&n.to_le_bytes());
    for f in frames {
        let f = f.as_ref();
        let len = u32::try_from(f.len() + 4).expect("frame length fits in u32");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(f);
    }
}

/// Encodes one whole message.
pub fn encode<F: AsRef<[u8]>>(seqno: u64, frames: &[F]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, seqno, frames);
    out
}

/// Writes one message with a single `write_all` (one buffer, usually one syscall).
pub fn write_message<W: Write, F: AsRef<[u8]>>(
    w: &mut W,
    seqno: u64,
    frames: &[F],
) -> io::Result<()> {
    w.write_all(&encode(seqno, frames))
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` if the stream ended before the first byte.
fn read_exact_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads one message. `Ok(None)` on a clean end of stream between messages.
///
/// Payload buffers grow as bytes actually arrive, so a header announcing a huge
/// frame costs nothing until the peer really sends that much.
pub fn read_message<R: Read>(r: &mut R, limits: &Limits) -> Result<Option<Message>, FrameError> {
    let mut hdr = [0u8; 12];
    if !read_exact_or_eof(r, &mut hdr)? {
        return Ok(None);
    }
    let seqno = u64::from_le_bytes(hdr[..8].try_into().expect("8 bytes"));
    let nframes = u32::from_le_bytes(hdr[8..].try_into().expect("4 bytes"));
    if nframes > limits.max_frames {
        return Err(FrameError::TooManyFrames {
            seqno,
            nframes,
            limit: limits.max_frames,
        });
    }
    let trunc = |e: io::Error| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            FrameError::Truncated { seqno }
        } else {
            FrameError::Io(e)
        }
    };
    let mut frames = Vec::with_capacity(nframes as usize);
    let mut total: u64 = 0;
    for index in 0..nframes {
        let mut lb = [0u8; 4];
        r.read_exact(&mut lb).map_err(trunc)?;
        let len = u32::from_le_bytes(lb);
        if len < 4 {
            return Err(FrameError::BadLen { seqno, index, len });
        }
        let plen = len - 4;
        if plen > limits.max_frame_len {
            return Err(FrameError::FrameTooLarge {
                seqno,
                index,
                len: plen.into(),
                limit: limits.max_frame_len.into(),
            });
        }
        total += u64::from(plen);
        if total > limits.max_message_len {
            return Err(FrameError::FrameTooLarge {
                seqno,
                index,
                len: total,
                limit: limits.max_message_len,
            });
        }
        let mut payload = Vec::with_capacity((plen as usize).min(1 << 20));
        let got = r
            .by_ref()
            .take(u64::from(plen))
            .read_to_end(&mut payload)
            .map_err(FrameError::Io)?;
        if got != plen as usize {
            return Err(FrameError::Truncated { seqno });
        }
        frames.push(payload);
    }
    Ok(Some(Message { seqno, frames }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_empty_frame() {
        let buf = encode(7, &[b"ab".as_slice(), b"".as_slice()]);
        assert_eq!(
            buf,
            [7, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 6, 0, 0, 0, b'a', b'b', 4, 0, 0, 0]
        );
        let m = read_message(&mut buf.as_slice(), &Limits::default())
            .unwrap()
            .unwrap();
        assert_eq!(m.seqno, 7);
        assert_eq!(m.frames, vec![b"ab".to_vec(), vec![]]);
    }

    #[test]
    fn clean_eof_is_none_and_partial_is_truncated() {
        assert!(read_message(&mut [].as_slice(), &Limits::default())
            .unwrap()
            .is_none());
        let buf = encode(3, &[b"hello"]);
        let err = read_message(&mut &buf[..buf.len() - 1], &Limits::default()).unwrap_err();
        assert!(matches!(err, FrameError::Truncated { seqno: 3 }), "{err}");
        let err = read_message(&mut &buf[..5], &Limits::default()).unwrap_err();
        assert!(matches!(err, FrameError::Io(_)), "{err}");
    }

    #[test]
    fn rejects_short_len_and_huge_headers() {
        let mut buf = encode(1, &[b"x"]);
        buf[12..16].copy_from_slice(&3u32.to_le_bytes());
        let err = read_message(&mut buf.as_slice(), &Limits::default()).unwrap_err();
        assert!(matches!(err, FrameError::BadLen { len: 3, .. }), "{err}");

        let mut hdr = 1u64.to_le_bytes().to_vec();
        hdr.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = read_message(&mut hdr.as_slice(), &Limits::default()).unwrap_err();
        assert!(matches!(err, FrameError::TooManyFrames { .. }), "{err}");

        // A frame announcing u32::MAX bytes with none behind it: an error, no allocation.
        let mut buf = 1u64.to_le_bytes().to_vec();
        buf.extend_from_slice(&1u32.to_le_bytes());
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = read_message(&mut buf.as_slice(), &Limits::default()).unwrap_err();
        assert!(matches!(err, FrameError::FrameTooLarge { .. }), "{err}");
        let small = Limits {
            max_frame_len: 1 << 20,
            ..Limits::default()
        };
        let mut buf = 1u64.to_le_bytes().to_vec();
        buf.extend_from_slice(&1u32.to_le_bytes());
        buf.extend_from_slice(&1000u32.to_le_bytes());
        let err = read_message(&mut buf.as_slice(), &small).unwrap_err();
        assert!(matches!(err, FrameError::Truncated { .. }), "{err}");
    }
}
