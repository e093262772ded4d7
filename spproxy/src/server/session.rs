//! What one connection holds between its calls: its fds, its identity once Init succeeded,
//! and how many of its calls are parked. The connection owns it; dispatch and the waiter
//! thread are handed it.

use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

use super::fds::FdTable;
use super::procstate::Identity;

pub struct Session {
    pub fds: Mutex<FdTable>,
    pub ident: Mutex<Option<Identity>>,
    /// Calls parked on the waiter thread.
    pub waiting: AtomicUsize,
}

impl Session {
    pub fn new(fds: FdTable) -> Session {
        Session {
            fds: Mutex::new(fds),
            ident: Mutex::new(None),
            waiting: AtomicUsize::new(0),
        }
    }
}
