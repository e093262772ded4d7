//! The spproxy calls as (method name, request message) pairs, built exactly as the Go
//! stubs build them (proxy/sigmap/clnt/stubs.go). The client sends these; the golden
//! tests check them byte for byte against σOS's own output.

use crate::consts::NO_OFFSET;
use crate::proto::*;

pub const INIT: &str = "SPProxySrvAPI.Init";
pub const STARTED: &str = "SPProxySrvAPI.Started";
pub const EXITED: &str = "SPProxySrvAPI.Exited";
pub const WAIT_EVICT: &str = "SPProxySrvAPI.WaitEvict";
pub const CLNT_ID: &str = "SPProxySrvAPI.ClntId";
pub const STAT: &str = "SPProxySrvAPI.Stat";
pub const CREATE: &str = "SPProxySrvAPI.Create";
pub const OPEN: &str = "SPProxySrvAPI.Open";
pub const READ: &str = "SPProxySrvAPI.Read";
pub const WRITE: &str = "SPProxySrvAPI.Write";
pub const SEEK: &str = "SPProxySrvAPI.Seek";
pub const CLOSE_FD: &str = "SPProxySrvAPI.CloseFd";
pub const REMOVE: &str = "SPProxySrvAPI.Remove";
pub const RENAME: &str = "SPProxySrvAPI.Rename";
pub const GET_FILE: &str = "SPProxySrvAPI.GetFile";
pub const PUT_FILE: &str = "SPProxySrvAPI.PutFile";
pub const DIR_WATCH: &str = "SPProxySrvAPI.DirWatch";
pub const CLOSE: &str = "SPProxySrvAPI.Close";
pub const CREATE_LEASED: &str = "SPProxySrvAPI.CreateLeased";
pub const WRITE_READ: &str = "SPProxySrvAPI.WriteRead";
pub const WRITE_FENCE: &str = "SPProxySrvAPI.WriteFence";
pub const FENCE_DIR: &str = "SPProxySrvAPI.FenceDir";
pub const IS_LOCAL_MOUNT: &str = "SPProxySrvAPI.IsLocalMount";
pub const MOUNT_TREE: &str = "SPProxySrvAPI.MountTree";
pub const PATH_LAST_MOUNT: &str = "SPProxySrvAPI.PathLastMount";
pub const INVALIDATE_NAMED_ENDPOINT: &str = "SPProxySrvAPI.InvalidateNamedEndpointCacheEntryRealm";
pub const GET_NAMED_ENDPOINT: &str = "SPProxySrvAPI.GetNamedEndpointRealm";
pub const NEW_ROOT_MOUNT: &str = "SPProxySrvAPI.NewRootMount";
pub const MOUNTS: &str = "SPProxySrvAPI.Mounts";
pub const DETACH: &str = "SPProxySrvAPI.Detach";
pub const DISCONNECT: &str = "SPProxySrvAPI.Disconnect";
pub const REGISTER_EP: &str = "SPProxySrvAPI.RegisterEP";
pub const GET_DELEGATED_RPC_REPLY: &str = "SPProxySrvAPI.GetDelegatedRPCReply";
pub const GET_MULTI_DELEGATED_RPC_REPLIES: &str = "SPProxySrvAPI.GetMultiDelegatedRPCReplies";

pub fn init(pe: ProcEnvProto) -> (&'static str, SigmaInitReq) {
    (
        INIT,
        SigmaInitReq {
            proc_env_proto: Some(pe),
        },
    )
}

pub fn started() -> (&'static str, SigmaNullReq) {
    (STARTED, SigmaNullReq {})
}

pub fn exited(status: u32, msg: &str) -> (&'static str, SigmaExitedReq) {
    (
        EXITED,
        SigmaExitedReq {
            status,
            msg: msg.to_owned(),
        },
    )
}

pub fn wait_evict() -> (&'static str, SigmaNullReq) {
    (WAIT_EVICT, SigmaNullReq {})
}

pub fn clnt_id() -> (&'static str, SigmaNullReq) {
    (CLNT_ID, SigmaNullReq {})
}

fn path_req(method: &'static str, path: &str) -> (&'static str, SigmaPathReq) {
    (
        method,
        SigmaPathReq {
            path: path.to_owned(),
        },
    )
}

pub fn stat(path: &str) -> (&'static str, SigmaPathReq) {
    path_req(STAT, path)
}

pub fn remove(path: &str) -> (&'static str, SigmaPathReq) {
    path_req(REMOVE, path)
}

pub fn get_file(path: &str) -> (&'static str, SigmaPathReq) {
    path_req(GET_FILE, path)
}

pub fn create(path: &str, perm: u32, mode: u32) -> (&'static str, SigmaCreateReq) {
    (
        CREATE,
        SigmaCreateReq {
            path: path.to_owned(),
            perm,
            mode,
            ..Default::default()
        },
    )
}

pub fn open(path: &str, mode: u32, wait: bool) -> (&'static str, SigmaCreateReq) {
    (
        OPEN,
        SigmaCreateReq {
            path: path.to_owned(),
            mode,
            wait,
            ..Default::default()
        },
    )
}

/// Read at the fd's offset (`off = NoOffset`).
pub fn read(fd: u32, size: u64) -> (&'static str, SigmaReadReq) {
    pread(fd, size, NO_OFFSET)
}

/// Read at `off` without moving the fd's offset (same method as Read).
pub fn pread(fd: u32, size: u64, off: u64) -> (&'static str, SigmaReadReq) {
    (READ, SigmaReadReq { fd, size, off })
}

pub fn write(fd: u32, data: &[u8]) -> (&'static str, SigmaWriteReq) {
    (
        WRITE,
        SigmaWriteReq {
            fd,
            blob: Some(Blob {
                iov: vec![data.to_vec()],
                split_iov: vec![],
            }),
            ..Default::default()
        },
    )
}

pub fn seek(fd: u32, offset: u64) -> (&'static str, SigmaSeekReq) {
    (SEEK, SigmaSeekReq { fd, offset })
}

pub fn close_fd(fd: u32) -> (&'static str, SigmaCloseReq) {
    (CLOSE_FD, SigmaCloseReq { fd })
}

pub fn rename(src: &str, dst: &str) -> (&'static str, SigmaRenameReq) {
    (
        RENAME,
        SigmaRenameReq {
            src: src.to_owned(),
            dst: dst.to_owned(),
        },
    )
}

pub fn put_file(
    path: &str,
    perm: u32,
    mode: u32,
    data: &[u8],
    offset: u64,
    lease_id: u64,
) -> (&'static str, SigmaPutFileReq) {
    (
        PUT_FILE,
        SigmaPutFileReq {
            path: path.to_owned(),
            perm,
            mode,
            offset,
            lease_id,
            blob: Some(Blob {
                iov: vec![data.to_vec()],
                split_iov: vec![],
            }),
        },
    )
}

pub fn dir_watch(fd: u32) -> (&'static str, SigmaReadReq) {
    (
        DIR_WATCH,
        SigmaReadReq {
            fd,
            ..Default::default()
        },
    )
}
