//! `Stat` / `Qid` result types and the module's constants.

use pyo3::prelude::*;

use spproxy::consts as c;

/// A σOS qid: the object's type bits, version and unique path number.
#[pyclass(frozen, eq, get_all, module = "pysigma._pysigma")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Qid {
    #[pyo3(name = "type")]
    pub(crate) type_: u32,
    pub(crate) version: u32,
    pub(crate) path: u64,
}

#[pymethods]
impl Qid {
    fn __repr__(&self) -> String {
        format!(
            "Qid(type={:#x}, version={}, path={})",
            self.type_, self.version, self.path
        )
    }

    fn __hash__(&self) -> u64 {
        self.path ^ (u64::from(self.version) << 32) ^ u64::from(self.type_)
    }
}

/// What `stat(path)` returns: the fields of σOS's TstatProto.
#[pyclass(frozen, eq, get_all, module = "pysigma._pysigma")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    #[pyo3(name = "type")]
    pub(crate) type_: u32,
    pub(crate) dev: u32,
    pub(crate) qid: Qid,
    pub(crate) mode: u32,
    pub(crate) atime: u32,
    pub(crate) mtime: u32,
    pub(crate) length: u64,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) gid: String,
    pub(crate) muid: String,
}

impl From<spproxy::Stat> for Stat {
    fn from(s: spproxy::Stat) -> Self {
        Stat {
            type_: s.type_,
            dev: s.dev,
            qid: Qid {
                type_: s.qid.type_,
                version: s.qid.version,
                path: s.qid.path,
            },
            mode: s.mode,
            atime: s.atime,
            mtime: s.mtime,
            length: s.length,
            name: s.name,
            uid: s.uid,
            gid: s.gid,
            muid: s.muid,
        }
    }
}

#[pymethods]
impl Stat {
    /// True when the object is a directory (DMDIR in the mode, or QTDIR in the qid).
    #[getter]
    fn is_dir(&self) -> bool {
        self.mode & c::DMDIR != 0 || self.qid.type_ & c::QTDIR != 0
    }

    /// True for a plain file: not a directory, symlink, pipe or device.
    #[getter]
    fn is_file(&self) -> bool {
        const SPECIAL: u32 = c::DMDIR | c::DMSYMLINK | c::DMNAMEDPIPE | c::DMDEVICE | c::DMSOCKET;
        self.mode & SPECIAL == 0 && self.qid.type_ & (c::QTDIR | c::QTSYMLINK) == 0
    }

    /// The permission bits (the low nine bits of the mode).
    #[getter]
    fn perm(&self) -> u32 {
        self.mode & 0o777
    }

    fn __repr__(&self) -> String {
        format!(
            "Stat(name={:?}, mode={:#o}, length={}, mtime={}, qid={})",
            self.name,
            self.mode,
            self.length,
            self.mtime,
            self.qid.__repr__()
        )
    }
}

/// Adds the σOS constants (open modes, permission bits, sentinels, statuses, error codes).
pub(crate) fn add_constants(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let u32s: &[(&str, u32)] = &[
        ("OREAD", c::OREAD),
        ("OWRITE", c::OWRITE),
        ("ORDWR", c::ORDWR),
        ("OEXEC", c::OEXEC),
        ("OEXCL", c::OEXCL),
        ("OTRUNC", c::OTRUNC),
        ("OCEXEC", c::OCEXEC),
        ("ORCLOSE", c::ORCLOSE),
        ("OAPPEND", c::OAPPEND),
        ("DMDIR", c::DMDIR),
        ("DMAPPEND", c::DMAPPEND),
        ("DMEXCL", c::DMEXCL),
        ("DMMOUNT", c::DMMOUNT),
        ("DMTMP", c::DMTMP),
        ("DMSYMLINK", c::DMSYMLINK),
        ("DMLINK", c::DMLINK),
        ("DMDEVICE", c::DMDEVICE),
        ("DMNAMEDPIPE", c::DMNAMEDPIPE),
        ("DMSOCKET", c::DMSOCKET),
        ("DMREAD", c::DMREAD),
        ("DMWRITE", c::DMWRITE),
        ("DMEXEC", c::DMEXEC),
        ("QTDIR", c::QTDIR),
        ("QTFILE", c::QTFILE),
        ("QTSYMLINK", c::QTSYMLINK),
        ("STATUS_OK", c::STATUS_OK),
        ("STATUS_EVICTED", c::STATUS_EVICTED),
        ("STATUS_ERR", c::STATUS_ERR),
        ("STATUS_FATAL", c::STATUS_FATAL),
        ("NO_FID", c::NO_FID),
    ];
    for (name, v) in u32s {
        m.add(*name, *v)?;
    }
    m.add("NO_OFFSET", c::NO_OFFSET)?;
    m.add("NO_LEASE_ID", c::NO_LEASE_ID)?;
    m.add("NO_CLNT_ID", c::NO_CLNT_ID)?;
    // Every serr code as ECODE_<NAME>, e.g. ECODE_NOTFOUND = 13.
    for (code, name) in c::ECODE_NAMES.iter().enumerate() {
        m.add(format!("ECODE_{}", name.to_uppercase()), code as u32)?;
    }
    Ok(())
}
