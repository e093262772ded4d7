//! Test helper for the TOCTOU guarantee: one thread flips a shared path buffer between an
//! allowed and a denied path while the main thread opens whatever the buffer holds, N times,
//! with raw openat(2) so the kernel reads the racing buffer itself.
//!
//! Usage: sigma-toctou-probe ALLOWED DENIED SECRET N
//! Prints `opens=<ok> denied=<errors> empty=<opens that read nothing> leaked=<times SECRET was read>`; exit 0 when leaked == 0.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

const LEN: usize = 512;

fn store(buf: &[AtomicU8; LEN], path: &[u8]) {
    for (i, b) in path.iter().chain(std::iter::once(&0u8)).enumerate() {
        buf[i].store(*b, Ordering::Relaxed);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: sigma-toctou-probe ALLOWED DENIED SECRET N");
        std::process::exit(2);
    }
    let (allowed, denied, secret) = (args[1].as_bytes(), args[2].as_bytes(), args[3].as_bytes());
    let n: usize = args[4].parse().expect("N is a number");
    assert!(allowed.len() < LEN && denied.len() < LEN);
    let buf: Arc<[AtomicU8; LEN]> = Arc::new(std::array::from_fn(|_| AtomicU8::new(0)));
    store(&buf, allowed);
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (buf, stop) = (Arc::clone(&buf), Arc::clone(&stop));
        let (a, d) = (allowed.to_vec(), denied.to_vec());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                store(&buf, &d);
                std::hint::spin_loop();
                store(&buf, &a);
            }
        })
    };
    let (mut opens, mut errors, mut leaked, mut empty) = (0u64, 0u64, 0u64, 0u64);
    let mut content = [0u8; 4096];
    for _ in 0..n {
        // SAFETY: `buf` is a live 512-byte buffer of AtomicU8 (same layout as u8) that always
        // holds a NUL within bounds (both paths are shorter than LEN and NUL-terminated); the
        // kernel only reads it.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat,
                libc::AT_FDCWD,
                buf.as_ptr() as *const libc::c_char,
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        } as i32;
        if fd < 0 {
            errors += 1;
            continue;
        }
        opens += 1;
        // SAFETY: `fd` was just returned by openat and is owned here; `content` is writable.
        let got = unsafe { libc::read(fd, content.as_mut_ptr().cast(), content.len()) };
        if got > 0 && content[..got as usize].starts_with(secret) {
            leaked += 1;
        }
        if got == 0 {
            // The denied path's kernel-side stand-in (an empty read-only file).
            empty += 1;
        }
        // SAFETY: closing the fd we own exactly once.
        unsafe { libc::close(fd) };
    }
    stop.store(true, Ordering::Relaxed);
    let _ = flipper.join();
    println!("opens={opens} denied={errors} empty={empty} leaked={leaked}");
    std::process::exit(if leaked == 0 { 0 } else { 1 });
}
