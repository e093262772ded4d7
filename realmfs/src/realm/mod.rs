//! A realm's libraries, served to the target at `--lib-prefix` (default `/sigma/lib`).
//!
//! The path of one call under the prefix: handler → policy rule (serve, prefix = the realm's lib
//! dir) → `RealmResolver::lookup` on the receive loop (never blocks) →
//! * the prefix itself: the *superlib*, a host directory of empty placeholders, one per top-level
//!   entry of the bucket index (packages, modules, `*.dist-info`, `*.libs`). Listing or stat'ing
//!   the prefix shows everything the realm could import and fetches nothing.
//! * a top-level entry the index does not know: ENOENT at once.
//! * an entry whose package is installed in the realm: served from the realm lib dir inline.
//! * an entry whose package this run is downloading: its skeleton (every directory and file
//!   name) is in the lib dir as soon as the download starts ([`fetcher::Placement`]); a
//!   directory, or a file the unpacker has verified, is served from the lib dir inline, so an
//!   import runs while the rest of its package is still arriving. A package a fill process
//!   streams into a memory tree instead ([`crate::memory`]: a tmpfs, its skeleton made there
//!   in a few ms where the lib dir's disk may take hundreds) is served from there the same
//!   way ([`crate::serve::Lookup::At`], an fd from it recognised by its mount id) until it is
//!   persisted into the store and installed.
//! * otherwise [`crate::serve::Lookup::Fetch`]: a worker of the supervisor's calls
//!   [`crate::serve::Resolver::fetch`], which starts `RealmCache::ensure_path` on the run's
//!   tokio runtime (single flight across tasks and
//!   processes is the fetcher's) and waits until the file it needs is verified or the package
//!   installed, then the same serve function answers the call.
//!
//! Failures (store down, credentials, missing bucket or object, integrity) fail the call with
//! ENOENT (not there) or EIO (everything else) within the fetcher's bounded time, print one line
//! per distinct cause, and are remembered for [`FAIL_TTL`] so a package that cannot be fetched
//! costs one bounded wait, not one per call.
//!
//! The files, data flowing down: [`opts`](RealmOpts) and [`plan`](RealmPlan) (before the fork:
//! kernel-served when complete, `superlib`, `python`), `backend` (the lazy backend's choice),
//! `open` (after the fork: the runtime, the cache, the prefetch), `resolver` and `streams` (the
//! notification path), `served` (the `--stats` resolvers of the others), `fetching` (errnos and
//! reports, shared by all).
#![forbid(unsafe_code)]

mod backend;
mod fetching;
mod open;
mod opts;
mod plan;
mod python;
mod resolver;
mod served;
mod streams;
mod superlib;

pub use fetching::{errno_for, FAIL_TTL};
pub use opts::{FillProcess, Lazy, RealmOpts};
pub use plan::RealmPlan;
pub use python::{cache_tag_of, imports_of, python_of};
pub use resolver::RealmResolver;
pub use served::{FuseServed, KernelServed, LazyServed, LazyView};
pub use superlib::build_superlib;
