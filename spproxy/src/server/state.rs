//! The state every connection of one server shares: its config, the scratch directory, the
//! quota, the procs, the parked calls. The two stores (`ux`, `objects`) add their calls to
//! it; nothing here calls up into a connection or dispatch.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use super::config::ServerConfig;
use super::procstate;
use super::quota::Quota;
use super::waiters;

pub struct Inner {
    pub cfg: ServerConfig,
    /// The scratch directory, or why it could not be made or opened: then the calls on
    /// `name/ux` fail with that error, and a proc that never makes one runs as any other.
    pub root: Result<OwnedFd, nix::errno::Errno>,
    pub quota: Quota,
    pub procs: procstate::Registry,
    pub waiters: waiters::Waiters,
    pub evicted: AtomicBool,
    pub connections: AtomicUsize,
}
