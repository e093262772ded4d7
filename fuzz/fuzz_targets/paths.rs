//! The realm path resolver: whatever it accepts stays inside the realm.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spproxy::server::paths::{self, Target};

fuzz_target!(|data: &[u8]| {
    let path = String::from_utf8_lossy(data);
    match paths::parse(&path) {
        Ok(Target::Ux(rel)) => {
            assert!(!rel.starts_with('/'), "{rel:?}");
            assert!(!rel.split('/').any(|c| c == ".."), "{rel:?}");
            assert!(!rel.contains('\0'));
        }
        Ok(Target::S3 { bucket, key }) => {
            assert!(!bucket.is_empty() && !bucket.contains('/'));
            assert!(!key.split('/').any(|c| c == ".."), "{key:?}");
            assert!(!key.contains('\0'));
        }
        Err(_) => {}
    }
});
