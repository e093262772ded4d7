//! Realm path resolution: which server a σOS path names, checked lexically before any
//! file system call. `name/ux/~local/REL` is the scratch directory, `name/s3/~local/B/K`
//! bucket B's key K. NUL, absolute paths and `..` anywhere are refused with σOS's error;
//! symbolic links are refused by the stores themselves (openat2 `RESOLVE_NO_SYMLINKS`).

use crate::consts::{ECODE_INVAL, ECODE_NOTFOUND, ECODE_NOTSUPPORTED, ECODE_PERM};
use crate::proto::Rerror;

pub use super::reply::last;
use super::reply::rerr;

/// Longest path the server resolves (Linux's PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// What a realm path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// A path relative to the scratch root (`.` for the root itself), free of `..`.
    Ux(&'a str),
    /// A bucket and a key (empty for the bucket itself).
    S3 { bucket: &'a str, key: &'a str },
}

/// Resolves `path` lexically. Never touches the file system.
pub fn parse(path: &str) -> Result<Target<'_>, Rerror> {
    if path.len() > MAX_PATH {
        return Err(rerr(ECODE_INVAL, "", "path too long"));
    }
    if path.contains('\0') {
        return Err(rerr(ECODE_INVAL, "", "path contains a NUL byte"));
    }
    if path.starts_with('/') {
        return Err(rerr(
            ECODE_INVAL,
            path,
            "absolute path: realm paths start with name/",
        ));
    }
    let notfound = || rerr(ECODE_NOTFOUND, path, "no such server in the embedded realm");
    let rest = path.strip_prefix("name/").ok_or_else(notfound)?;
    let (srv, rest) = rest.split_once('/').unwrap_or((rest, ""));
    let (loc, rest) = rest.split_once('/').unwrap_or((rest, ""));
    if loc != "~local" && loc != "~any" {
        return Err(notfound());
    }
    if rest.split('/').any(|c| c == "..") {
        return Err(rerr(ECODE_PERM, path, "path leaves the realm"));
    }
    let rest = rest.trim_matches('/');
    match srv {
        "ux" => Ok(Target::Ux(if rest.is_empty() { "." } else { rest })),
        "s3" => {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() || bucket == "." {
                return Err(rerr(ECODE_NOTSUPPORTED, path, "listing buckets"));
            }
            Ok(Target::S3 { bucket, key })
        }
        _ => Err(notfound()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(p: &str) -> u32 {
        parse(p).unwrap_err().err_code
    }

    #[test]
    fn servers_and_refusals() {
        assert_eq!(parse("name/ux/~local/a/b"), Ok(Target::Ux("a/b")));
        assert_eq!(parse("name/ux/~local"), Ok(Target::Ux(".")));
        assert_eq!(parse("name/ux/~any/a/"), Ok(Target::Ux("a")));
        assert_eq!(
            parse("name/s3/~local/b/k/x"),
            Ok(Target::S3 {
                bucket: "b",
                key: "k/x"
            })
        );
        assert_eq!(code("name/ux/~local/a/../../x"), ECODE_PERM);
        assert_eq!(code("name/ux/~local/a/.."), ECODE_PERM);
        assert_eq!(code("name/s3/~local/b/../k"), ECODE_PERM);
        assert_eq!(code("name/ux/~local/a\0b"), ECODE_INVAL);
        assert_eq!(code("/name/ux/~local/a"), ECODE_INVAL);
        assert_eq!(code(&"a".repeat(MAX_PATH + 1)), ECODE_INVAL);
        assert_eq!(code("name/9p/~local/a"), ECODE_NOTFOUND);
        assert_eq!(code("name/ux/host/a"), ECODE_NOTFOUND);
        assert_eq!(code("name/s3/~local/"), ECODE_NOTSUPPORTED);
        assert_eq!(last("name/ux/~local/a/b/"), "b");
    }
}
