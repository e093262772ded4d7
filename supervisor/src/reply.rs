//! What a handler answers ([`Reply`]) and the single place an outcome becomes the kernel's
//! answer ([`answer`]). A leaf: the event loop, the handlers and the workers they hand calls to
//! all answer through it, and it imports none of them.
#![forbid(unsafe_code)]

use nix::errno::Errno;
use notify::{Listener, Response};

/// What a handler did.
pub enum Reply {
    /// Answer the notification with this.
    Respond(Response),
    /// Already answered (NOTIF_ADDFD with SEND), or handed to a worker that will answer.
    Answered,
}

/// The single place an outcome becomes the kernel's answer. A target that went away meanwhile
/// (`Gone`) is normal. Whether the answer reached the target (the notification was still live).
pub fn answer(listener: &Listener, id: u64, result: Result<Reply, Errno>) -> bool {
    let resp = match result {
        Ok(Reply::Answered) => return true,
        Ok(Reply::Respond(r)) => r,
        Err(e) => Response::Errno(e as i32),
    };
    match listener.respond(id, resp) {
        Ok(()) => true,
        Err(notify::NotifyError::Gone { .. }) => false,
        Err(e) => {
            tracing::warn!("answering notification {id}: {e}");
            false
        }
    }
}

fn errno_of(e: notify::NotifyError) -> Errno {
    match e {
        notify::NotifyError::Ioctl { source, .. } => source,
        notify::NotifyError::Gone { .. } => Errno::ENOENT,
        _ => Errno::EIO,
    }
}

/// Map a notify error from an fd injection to the errno the call fails with.
pub fn inject_errno(e: notify::NotifyError) -> Errno {
    errno_of(e)
}
