//! The server's one way to take a mutex: a lock poisoned by a panicking thread is taken all
//! the same.

use std::sync::{Mutex, MutexGuard};

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
