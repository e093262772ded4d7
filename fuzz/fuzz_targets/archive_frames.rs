//! The fetcher's archive frame splitter (`fetcher/src/frames.rs`, included by path: it needs
//! only zstd): any input ends in bytes or an error, never a panic, a hang or an unbounded
//! allocation; and a valid stream of frames reads back as what was compressed.
#![no_main]

#[path = "../../fetcher/src/frames.rs"]
#[allow(dead_code)]
mod frames;

use libfuzzer_sys::fuzz_target;
use std::io::Read;

/// Decoded bytes read at most (a few frames of compressed input can declare megabytes each).
const CAP: usize = 64 << 20;

fn read_capped(input: &[u8]) -> std::io::Result<Vec<u8>> {
    let (mut reader, splitter, pool) = frames::frames(input);
    std::thread::scope(|s| {
        s.spawn(|| splitter.run());
        s.spawn(|| pool.work());
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let r = loop {
            match reader.read(&mut buf) {
                Ok(0) => break Ok(out),
                Ok(n) if out.len() + n <= CAP => out.extend_from_slice(&buf[..n]),
                Ok(_) => break Ok(out),
                Err(e) => break Err(e),
            }
        };
        drop(reader);
        r
    })
}

fuzz_target!(|data: &[u8]| {
    // Hostile bytes as an archive.
    let _ = read_capped(data);
    // The same bytes as content, cut into frames as publish does: read back unchanged.
    if data.len() <= 1 << 16 {
        let mut archive = Vec::new();
        for piece in data.chunks(1 + data.first().copied().unwrap_or(0) as usize * 64) {
            archive.extend(zstd::bulk::compress(piece, 1).unwrap());
        }
        assert_eq!(read_capped(&archive).unwrap(), data);
    }
});
