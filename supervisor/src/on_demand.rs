//! Work the supervisor starts on the first sign of need (the notification thread, the embedded
//! σOS server's connection, trampoline mode's relay). A leaf: whoever offers such work
//! implements [`OnDemand`]; the event loop watches their fds.
#![forbid(unsafe_code)]

/// Work the supervisor starts on the first sign of need: once its fd is readable (a request
/// waits, or the peer hung up), [`OnDemand::readable`] starts it or finds it unneeded (`None`),
/// or finds nothing there yet (`Some`: go on watching).
pub trait OnDemand: std::os::fd::AsFd {
    fn readable(self: Box<Self>) -> Option<Box<dyn OnDemand>>;
}
