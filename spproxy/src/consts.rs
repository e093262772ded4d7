//! σOS constants (sigmap/const.go, sigmap/types.go, serr/serr.go, proc/status.go).

// Tmode (u32)
pub const OREAD: u32 = 0;
pub const OWRITE: u32 = 0x01;
pub const ORDWR: u32 = 0x02;
pub const OEXEC: u32 = 0x03;
pub const OEXCL: u32 = 0x04;
pub const OTRUNC: u32 = 0x10;
pub const OCEXEC: u32 = 0x20;
pub const ORCLOSE: u32 = 0x40;
pub const OAPPEND: u32 = 0x80;

// Tperm (u32)
pub const DMDIR: u32 = 0x8000_0000;
pub const DMAPPEND: u32 = 0x4000_0000;
pub const DMEXCL: u32 = 0x2000_0000;
pub const DMMOUNT: u32 = 0x1000_0000;
pub const DMAUTH: u32 = 0x0800_0000;
pub const DMTMP: u32 = 0x0400_0000;
pub const DMSYMLINK: u32 = 0x0200_0000;
pub const DMLINK: u32 = 0x0100_0000;
pub const DMDEVICE: u32 = 0x0080_0000;
pub const DMREPL: u32 = 0x0040_0000;
pub const DMNAMEDPIPE: u32 = 0x0020_0000;
pub const DMSOCKET: u32 = 0x0010_0000;
pub const DMSETUID: u32 = 0x0008_0000;
pub const DMSETGID: u32 = 0x0004_0000;
pub const DMSETVTX: u32 = 0x0001_0000;
pub const DMREAD: u32 = 4;
pub const DMWRITE: u32 = 2;
pub const DMEXEC: u32 = 1;

// Qtype = perm >> 24
pub const QTDIR: u32 = 0x80;
pub const QTAPPEND: u32 = 0x40;
pub const QTEXCL: u32 = 0x20;
pub const QTMOUNT: u32 = 0x10;
pub const QTAUTH: u32 = 0x08;
pub const QTTMP: u32 = 0x04;
pub const QTSYMLINK: u32 = 0x02;
pub const QTFILE: u32 = 0;

// All-ones sentinels
pub const NO_OFFSET: u64 = u64::MAX;
pub const NO_LEASE_ID: u64 = u64::MAX;
pub const NO_CLNT_ID: u64 = u64::MAX;
pub const NO_FID: u32 = u32::MAX;
/// The `fd` a failing Create/Open reply carries: `uint32(-1)`.
pub const NO_FD: u32 = u32::MAX;

// proc.Tstatus, widened to u32 on the wire
pub const STATUS_OK: u32 = 1;
pub const STATUS_EVICTED: u32 = 2;
pub const STATUS_ERR: u32 = 3;
pub const STATUS_FATAL: u32 = 4;

// Twait
pub const O_NOW: bool = false;
pub const O_WAIT: bool = true;

/// Prefix of every spproxy method name.
pub const SERVICE: &str = "SPProxySrvAPI";

// serr codes
pub const ECODE_NOERROR: u32 = 0;
pub const ECODE_BADATTACH: u32 = 1;
pub const ECODE_BADOFFSET: u32 = 2;
pub const ECODE_BADCOUNT: u32 = 3;
pub const ECODE_BOTCH: u32 = 4;
pub const ECODE_CREATENONDIR: u32 = 5;
pub const ECODE_DUPFID: u32 = 6;
pub const ECODE_DUPTAG: u32 = 7;
pub const ECODE_ISDIR: u32 = 8;
pub const ECODE_NOCREATE: u32 = 9;
pub const ECODE_NOMEM: u32 = 10;
pub const ECODE_NOREMOVE: u32 = 11;
pub const ECODE_NOSTAT: u32 = 12;
pub const ECODE_NOTFOUND: u32 = 13;
pub const ECODE_NOWRITE: u32 = 14;
pub const ECODE_NOWSTAT: u32 = 15;
pub const ECODE_PERM: u32 = 16;
pub const ECODE_UNKNOWNFID: u32 = 17;
pub const ECODE_BADDIR: u32 = 18;
pub const ECODE_WALKNODIR: u32 = 19;
pub const ECODE_UNREACHABLE: u32 = 20;
pub const ECODE_NOTSUPPORTED: u32 = 21;
pub const ECODE_INVAL: u32 = 22;
pub const ECODE_UNKNOWNMSG: u32 = 23;
pub const ECODE_NOTDIR: u32 = 24;
pub const ECODE_NOTFILE: u32 = 25;
pub const ECODE_NOTSYMLINK: u32 = 26;
pub const ECODE_NOTEMPTY: u32 = 27;
pub const ECODE_VERSION: u32 = 28;
pub const ECODE_STALE: u32 = 29;
pub const ECODE_EXISTS: u32 = 30;
pub const ECODE_CLOSED: u32 = 31;
pub const ECODE_BADFCALL: u32 = 32;
pub const ECODE_IO: u32 = 33;
pub const ECODE_RETRY: u32 = 34;
/// Wraps a non-σOS (Go) error.
pub const ECODE_ERROR: u32 = 35;

/// Names of the serr codes, indexed by code.
pub const ECODE_NAMES: [&str; 36] = [
    "NoError",
    "Badattach",
    "Badoffset",
    "Badcount",
    "Botch",
    "Createnondir",
    "Dupfid",
    "Duptag",
    "Isdir",
    "Nocreate",
    "Nomem",
    "Noremove",
    "Nostat",
    "Notfound",
    "Nowrite",
    "Nowstat",
    "Perm",
    "Unknownfid",
    "Baddir",
    "Walknodir",
    "Unreachable",
    "NotSupported",
    "Inval",
    "UnknownMsg",
    "NotDir",
    "NotFile",
    "NotSymlink",
    "NotEmpty",
    "Version",
    "Stale",
    "Exists",
    "Closed",
    "BadFcall",
    "IO",
    "Retry",
    "Error",
];

/// The serr name of `code`, `"Unknown"` for codes outside the table.
pub fn ecode_name(code: u32) -> &'static str {
    ECODE_NAMES.get(code as usize).copied().unwrap_or("Unknown")
}

/// σOS's proc status name (proc/status.go), `"unknown"` for others.
pub fn status_name(status: u32) -> &'static str {
    match status {
        STATUS_OK => "OK",
        STATUS_EVICTED => "EVICTED",
        STATUS_ERR => "ERR",
        STATUS_FATAL => "FATAL",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_line_up_with_codes() {
        assert_eq!(ecode_name(ECODE_NOTFOUND), "Notfound");
        assert_eq!(ecode_name(ECODE_PERM), "Perm");
        assert_eq!(ecode_name(ECODE_EXISTS), "Exists");
        assert_eq!(ecode_name(ECODE_ERROR), "Error");
        assert_eq!(ecode_name(36), "Unknown");
    }
}
