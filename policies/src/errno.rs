//! Errno names as written in profiles (`"EPERM"`) and their numbers.
use nix::errno::Errno;

/// Highest value a seccomp `SECCOMP_RET_ERRNO` can carry (the data field is 16 bits, but the
/// kernel treats return values above 4095 as non-errors).
pub const MAX_ERRNO: i32 = 4095;

/// Aliases that are constants, not distinct variants, in `nix::errno::Errno`.
const ALIASES: &[(&str, Errno)] = &[
    ("EWOULDBLOCK", Errno::EAGAIN),
    ("EDEADLOCK", Errno::EDEADLK),
    ("ENOTSUP", Errno::EOPNOTSUPP),
];

/// Resolve an errno name such as `"EACCES"` (case-sensitive, as in C).
pub fn from_name(name: &str) -> Option<i32> {
    if let Some((_, e)) = ALIASES.iter().find(|(n, _)| *n == name) {
        return Some(*e as i32);
    }
    (1..=MAX_ERRNO).find(|&n| {
        let e = Errno::from_raw(n);
        e != Errno::UnknownErrno && format!("{e:?}") == name
    })
}

/// The symbolic name of an errno value, or its number when it has none.
pub fn name(errno: i32) -> String {
    let e = Errno::from_raw(errno);
    if e == Errno::UnknownErrno {
        errno.to_string()
    } else {
        format!("{e:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_libc_values() {
        assert_eq!(from_name("EPERM"), Some(libc::EPERM));
        assert_eq!(from_name("EACCES"), Some(libc::EACCES));
        assert_eq!(from_name("ENOSYS"), Some(libc::ENOSYS));
        assert_eq!(from_name("EROFS"), Some(libc::EROFS));
        assert_eq!(from_name("ENOTSUP"), Some(libc::ENOTSUP));
        assert_eq!(from_name("EWOULDBLOCK"), Some(libc::EWOULDBLOCK));
        assert_eq!(from_name("EPREM"), None);
        assert_eq!(from_name("eperm"), None);
        assert_eq!(from_name("UnknownErrno"), None);
        assert_eq!(name(libc::ENOSYS), "ENOSYS");
        assert_eq!(name(4000), "4000");
    }
}
