//! What the policy is told of the calls the handlers serve, so that it shapes the filter from a
//! description ([`Handled`]) without knowing the handlers: each path call's name, how it writes
//! ([`Writes`], also what the read-only hint asks), whether its handler checks its registers
//! first; and the signalling calls the supervisor can confine.
#![forbid(unsafe_code)]

/// What a path call writes, judged from its registers (and, for openat2, its `open_how`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// Reads, queries, exec, chdir: nothing is written.
    No,
    /// open-style flags in argument `flags`: a write when [`open_writes`] says so.
    Open { flags: usize },
    /// openat2: the flags are in the `open_how` that argument 2 points to.
    OpenHow,
    /// creat: `O_CREAT | O_WRONLY | O_TRUNC`.
    Creat,
    /// Makes a new entry (mkdir, mknod, symlink, link): an existing one is EEXIST instead.
    Creates,
    /// Removes or renames an entry (unlink, rmdir, rename): its directory is written.
    Entry,
    /// Changes an existing file's mode, owner, times or size.
    Modifies,
}

/// The open flags that make an open a write: write access, creating, truncating. Used both
/// by the filter (a masked comparison per bit, so read-only opens are never notified for the
/// hint) and by the handler. `O_TMPFILE` needs write access, so it is covered.
pub const OPEN_WRITE_BITS: [u64; 4] = [
    libc::O_WRONLY as u64,
    libc::O_RDWR as u64,
    libc::O_CREAT as u64,
    libc::O_TRUNC as u64,
];

impl Writes {
    /// Whether a call with these registers may write (openat2: its flags are in memory).
    pub fn may_write(self, args: &[u64; 6]) -> bool {
        match self {
            Writes::No => false,
            Writes::Open { flags } => args.get(flags).is_some_and(|&f| open_writes(f)),
            _ => true,
        }
    }
}

/// Whether open flags ask to write (see [`OPEN_WRITE_BITS`]).
pub fn open_writes(flags: u64) -> bool {
    OPEN_WRITE_BITS.iter().any(|b| flags & b != 0)
}

/// One path call as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct PathCall {
    pub name: &'static str,
    pub writes: Writes,
    /// Its handler refuses some register values before any path is read (mknod: FIFOs and
    /// files only): not a path decision, so the call stays notified when paths are elided.
    pub checked: bool,
}

/// The calls the handlers serve, described (see [`crate::handlers::handled`]).
#[derive(Debug, Clone, Default)]
pub struct Handled {
    pub paths: Vec<PathCall>,
    /// The signalling calls the supervisor confines to the proc's tree without a jail.
    pub signals: Vec<&'static str>,
}

impl Handled {
    /// How path call `name` writes ([`Writes::No`] for a call no handler serves).
    pub fn writes(&self, name: &str) -> Writes {
        self.paths
            .iter()
            .find(|c| c.name == name)
            .map_or(Writes::No, |c| c.writes)
    }

    /// Whether path call `name`'s handler checks its registers.
    pub fn checked(&self, name: &str) -> bool {
        self.paths.iter().any(|c| c.name == name && c.checked)
    }
}
