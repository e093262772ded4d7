//! What the handlers share with the event loop and the serve workers: the listener to answer
//! on, the policy to ask, the resolver of served paths, the workers for slow serves. The loop
//! builds it ([`Context::new`]) and hands it down; nothing here knows the loop.
#![forbid(unsafe_code)]

use crate::policy::Policy;
use crate::readonly::Hints;
use crate::serve::{Deferred, Resolver};
use notify::Listener;
use std::collections::HashSet;
use std::sync::Mutex;

pub struct Context {
    pub listener: Listener,
    pub policy: Policy,
    pub resolver: Box<dyn Resolver>,
    pub deferred: Deferred,
    /// Whether to time calls and keep paths (only with --trace or --stats).
    pub timing: bool,
    /// Whether path calls need their paths read (some path rule exists, or --trace).
    pub read_paths: bool,
    /// Read-only hints (with --trace or --stats in the jail): writes the kernel will refuse
    /// because the jail shows their directory read-only are named.
    pub hints: Option<Hints>,
    /// Abstract socket names the proc bound (without a jail, the only ones it may connect to).
    abstract_names: Mutex<HashSet<Vec<u8>>>,
}

/// Most abstract names remembered; past it, new binds still work but are not connectable.
const MAX_ABSTRACT_NAMES: usize = 4096;

impl Context {
    pub fn new(
        listener: Listener,
        policy: Policy,
        resolver: Box<dyn Resolver>,
        timing: bool,
        read_paths: bool,
        hints: Option<Hints>,
    ) -> Self {
        Context {
            listener,
            policy,
            resolver,
            deferred: Deferred::default(),
            timing,
            read_paths,
            hints,
            abstract_names: Default::default(),
        }
    }

    pub fn jailed(&self) -> bool {
        self.policy.jailed()
    }

    pub fn bound_abstract(&self, name: Vec<u8>) {
        let mut names = self
            .abstract_names
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if names.len() < MAX_ABSTRACT_NAMES {
            names.insert(name);
        }
    }

    pub fn is_bound_abstract(&self, name: &[u8]) -> bool {
        let names = self
            .abstract_names
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        names.contains(name)
    }
}
