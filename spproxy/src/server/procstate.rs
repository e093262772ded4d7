//! Proc state, one per connection: what Init named (pid, principal), the ClntId the server
//! gave it, and what it reported (Started, Exited). Two procs on one server never see each
//! other's identity.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::consts::status_name;
use crate::proto::ProcEnvProto;

use super::sync::lock;

/// What one proc reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcState {
    pub started: bool,
    pub exited: Option<(u32, String)>,
    /// `pidStr` given at Init.
    pub pid: Option<String>,
    /// The ClntId the server gave this connection at Init.
    pub clnt_id: Option<u64>,
    /// Requests served: on this connection in [`Registry::all`], on all connections in
    /// [`Registry::primary`].
    pub calls: u64,
}

impl ProcState {
    /// `started yes, exited status 1 (OK), N σOS calls`.
    pub fn summary(&self) -> String {
        let exited = match &self.exited {
            Some((s, _)) => format!("exited status {s} ({})", status_name(*s)),
            None => "never exited".to_owned(),
        };
        format!(
            "started {}, {exited}, {} σOS calls",
            if self.started { "yes" } else { "no" },
            self.calls
        )
    }
}

/// `proc exited: status 1 (OK) "msg"` (the message escaped as a Rust string literal's body).
pub fn exited_line(status: u32, msg: &str) -> String {
    format!(
        "proc exited: status {status} ({}) \"{}\"",
        status_name(status),
        msg.escape_debug()
    )
}

/// A connection's identity once Init succeeded.
#[derive(Clone)]
pub struct Identity {
    /// Owner reported in Stat replies: the principal, else the pid.
    pub uid: String,
    pub clnt_id: u64,
    pub state: Arc<Mutex<ProcState>>,
}

/// Most procs remembered for reporting; older ones are forgotten first.
const MAX_PROCS: usize = 4096;

#[derive(Default)]
pub struct Registry {
    procs: Mutex<Vec<Arc<Mutex<ProcState>>>>,
    calls: AtomicU64,
    next_clnt: AtomicU64,
    ids: RandomState,
}

impl Registry {
    pub fn count_call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Registers a proc from its ProcEnv at Init.
    pub fn init(&self, pe: &ProcEnvProto) -> Identity {
        let uid = pe
            .principal
            .as_ref()
            .map(|p| p.i_d_str.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| pe.pid_str.clone());
        let mut h = self.ids.build_hasher();
        h.write_u64(self.next_clnt.fetch_add(1, Ordering::Relaxed));
        let clnt_id = h.finish() & (u64::MAX >> 1);
        let state = Arc::new(Mutex::new(ProcState {
            pid: Some(pe.pid_str.clone()),
            clnt_id: Some(clnt_id),
            ..ProcState::default()
        }));
        let mut procs = lock(&self.procs);
        if procs.len() >= MAX_PROCS {
            let i = 1.min(procs.len() - 1);
            procs.remove(i);
        }
        procs.push(state.clone());
        Identity {
            uid,
            clnt_id,
            state,
        }
    }

    pub fn primary(&self) -> ProcState {
        let mut st = lock(&self.procs)
            .first()
            .map(|s| lock(s).clone())
            .unwrap_or_default();
        st.calls = self.calls.load(Ordering::Relaxed);
        st
    }

    pub fn all(&self) -> Vec<ProcState> {
        lock(&self.procs).iter().map(|s| lock(s).clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exited_line_escapes_the_message() {
        assert_eq!(
            exited_line(1, "Exited normally!"),
            "proc exited: status 1 (OK) \"Exited normally!\""
        );
        assert_eq!(
            exited_line(3, "bad\n\"x\""),
            "proc exited: status 3 (ERR) \"bad\\n\\\"x\\\"\""
        );
        assert_eq!(exited_line(9, ""), "proc exited: status 9 (unknown) \"\"");
    }

    #[test]
    fn summary_says_what_the_proc_reported() {
        let mut st = ProcState::default();
        assert_eq!(st.summary(), "started no, never exited, 0 σOS calls");
        st.started = true;
        st.exited = Some((1, String::new()));
        st.calls = 5;
        assert_eq!(
            st.summary(),
            "started yes, exited status 1 (OK), 5 σOS calls"
        );
    }
}
