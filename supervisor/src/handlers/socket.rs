//! bind and connect on local (AF_UNIX) sockets, decided by the socket's path like any other
//! path call: a served directory cannot hold a socket (bind: EROFS, connect: EACCES), a denied
//! path is refused with its errno, anything else continues. The profile lets only AF_UNIX
//! stream/seqpacket sockets be made (`socket` by argument), so the network stays σOS's.
//!
//! TCP/UDP sockets exist only in a network namespace of the proc's own (`needs = "own-net"`):
//! their addresses continue in the jail; without one an inet address is refused.
//! Abstract names (a leading NUL) are not paths. Inside the σcontainer they belong to its
//! network namespace, so they continue. Without a jail they would reach the host's services:
//! a proc may then connect only to abstract names its own processes bound.
#![forbid(unsafe_code)]

use super::context::Context;
use super::path::CallInfo;
use crate::policy::Decide;
use crate::reply::Reply;
use crate::stats::Decision;
use nix::errno::Errno;
use notify::mem::TargetMem;
use notify::{Notification, Response};
use std::ffi::CString;
use std::sync::Arc;

/// Which socket call was notified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketCall {
    Bind,
    Connect,
}

impl SocketCall {
    pub const ALL: [(&'static str, SocketCall); 2] =
        [("bind", SocketCall::Bind), ("connect", SocketCall::Connect)];
}

/// sizeof(struct sockaddr_un).
const SOCKADDR_UN: usize = 110;
/// offsetof(struct sockaddr_un, sun_path).
const SUN_PATH: usize = 2;

/// What a sockaddr names.
#[derive(Debug, PartialEq, Eq)]
enum Addr {
    /// A filesystem path (as written, relative to the cwd unless absolute).
    Path(CString),
    /// An abstract name (without its leading NUL).
    Abstract(Vec<u8>),
    /// An autobind request (bind with only the family).
    Autobind,
    /// An AF_INET or AF_INET6 address.
    Inet,
}

/// Parse `len` bytes of a sockaddr as the kernel does for AF_UNIX; an inet address as such
/// (the kernel checks it), EAFNOSUPPORT for another family, EINVAL for a bad length.
fn parse(bytes: &[u8]) -> Result<Addr, Errno> {
    if bytes.len() < SUN_PATH {
        return Err(Errno::EINVAL);
    }
    let family = i32::from(u16::from_ne_bytes([bytes[0], bytes[1]]));
    if family == libc::AF_INET || family == libc::AF_INET6 {
        return Ok(Addr::Inet);
    }
    if family != libc::AF_UNIX {
        return Err(Errno::EAFNOSUPPORT);
    }
    let path = &bytes[SUN_PATH..];
    match path.first() {
        None => Ok(Addr::Autobind),
        Some(0) => Ok(Addr::Abstract(path[1..].to_vec())),
        Some(_) => {
            // The kernel stops at the first NUL (the path need not be terminated within len).
            let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
            CString::new(&path[..end])
                .map(Addr::Path)
                .map_err(|_| Errno::EINVAL)
        }
    }
}

/// Decide a notified bind or connect.
pub fn handle(
    sh: &Arc<Context>,
    n: &Notification,
    call: SocketCall,
    info: &mut CallInfo,
) -> Result<Reply, Errno> {
    let len = usize::try_from(n.args[2] as u32).map_err(|_| Errno::EINVAL)?;
    if !(SUN_PATH..=SOCKADDR_UN).contains(&len) {
        // Too short or too long for a local address: the kernel's own answer.
        info.decision = Some(Decision::Error(libc::EINVAL));
        return Err(Errno::EINVAL);
    }
    let mem = TargetMem {
        listener: &sh.listener,
        notif: n,
    };
    let mut buf = [0u8; SOCKADDR_UN];
    let addr = mem
        .read(n.args[1], &mut buf[..len])
        .and_then(|()| parse(&buf[..len]))
        .inspect_err(|e| info.decision = Some(Decision::Error(*e as i32)))?;
    let continue_ = Ok(Reply::Respond(Response::continue_unchecked()));
    match addr {
        // Only in the proc's own network namespace (on an AF_UNIX socket: the kernel's EINVAL).
        Addr::Inet if sh.jailed() => {
            info.decision = Some(Decision::Continue);
            continue_
        }
        Addr::Inet => {
            info.decision = Some(Decision::Deny(libc::EAFNOSUPPORT));
            Err(Errno::EAFNOSUPPORT)
        }
        Addr::Autobind => {
            info.decision = Some(Decision::Continue);
            continue_
        }
        Addr::Abstract(name) => {
            let ok = match call {
                SocketCall::Bind => {
                    sh.bound_abstract(name);
                    true
                }
                SocketCall::Connect => sh.jailed() || sh.is_bound_abstract(&name),
            };
            if ok {
                info.decision = Some(Decision::Continue);
                continue_
            } else {
                info.decision = Some(Decision::Deny(libc::ECONNREFUSED));
                Err(Errno::ECONNREFUSED)
            }
        }
        Addr::Path(raw) => {
            let decision = match info.resolve(n.pid, libc::AT_FDCWD, raw.to_bytes()) {
                Ok(abs) => {
                    let path = sh.timing.then(|| abs.to_path_buf());
                    let d = sh.policy.decide(abs);
                    info.path = path;
                    d
                }
                Err(e) => {
                    info.decision = Some(Decision::Error(e as i32));
                    return Err(e);
                }
            };
            match decision {
                Decide::Continue => {
                    info.decision = Some(Decision::Continue);
                    continue_
                }
                Decide::Deny(e) => {
                    info.decision = Some(Decision::Deny(e));
                    Err(Errno::from_raw(e))
                }
                // A served tree is read-only and hidden: no socket lives there.
                Decide::Serve { .. } => {
                    let e = match call {
                        SocketCall::Bind => Errno::EROFS,
                        SocketCall::Connect => Errno::EACCES,
                    };
                    info.decision = Some(Decision::Serve(Some(e as i32)));
                    Err(e)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(family: i32, path: &[u8]) -> Vec<u8> {
        let mut v = (family as u16).to_ne_bytes().to_vec();
        v.extend_from_slice(path);
        v
    }

    #[test]
    fn sockaddrs_parse_as_the_kernel_reads_them() {
        assert_eq!(
            parse(&addr(libc::AF_UNIX, b"/tmp/s\0junk")),
            Ok(Addr::Path(CString::new("/tmp/s").unwrap()))
        );
        // Not NUL-terminated within len: the length bounds it.
        assert_eq!(
            parse(&addr(libc::AF_UNIX, b"rel/s")),
            Ok(Addr::Path(CString::new("rel/s").unwrap()))
        );
        assert_eq!(
            parse(&addr(libc::AF_UNIX, b"\0name\0x")),
            Ok(Addr::Abstract(b"name\0x".to_vec()))
        );
        assert_eq!(parse(&addr(libc::AF_UNIX, b"")), Ok(Addr::Autobind));
        assert_eq!(parse(&addr(libc::AF_INET, &[0; 14])), Ok(Addr::Inet));
        assert_eq!(parse(&addr(libc::AF_INET6, &[0; 26])), Ok(Addr::Inet));
        assert_eq!(
            parse(&addr(libc::AF_PACKET, &[0; 18])),
            Err(Errno::EAFNOSUPPORT)
        );
        assert_eq!(parse(&[1]), Err(Errno::EINVAL));
    }
}
