//! The fetcher's frame index (`fetcher/src/frame_index.rs`, included by path: it needs only
//! zstd): any bytes as an archive's index and frames end in entries or a refusal, never a
//! panic or an allocation beyond the package's bound; every entry accepted lies inside the
//! archive, back to back with the next; a frame decodes to at most its listed size; and an
//! index the builder wrote reads back as written.
#![no_main]

#[path = "../../fetcher/src/frame_index.rs"]
#[allow(dead_code)]
mod frame_index;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let files = usize::from(data.first().copied().unwrap_or(0) % 16);
    let data = data.get(1..).unwrap_or_default();
    if data.len() >= frame_index::PREFIX {
        let prefix: [u8; frame_index::PREFIX] = data[..frame_index::PREFIX].try_into().unwrap();
        let max = frame_index::max_payload(files).min(data.len() as u64);
        if let Ok(n) = frame_index::payload_len(&prefix, max) {
            let end = (frame_index::PREFIX + n).min(data.len());
            let (payload, frames) = (&data[frame_index::PREFIX..end], &data[end..]);
            if let Ok(entries) = frame_index::decode(payload, files, frames.len() as u64) {
                let mut next = 0;
                for e in &entries {
                    assert_eq!(e.offset, next);
                    next = e.offset + e.compressed;
                    let frame = &frames[e.offset as usize..next as usize];
                    if let Ok(out) = frame_index::decode_frame(frame, e.size.min(1 << 20)) {
                        assert!(out.len() as u64 <= e.size);
                    }
                }
                assert_eq!(next, frames.len() as u64);
            }
        }
    }
    // The same bytes as files, built and read back.
    let contents: Vec<&[u8]> = data.chunks(1 + data.len() / (files + 1)).collect();
    let names: Vec<String> = (0..contents.len()).map(|i| format!("p/{i}.py")).collect();
    let built = frame_index::build(
        names
            .iter()
            .zip(&contents)
            .map(|(p, c)| (p.as_str(), *c, [0u8; 32])),
        1,
    )
    .unwrap();
    let prefix: [u8; frame_index::PREFIX] = built[..frame_index::PREFIX].try_into().unwrap();
    let n = frame_index::payload_len(&prefix, frame_index::max_payload(contents.len())).unwrap();
    let frames = &built[frame_index::PREFIX + n..];
    let entries = frame_index::decode(
        &built[frame_index::PREFIX..frame_index::PREFIX + n],
        contents.len(),
        frames.len() as u64,
    )
    .unwrap();
    for (e, c) in entries.iter().zip(&contents) {
        let frame = &frames[e.offset as usize..(e.offset + e.compressed) as usize];
        assert_eq!(frame_index::decode_frame(frame, e.size).unwrap(), *c);
    }
});
