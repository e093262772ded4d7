//! σOS's `uproc-trampoline` contract, read and checked before anything runs: procd execs the
//! trampoline as `uproc-trampoline PID /mnt/binfs/NAME-vVERSION true|false ARGS…` with an
//! environment of σOS's own making. Everything here is input from outside (procd, binfs, the
//! machine's operator): a malformed value is one line of error, never a panic.
//!
//! ```text
//! contract   PID PROG true|false ARGS and SIGMACONFIG/SIGMAPRINCIPAL → Contract
//! config     trampoline.toml beside the binary, or /etc/sigma-supervise/ → Config
//! program    PROG read by the trampoline's own pid (binfs serves no other) → Program:
//!            a binary (program cache or sealed memfd), a script, the interpreter
//! ```
//!
//! The supervisor's trampoline mode turns the three into its ordinary run (the jail, the
//! profile, the relay to spproxyd); this crate knows nothing of the run.
#![forbid(unsafe_code)]

pub mod config;
pub mod contract;
pub mod program;
