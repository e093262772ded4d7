//! Protobuf messages generated from `proto/*.proto` (prost + protox, see `build.rs`),
//! re-exported flat so `use spproxy::proto::*` brings in only message types.

/// The generated modules, one per proto package.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/rpc.rs"));
    }
    pub mod sigmap {
        include!(concat!(env!("OUT_DIR"), "/sigmap.rs"));
    }
    pub mod proc {
        include!(concat!(env!("OUT_DIR"), "/proc.rs"));
    }
    pub mod spproxy {
        include!(concat!(env!("OUT_DIR"), "/spproxy.rs"));
    }
    pub mod protsrv {
        include!(concat!(env!("OUT_DIR"), "/protsrv.rs"));
    }
}

pub use pb::proc::ProcEnvProto;
pub use pb::protsrv::{WatchEvent, WatchEventList, WatchEventType};
pub use pb::rpc::{Blob, Rep, Req, SplitIoVec};
pub use pb::sigmap::{
    Rerror, SecretProto, Taddr, TendpointProto, TfenceProto, Tprincipal, TqidProto, TstatProto,
};
pub use pb::spproxy::*;
pub use prost_types::Timestamp;
