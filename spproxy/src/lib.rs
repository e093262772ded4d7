//! σOS's spproxy wire protocol in plain Rust: protobuf messages, framing, the RPC
//! envelope, a blocking pipelined [`Client`], and an embedded realm [`server`].
#![deny(unsafe_code)]

pub mod api;
pub mod consts;
pub mod error;
pub mod frame;
pub mod procenv;
pub mod proto;
pub mod rpc;

pub use error::Error;
pub use proto::ProcEnvProto;
