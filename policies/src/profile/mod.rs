//! One profile: its text parsed and validated into a [`Profile`], which compiles into the
//! child's filter.
//!
//! ```text
//! TOML text ──raw──▶ Raw* (spans) ──validate──▶ Profile ──compile──▶ notify::FilterSpec
//!                                                  │
//!                                                  └─ model: decide, notification_kind, ...
//! ```
//!
//! [`raw`] and [`model`] are leaves; [`validate`] builds a [`Profile`] from the raw form (and
//! asks [`compile`] whether a condition set has a complement); [`compile`] reads the model.
//! This file only names the parts.

mod compile;
mod model;
mod raw;
mod validate;

#[cfg(test)]
pub(crate) use compile::{complement, complement_all};
pub use model::{
    parse_serve_arg, DefaultAction, Need, NotificationKind, Origin, Profile, SyscallAction,
    SyscallEntry,
};
