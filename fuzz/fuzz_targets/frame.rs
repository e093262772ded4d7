//! The frame reader on arbitrary bytes: an error or a message, never a panic, never an
//! allocation beyond what arrived (small limits make oversized headers cheap to hit).
#![no_main]

use libfuzzer_sys::fuzz_target;
use spproxy::frame::{self, Limits};

fuzz_target!(|data: &[u8]| {
    let lim = Limits {
        max_frames: 64,
        max_frame_len: 1 << 16,
        max_message_len: 1 << 18,
    };
    let mut r = data;
    while let Ok(Some(m)) = frame::read_message(&mut r, &lim) {
        // What was read re-encodes to the bytes it came from.
        let again = frame::encode(m.seqno, &m.frames);
        let back = frame::read_message(&mut again.as_slice(), &lim)
            .expect("re-encoded message reads")
            .expect("one message");
        assert_eq!(back, m);
    }
});
