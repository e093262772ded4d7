//! How a realm's libraries are shown to a proc.
//!
//! The supervisor calls [`show()`] before it forks (`show.rs`: the plan is made from its options
//! and the way the realm can be shown is picked), adds the mounts or the served path to the
//! proc's jail, and after the fork turns the showing into a [`Resolver`] (the `--stats` line,
//! and for the notification path the answers). One of four ways, the first that applies:
//!
//! ```text
//! RealmPlan::new ──▶ complete in the lib dir? ── yes ─▶ kernel: the lib dir bound read-only
//!        │                                               at the prefix (no notification)
//!        ├──▶ every package in the store's trees? ─ yes ─▶ kernel: a placeholder listing,
//!        │                                               each entry's tree bound over it
//!        ├──▶ lazy backend (an index snapshot from an earlier run)
//!        │      root:  ext4 image of placeholders ─▶ fanotify pre-content group, filled on
//!        │             first touch (lazy/; made off the run's path by a prepare process)
//!        │      user:  the realm's FUSE server ─▶ fusermount3 mount, shared by every run
//!        │             (fuse/; confined once mounted, confine.rs)
//!        │      both:  installed packages bound from the lib dir over their placeholders
//!        └──▶ notification: the lib dir as a served dir; RealmResolver answers a miss by
//!               fetching its package (streamed into the lib dir, released file by file)
//!
//! downloads of a jailed run ──▶ fill processes (fill.rs): the binary again, named
//!                               `sigma-supervise-fill`, finishing a package after the run
//! ```
//!
//! Work that outlives a run runs in this binary again under a name of its own (`argv[0]`): the
//! supervisor's `main` dispatches those names to [`helper_main`] before it parses anything.
//! Nothing here knows the supervisor: what it needs from above (which helpers are the
//! supervisor's) is a parameter ([`RealmPlan::on_helper`]).
#![deny(unsafe_code)]
// Its docs name private constants and helpers where they say how long or by whom: pages of
// `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod confine;
pub mod fill;
pub mod fuse;
pub mod host;
pub mod lazy;
pub mod memory;
pub mod realm;
pub mod serve;
pub mod show;
pub mod snapshot;
pub mod sys;

pub use realm::{RealmOpts, RealmPlan};
pub use serve::{LocalDirs, Lookup, Resolver, Served};
pub use show::{show, Showing};

/// If this process was started as one of the realm's helper processes (by its `argv[0]`: a fill
/// process, the lazy image's maker or holder, the FUSE server or its unmounter), run it; it
/// never returns. Otherwise return at once. Call first thing in `main`.
pub fn helper_main() {
    let Some(arg0) = std::env::args_os().next() else {
        return;
    };
    match arg0.to_str() {
        Some(lazy::HOLDER_ARG0) => lazy::hold(),
        Some(fuse::FUSE_ARG0) => fuse::main(),
        Some(fuse::UNMOUNT_ARG0) => fuse::unmounter_main(),
        Some(lazy::PREP_ARG0) => lazy::prepare_main(),
        Some(fill::FILL_ARG0) => fill::main(),
        _ => {}
    }
}
