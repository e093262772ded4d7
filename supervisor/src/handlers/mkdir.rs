//! mkdir, mkdirat: served trees are read-only, so an existing entry is EEXIST (what callers
//! such as `os.makedirs(exist_ok=True)` look for) and anything else EROFS.
#![forbid(unsafe_code)]

use super::refuse::refuse_write;
use super::spec::{Follow, PathArg, Spec};
use crate::calls::Writes;

pub const MKDIR: Spec = Spec {
    name: "mkdir",
    paths: &[PathArg::cwd(0, Follow::No).creates()],
    serve: refuse_write,
    check: None,
    writes: Writes::Creates,
};
pub const MKDIRAT: Spec = Spec {
    name: "mkdirat",
    paths: &[PathArg::at(0, 1, Follow::No).creates()],
    serve: refuse_write,
    check: None,
    writes: Writes::Creates,
};
