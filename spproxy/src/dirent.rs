//! σOS's directory and watch encodings.
//!
//! A read of a directory fd returns whole entries, each one frame: `u32 len (counting its
//! own 4 bytes) | TstatProto` (session/codec/dir.go `MarshalDirEnt`); an entry that does not
//! fit in the requested count is left for the next read. A read of a DirWatch fd returns a
//! byte stream of records `u32 len | WatchEventList` (fslib/dirwatcher `readUpdates`).

use std::collections::BTreeSet;

use prost::Message;

use crate::proto::{TstatProto, WatchEvent, WatchEventList, WatchEventType};

/// Encodes entries as σOS directory frames.
pub fn encode_dir(entries: &[TstatProto]) -> Vec<u8> {
    let mut out = Vec::new();
    for st in entries {
        let b = st.encode_to_vec();
        let len = u32::try_from(b.len() + 4).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&b);
    }
    out
}

/// The whole entries of `listing` that start at byte `off` and fit in `count` bytes.
/// `off` past the end, or not at an entry boundary, reads nothing.
pub fn dir_slice(listing: &[u8], off: u64, count: u64) -> &[u8] {
    let Ok(start) = usize::try_from(off) else {
        return &[];
    };
    let mut at = 0usize;
    while at < start {
        match entry_len(listing, at) {
            Some(n) => at += n,
            None => return &[],
        }
    }
    if at != start {
        return &[];
    }
    let mut end = start;
    while let Some(n) = entry_len(listing, end) {
        let next = end + n;
        if u64::try_from(next - start).unwrap_or(u64::MAX) > count {
            break;
        }
        end = next;
    }
    &listing[start..end]
}

fn entry_len(listing: &[u8], at: usize) -> Option<usize> {
    let hdr: [u8; 4] = listing.get(at..at.checked_add(4)?)?.try_into().ok()?;
    let n = usize::try_from(u32::from_le_bytes(hdr)).ok()?;
    (n >= 4 && at.checked_add(n)? <= listing.len()).then_some(n)
}

/// Decodes σOS directory frames (the client's side, and the tests').
pub fn decode_dir(mut b: &[u8]) -> Result<Vec<TstatProto>, String> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let hdr: [u8; 4] = b
            .get(..4)
            .and_then(|h| h.try_into().ok())
            .ok_or("truncated directory entry header")?;
        let n = u32::from_le_bytes(hdr) as usize;
        if n < 4 || n > b.len() {
            return Err(format!("directory entry length {n} out of range"));
        }
        out.push(TstatProto::decode(&b[4..n]).map_err(|e| e.to_string())?);
        b = &b[n..];
    }
    Ok(out)
}

/// The events that turn `old` into `new` (removals first), or `None` if nothing changed.
pub fn diff(old: &BTreeSet<String>, new: &BTreeSet<String>) -> Option<WatchEventList> {
    let mut events: Vec<WatchEvent> = old
        .difference(new)
        .map(|f| WatchEvent {
            file: f.clone(),
            r#type: WatchEventType::Remove as i32,
        })
        .collect();
    events.extend(new.difference(old).map(|f| WatchEvent {
        file: f.clone(),
        r#type: WatchEventType::Create as i32,
    }));
    (!events.is_empty()).then_some(WatchEventList { events })
}

/// One watch record: `u32 len | WatchEventList`.
pub fn encode_watch(list: &WatchEventList) -> Vec<u8> {
    let b = list.encode_to_vec();
    let mut out = Vec::with_capacity(4 + b.len());
    out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&b);
    out
}

/// Decodes a stream of watch records (the client's side, and the tests').
pub fn decode_watch(mut b: &[u8]) -> Result<Vec<WatchEvent>, String> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let hdr: [u8; 4] = b
            .get(..4)
            .and_then(|h| h.try_into().ok())
            .ok_or("truncated watch record header")?;
        let n = u32::from_le_bytes(hdr) as usize;
        let body = b
            .get(4..4usize.saturating_add(n))
            .ok_or("truncated watch record")?;
        out.extend(
            WatchEventList::decode(body)
                .map_err(|e| e.to_string())?
                .events,
        );
        b = &b[4 + n..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(name: &str) -> TstatProto {
        TstatProto {
            name: name.into(),
            length: 7,
            ..Default::default()
        }
    }

    #[test]
    fn dir_frames_round_trip_and_slice_whole_entries() {
        let ents = [st("a"), st("bb"), st("ccc")];
        let enc = encode_dir(&ents);
        assert_eq!(decode_dir(&enc).unwrap(), ents);
        let first = entry_len(&enc, 0).unwrap();
        assert_eq!(dir_slice(&enc, 0, first as u64), &enc[..first]);
        assert_eq!(dir_slice(&enc, 0, first as u64 - 1), b"");
        assert_eq!(dir_slice(&enc, first as u64, u64::MAX), &enc[first..]);
        assert_eq!(dir_slice(&enc, 1, u64::MAX), b"");
        assert_eq!(dir_slice(&enc, u64::MAX, u64::MAX), b"");
        assert!(decode_dir(&[9, 0, 0, 0]).is_err());
    }

    #[test]
    fn watch_diff_and_records() {
        let old: BTreeSet<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        let new: BTreeSet<String> = ["b", "c"].iter().map(|s| s.to_string()).collect();
        assert!(diff(&old, &old).is_none());
        let ev = diff(&old, &new).unwrap();
        let enc = encode_watch(&ev);
        let back = decode_watch(&enc).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(
            (back[0].file.as_str(), back[0].r#type),
            ("a", WatchEventType::Remove as i32)
        );
        assert_eq!(
            (back[1].file.as_str(), back[1].r#type),
            ("c", WatchEventType::Create as i32)
        );
    }
}
