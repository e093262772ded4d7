//! What an install that streams into the lib dir tells as it goes: each verified file (a
//! [`FileHook`]) and the package's skeleton placed and its install ended (a [`Placement`]).

use std::path::Path;

use crate::error::FetchError;
use crate::index::Package;

/// Called on one of the unpacker's threads (several at once) with each file's sha256 and
/// staged path as soon as the file is verified against the index (before the rest of its
/// package): a reader waiting for that file can have it now. The staged file is removed after
/// the install; copy, do not keep. With a [`Placement`] the path is the file's place in the
/// lib dir, where it stays.
pub type FileHook = dyn Fn(&str, &Path) + Send + Sync;

/// Told about installs that stream into the lib dir ([`RealmCache::set_placement`](super::RealmCache::set_placement)). Between
/// `placed` and `ended`, the package's directories and file names are all in the lib dir (a
/// listing is complete), but a file holds its verified bytes only once the file hook has
/// announced its lib path: until then it is an empty placeholder that must not be served.
/// Called on the installer's threads; must not block.
pub trait Placement: Send + Sync {
    /// `pkg`'s skeleton is in the lib dir.
    fn placed(&self, pkg: &Package);
    /// An install of `pkg` ended (whether or not it placed anything first): with `Ok` the
    /// package is installed (marker written); with `Err` nothing placed is left.
    fn ended(&self, pkg: &Package, result: std::result::Result<(), &FetchError>);
    /// Every file of `pkg`'s import trace ([`Package::traced`]) is verified: what the install
    /// writes from here on, an import does not read at its start. Not called for a package
    /// published without a trace.
    fn past_trace(&self, _pkg: &Package) {}
    /// Every file of `pkg` is verified in its memory tree ([`RealmCache::fill_in_memory`](super::RealmCache::fill_in_memory)):
    /// returns when it may be persisted. The one exception to "must not block": called on a
    /// blocking thread of its own, so that a fill process can wait (within a bound) for the
    /// run it serves to end, and the copy into the store takes nothing from that run.
    fn before_persist(&self, _pkg: &Package) {}
}
