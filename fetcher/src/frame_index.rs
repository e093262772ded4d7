//! The `zstd-frames` archive layout: every file its own zstd frame, found through a frame
//! index that opens the object.
//!
//! ```text
//! [skippable zstd frame 0x184D2A5E: len u32 | "SGFI" | version u32 | count u32 | entries]
//! [frame of file 0][frame of file 1]…          each an independent zstd frame, its size declared
//! entry = path_len u16 | path | offset u64 | compressed u64 | size u64 | sha256 [32]
//! ```
//!
//! All integers little-endian; offsets count from the first byte after the index. The files
//! the import trace read come first, in trace order, then the rest in path order. Any zstd
//! decoder reads the object as one stream (the index is a skippable frame): the files'
//! bytes, concatenated.
//!
//! The index is read before a byte of content and refused whole unless it is exact: frames in
//! archive order, back to back from offset 0 to the object's end (no overlap, no gap, nothing
//! past the end), each no larger than zstd's bound for the size it lists, paths short and
//! unique. A frame is checked again when decoded ([`decode_frame`]): its compressed length is
//! exactly one frame, its declared size is the listed one, and decoding stops at that size.
//!
//! Only std and zstd: the fuzz target includes this file by path.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::fmt;

/// The skippable frame's magic (one of the 16 zstd reserves for skippable frames).
pub const MAGIC: u32 = 0x184D_2A5E;
/// Tag and version opening the index's payload.
const TAG: &[u8; 4] = b"SGFI";
const VERSION: u32 = 1;
/// Bytes before the payload: the skippable frame's magic and length.
pub const PREFIX: usize = 8;
/// A path longer than this is refused (no file system keeps longer ones).
pub const MAX_PATH: usize = 4096;
/// Fixed bytes of an entry besides its path.
const ENTRY_FIXED: usize = 2 + 8 + 8 + 8 + 32;

/// One file of the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameEntry {
    pub path: String,
    /// Of the frame's first byte, after the index.
    pub offset: u64,
    /// The frame's length.
    pub compressed: u64,
    /// The file's length, decoded.
    pub size: u64,
    pub sha256: [u8; 32],
}

/// Why an index or a frame is refused: one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

fn refused(msg: impl Into<String>) -> Refused {
    Refused(msg.into())
}

/// The largest a zstd frame of `size` decoded bytes can be (ZSTD_COMPRESSBOUND, plus room
/// for a frame header and checksum).
pub fn compress_bound(size: u64) -> u64 {
    let small = if size < (128 << 10) {
        ((128 << 10) - size) >> 11
    } else {
        0
    };
    size.saturating_add(size >> 8)
        .saturating_add(small)
        .saturating_add(32)
}

/// The largest payload an index of `files` entries can have.
pub fn max_payload(files: usize) -> u64 {
    12 + (files as u64).saturating_mul((ENTRY_FIXED + MAX_PATH) as u64)
}

/// The index as the skippable frame that opens the archive.
pub fn encode(entries: &[FrameEntry]) -> Vec<u8> {
    let mut p = Vec::with_capacity(12 + entries.len() * (ENTRY_FIXED + 48));
    p.extend_from_slice(TAG);
    p.extend_from_slice(&VERSION.to_le_bytes());
    p.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in entries {
        p.extend_from_slice(&(e.path.len() as u16).to_le_bytes());
        p.extend_from_slice(e.path.as_bytes());
        p.extend_from_slice(&e.offset.to_le_bytes());
        p.extend_from_slice(&e.compressed.to_le_bytes());
        p.extend_from_slice(&e.size.to_le_bytes());
        p.extend_from_slice(&e.sha256);
    }
    let mut out = Vec::with_capacity(PREFIX + p.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&(p.len() as u32).to_le_bytes());
    out.extend_from_slice(&p);
    out
}

/// The payload length the archive's first [`PREFIX`] bytes announce, refused above
/// `max_payload` (see [`max_payload`]) before anything is allocated for it.
pub fn payload_len(prefix: &[u8; PREFIX], max_payload: u64) -> Result<usize, Refused> {
    let magic = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if magic != MAGIC {
        return Err(refused("no frame index at the archive's start"));
    }
    let len = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]);
    if u64::from(len) > max_payload || len < 12 {
        return Err(refused(format!(
            "frame index of {len} bytes, at most {max_payload} for this package"
        )));
    }
    Ok(len as usize)
}

/// Read `n` bytes at `*at`, or refuse: the payload ends first.
fn take<'a>(p: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], Refused> {
    let end = at
        .checked_add(n)
        .filter(|&e| e <= p.len())
        .ok_or_else(|| refused("frame index cut short"))?;
    let s = &p[*at..end];
    *at = end;
    Ok(s)
}

fn u64_at(p: &[u8], at: &mut usize) -> Result<u64, Refused> {
    let b = take(p, at, 8)?;
    Ok(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

/// Parse and check the index's payload for an archive whose frames take `data_len` bytes
/// after the index and which must list `files` files. Every rule of the module docs is
/// checked here; what each entry must match (the bucket index's sha256 and size) is the
/// caller's.
pub fn decode(payload: &[u8], files: usize, data_len: u64) -> Result<Vec<FrameEntry>, Refused> {
    let mut at = 0;
    if take(payload, &mut at, 4)? != TAG {
        return Err(refused("not a frame index"));
    }
    let version = u32::from_le_bytes(take(payload, &mut at, 4)?.try_into().unwrap_or([0; 4]));
    if version != VERSION {
        return Err(refused(format!("frame index version {version}")));
    }
    let count = u32::from_le_bytes(take(payload, &mut at, 4)?.try_into().unwrap_or([0; 4]));
    if count as usize != files {
        return Err(refused(format!(
            "frame index lists {count} files, the package {files}"
        )));
    }
    let mut out = Vec::with_capacity(files.min(payload.len() / ENTRY_FIXED));
    let mut paths = HashSet::new();
    let mut next = 0u64;
    for _ in 0..count {
        let n = u16::from_le_bytes(take(payload, &mut at, 2)?.try_into().unwrap_or([0; 2]));
        let n = usize::from(n);
        if n == 0 || n > MAX_PATH {
            return Err(refused(format!("a path of {n} bytes in the frame index")));
        }
        let path = std::str::from_utf8(take(payload, &mut at, n)?)
            .map_err(|_| refused("a path in the frame index is not UTF-8"))?
            .to_owned();
        let offset = u64_at(payload, &mut at)?;
        let compressed = u64_at(payload, &mut at)?;
        let size = u64_at(payload, &mut at)?;
        let mut sha256 = [0u8; 32];
        sha256.copy_from_slice(take(payload, &mut at, 32)?);
        if offset != next {
            return Err(refused(format!(
                "{path}: frame at {offset}, the previous one ends at {next} (frames overlap or leave a gap)"
            )));
        }
        if compressed == 0 || compressed > compress_bound(size) {
            return Err(refused(format!(
                "{path}: a frame of {compressed} bytes for {size} bytes of content"
            )));
        }
        next = offset
            .checked_add(compressed)
            .filter(|&e| e <= data_len)
            .ok_or_else(|| {
                refused(format!(
                    "{path}: frame ends past the archive's end ({data_len} bytes of frames)"
                ))
            })?;
        if !paths.insert(path.clone()) {
            return Err(refused(format!("{path}: listed twice in the frame index")));
        }
        out.push(FrameEntry {
            path,
            offset,
            compressed,
            size,
            sha256,
        });
    }
    if at != payload.len() {
        return Err(refused("bytes after the frame index's last entry"));
    }
    if next != data_len {
        return Err(refused(format!(
            "frames end at {next}, the archive at {data_len}"
        )));
    }
    Ok(out)
}

/// `frame` is exactly one zstd frame that declares `size` decoded bytes (or none): refused
/// otherwise, before a byte is decoded.
pub fn check_frame(frame: &[u8], size: u64) -> Result<(), Refused> {
    match zstd::zstd_safe::find_frame_compressed_size(frame) {
        Ok(n) if n == frame.len() => {}
        Ok(n) => {
            return Err(refused(format!(
                "a frame of {n} bytes where the index says {}",
                frame.len()
            )))
        }
        Err(_) => return Err(refused("not a zstd frame")),
    }
    match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(declared)) if declared != size => Err(refused(format!(
            "a frame that declares {declared} bytes where the index says {size}"
        ))),
        Ok(_) => Ok(()),
        Err(_) => Err(refused("not a zstd frame")),
    }
}

/// Decode one file's frame (checked by [`check_frame`]) into at most `size` bytes: a frame
/// that expands past its bound is refused, never decoded further.
pub fn decode_frame(frame: &[u8], size: u64) -> Result<Vec<u8>, Refused> {
    check_frame(frame, size)?;
    let cap = usize::try_from(size).map_err(|_| refused("a file too large for memory"))?;
    thread_local! {
        // One decoding context per thread, for every frame it decodes (a new one per file
        // would allocate and free ~100 KiB for each of numpy's 1,500 files).
        static DECODER: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let out = DECODER
        .with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::new()?);
            }
            match d.as_mut() {
                Some(d) => d.decompress(frame, cap),
                None => Err(std::io::Error::other("no zstd decoder")),
            }
        })
        .map_err(|e| refused(format!("a frame that does not decode to {size} bytes: {e}")))?;
    if out.len() as u64 != size {
        return Err(refused(format!(
            "a frame that decodes to {} bytes where the index says {size}",
            out.len()
        )));
    }
    Ok(out)
}

/// The archive of `files` (path, content, sha256), in that order: the index, then each
/// file's frame at zstd `level`.
pub fn build<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a [u8], [u8; 32])>,
    level: i32,
) -> std::io::Result<Vec<u8>> {
    let mut entries = Vec::new();
    let mut data = Vec::new();
    for (path, content, sha256) in files {
        let frame = zstd::bulk::compress(content, level)?;
        entries.push(FrameEntry {
            path: path.to_owned(),
            offset: data.len() as u64,
            compressed: frame.len() as u64,
            size: content.len() as u64,
            sha256,
        });
        data.extend_from_slice(&frame);
    }
    let mut out = encode(&entries);
    out.extend_from_slice(&data);
    Ok(out)
}

/// Lowercase hex of a sha256, as the bucket index writes it.
pub fn hex(sha: &[u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in sha {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(files: &[(&str, Vec<u8>)]) -> (Vec<FrameEntry>, Vec<u8>) {
        let mut entries = Vec::new();
        let mut data = Vec::new();
        for (p, c) in files {
            let f = zstd::bulk::compress(c, 3).unwrap();
            entries.push(FrameEntry {
                path: (*p).into(),
                offset: data.len() as u64,
                compressed: f.len() as u64,
                size: c.len() as u64,
                sha256: [7; 32],
            });
            data.extend(f);
        }
        (entries, data)
    }

    fn parse(index: &[u8], files: usize, data_len: u64) -> Result<Vec<FrameEntry>, Refused> {
        let prefix: [u8; PREFIX] = index[..PREFIX].try_into().unwrap();
        let n = payload_len(&prefix, max_payload(files))?;
        decode(&index[PREFIX..PREFIX + n], files, data_len)
    }

    #[test]
    fn an_index_reads_back_and_every_frame_decodes_to_its_file() {
        let files = [
            ("a/__init__.py", b"import b\n".to_vec()),
            ("a/empty.py", Vec::new()),
            ("a/big.bin", vec![3u8; 300_000]),
        ];
        let (entries, data) = archive(&files);
        let index = encode(&entries);
        assert_eq!(&index[..4], &MAGIC.to_le_bytes());
        let got = parse(&index, 3, data.len() as u64).unwrap();
        assert_eq!(got, entries);
        for (e, (_, c)) in got.iter().zip(&files) {
            let f = &data[e.offset as usize..(e.offset + e.compressed) as usize];
            assert_eq!(&decode_frame(f, e.size).unwrap(), c);
        }
        // Any zstd decoder reads the whole object as the files' bytes, in order.
        let mut whole = index.clone();
        whole.extend(&data);
        let all: Vec<u8> = files.iter().flat_map(|(_, c)| c.clone()).collect();
        assert_eq!(zstd::decode_all(&whole[..]).unwrap(), all);
        assert_eq!(hex(&[0xab; 32]), "ab".repeat(32));
    }

    #[test]
    fn hostile_indexes_are_refused() {
        let noise = |n: usize| {
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect::<Vec<u8>>()
        };
        let files = [("a.py", noise(5000)), ("b.py", noise(7000))];
        let (entries, data) = archive(&files);
        let len = data.len() as u64;
        let check = |mut e: Vec<FrameEntry>, f: &dyn Fn(&mut Vec<FrameEntry>), want: &str| {
            f(&mut e);
            let err = parse(&encode(&e), 2, len).unwrap_err();
            assert!(err.0.contains(want), "{want}: {err}");
        };
        check(entries.clone(), &|e| e[1].offset -= 1, "overlap");
        check(
            entries.clone(),
            &|e| e[1].offset += 1,
            "overlap or leave a gap",
        );
        check(
            entries.clone(),
            &|e| e[1].compressed += 1,
            "past the archive's end",
        );
        check(entries.clone(), &|e| e[1].offset = u64::MAX, "overlap");
        check(
            entries.clone(),
            &|e| {
                e[1].compressed = u64::MAX;
                e[1].size = u64::MAX;
            },
            "past the archive's end",
        );
        check(entries.clone(), &|e| e[0].size = 1, "bytes of content");
        check(entries.clone(), &|e| e[1].path = "a.py".into(), "twice");
        check(
            entries.clone(),
            &|e| e[1].path = String::new(),
            "a path of 0",
        );
        check(entries.clone(), &|e| e.truncate(1), "lists 1 files");
        // The archive goes on after the last frame.
        let err = parse(&encode(&entries), 2, len + 10).unwrap_err();
        assert!(err.0.contains("frames end at"), "{err}");
        // A payload larger than the package allows is refused before it is read.
        let mut huge = encode(&entries);
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(&huge, 2, len).unwrap_err().0.contains("at most"));
        // Cut anywhere: refused, never a panic.
        let good = encode(&entries);
        for cut in PREFIX..good.len() {
            let mut bad = good[..cut].to_vec();
            let n = (cut - PREFIX) as u32;
            bad[4..8].copy_from_slice(&n.to_le_bytes());
            assert!(parse(&bad, 2, len).is_err(), "cut at {cut}");
        }
        // Not an index at all.
        assert!(parse(b"\x28\xb5\x2f\xfd0000", 2, len).is_err());
    }

    #[test]
    fn hostile_frames_are_refused_before_they_expand() {
        let content = vec![0u8; 1 << 20];
        let f = zstd::bulk::compress(&content, 3).unwrap();
        // A bomb: the frame holds more than the index lists.
        let e = decode_frame(&f, 1000).unwrap_err();
        assert!(e.0.contains("declares 1048576"), "{e}");
        // A frame without a declared size still stops at the listed size.
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.include_contentsize(false).unwrap();
        std::io::Write::write_all(&mut enc, &content).unwrap();
        let undeclared = enc.finish().unwrap();
        assert!(decode_frame(&undeclared, 1000).is_err());
        assert_eq!(decode_frame(&undeclared, 1 << 20).unwrap(), content);
        // Two frames where one is listed; a frame cut short; garbage.
        let mut two = f.clone();
        two.extend(&f);
        assert!(decode_frame(&two, 1 << 20)
            .unwrap_err()
            .0
            .contains("where the index says"));
        assert!(decode_frame(&f[..f.len() - 1], 1 << 20).is_err());
        assert!(decode_frame(b"garbage!", 8).is_err());
        // A flipped byte anywhere: refused or other bytes (the hash judges those), no panic.
        for at in 0..f.len() {
            let mut bad = f.clone();
            bad[at] ^= 0x55;
            let _ = decode_frame(&bad, 1 << 20);
        }
    }
}
