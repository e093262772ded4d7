//! σOS's spproxy wire protocol in plain Rust: protobuf messages, framing, the RPC
//! envelope, a blocking pipelined [`Client`], and an embedded realm [`server`].
#![deny(unsafe_code)]

pub mod api;
mod client;
pub mod consts;
pub mod dialproxy;
pub mod dirent;
pub mod error;
mod fdenv;
pub mod frame;
pub mod procenv;
pub mod proto;
pub mod relay;
pub mod rpc;
pub mod server;
pub mod store;

pub use client::{
    Client, Qid, Stat, WatchEvent, DEFAULT_SOCKET, ENV_SPPROXY_FD, ENV_SPPROXY_SOCKET,
};
pub use error::Error;
pub use proto::ProcEnvProto;
