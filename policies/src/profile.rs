//! Parsing, validation and compilation of one profile.
use crate::errno;
use crate::paths::{self, PathAction, PathDecision, PathRule};
use crate::PolicyError;
use libseccomp::ScmpSyscall;
use notify::{Action, ArgCmp, CmpOp, FilterSpec, SyscallRule};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Calls that must never be notified: the supervisor would sit in every I/O of the target (and
/// could deadlock on its own output). youki refuses the same.
const NEVER_NOTIFY: &[&str] = &[
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
    "pwritev2",
];

// ------------------------------------------------------------------------------------------------
// The file as written.
// ------------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: Spanned<String>,
    #[serde(default)]
    description: String,
    default: Spanned<RawDefault>,
    #[serde(default)]
    syscall: Vec<Spanned<RawSyscall>>,
    #[serde(default)]
    path: Vec<Spanned<RawPath>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefault {
    action: Spanned<String>,
    errno: Option<Spanned<RawErrno>>,
    log: Option<Spanned<bool>>,
    reason: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSyscall {
    name: Spanned<String>,
    action: Spanned<String>,
    errno: Option<Spanned<RawErrno>>,
    reason: Option<Spanned<String>>,
    origin: Option<Spanned<String>>,
    #[serde(default)]
    when: Vec<Spanned<RawCmp>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCmp {
    arg: u32,
    op: String,
    value: u64,
    mask: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPath {
    prefix: Spanned<String>,
    action: Spanned<String>,
    errno: Option<Spanned<RawErrno>>,
    dir: Option<Spanned<String>>,
    reason: Option<Spanned<String>>,
}

/// `errno = "EPERM"` or `errno = 1`.
enum RawErrno {
    Number(i64),
    Name(String),
}

impl<'de> Deserialize<'de> for RawErrno {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawErrno;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an errno name such as \"EPERM\" or a number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawErrno, E> {
                Ok(RawErrno::Number(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawErrno, E> {
                Ok(RawErrno::Number(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawErrno, E> {
                Ok(RawErrno::Name(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

// ------------------------------------------------------------------------------------------------
// The validated profile.
// ------------------------------------------------------------------------------------------------

/// What happens to a syscall no entry matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DefaultAction {
    Allow,
    /// Fail with `errno`. With `log`, the kernel notifies and the supervisor answers with `errno`
    /// (never continues) and logs the syscall name once.
    Errno {
        errno: i32,
        log: bool,
    },
    Kill,
}

/// What a `[[syscall]]` entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SyscallAction {
    Allow,
    /// The supervisor decides by path ([`Profile::decide`]).
    Notify,
    Errno(i32),
    Kill,
}

/// Where an entry comes from (documentation, checked by tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Origin {
    /// Table 3.1 of the σPy thesis: σOS's 73 allowed syscalls.
    Table31,
    /// Beyond Table 3.1 (with the reason in the entry).
    Addition,
}

/// One validated `[[syscall]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyscallEntry {
    pub name: String,
    /// Number on the native architecture.
    pub nr: i32,
    pub action: SyscallAction,
    /// All must hold for the entry to apply; otherwise the default applies.
    pub when: Vec<ArgCmp>,
    /// Why the entry is there: documentation of the profile's text, not in the serde form.
    #[serde(skip)]
    pub reason: String,
    pub origin: Option<Origin>,
    /// Line of the entry's `name` in its file.
    pub line: usize,
}

/// How the supervisor must treat a notification for a syscall number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotificationKind {
    /// A path-bearing call: read the path, apply [`Profile::decide`].
    Path,
    /// Refused by the profile's default: answer with `errno` (never continue), log the name once.
    Denied { errno: i32 },
}

/// A validated profile. Build it with [`crate::load`] or [`Profile::parse`].
///
/// Its serde form (the supervisor's compiled-profile cache) keeps what a run uses: the
/// descriptions and reasons, which document the profile's text, are left out (they are most of
/// its bytes, and reading them back was most of a cached start's cost).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    name: String,
    #[serde(skip)]
    description: String,
    source: String,
    default: DefaultAction,
    syscalls: Vec<SyscallEntry>,
    paths: Vec<PathRule>,
}

fn line_of(src: &str, offset: usize) -> usize {
    1 + src
        .as_bytes()
        .iter()
        .take(offset)
        .filter(|&&b| b == b'\n')
        .count()
}

struct Ctx<'a> {
    file: &'a str,
    /// Offsets of every newline in the source, for line numbers in O(log n) (every entry
    /// records its line; counting from the start each time made loading quadratic).
    newlines: Vec<usize>,
    _src: std::marker::PhantomData<&'a str>,
}

impl<'a> Ctx<'a> {
    fn new(file: &'a str, src: &'a str) -> Ctx<'a> {
        Ctx {
            file,
            newlines: src
                .bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i)
                .collect(),
            _src: std::marker::PhantomData,
        }
    }

    fn line(&self, span: Range<usize>) -> usize {
        1 + self.newlines.partition_point(|&i| i < span.start)
    }

    fn err(&self, span: Range<usize>, message: impl Into<String>) -> PolicyError {
        PolicyError::Invalid {
            file: self.file.to_owned(),
            line: self.line(span),
            message: message.into(),
        }
    }

    fn errno(&self, e: &Spanned<RawErrno>) -> Result<i32, PolicyError> {
        match e.get_ref() {
            RawErrno::Number(n) if (1..=i64::from(errno::MAX_ERRNO)).contains(n) => Ok(*n as i32),
            RawErrno::Number(n) => Err(self.err(
                e.span(),
                format!("errno {n} is out of range 1..={}", errno::MAX_ERRNO),
            )),
            RawErrno::Name(s) => errno::from_name(s).ok_or_else(|| {
                self.err(
                    e.span(),
                    format!("unknown errno name `{s}` (write it like \"EPERM\", or a number)"),
                )
            }),
        }
    }

    fn reason(
        &self,
        reason: &Option<Spanned<String>>,
        entry: Range<usize>,
        what: &str,
    ) -> Result<String, PolicyError> {
        match reason {
            Some(r) if !r.get_ref().trim().is_empty() => Ok(r.get_ref().trim().to_owned()),
            Some(r) => Err(self.err(r.span(), format!("{what}: `reason` is empty"))),
            None => Err(self.err(
                entry,
                format!("{what}: missing `reason` (every entry says why it is there)"),
            )),
        }
    }

    fn default_action(&self, d: &Spanned<RawDefault>) -> Result<DefaultAction, PolicyError> {
        let raw = d.get_ref();
        self.reason(&raw.reason, d.span(), "[default]")?;
        let action = raw.action.get_ref().as_str();
        let log = raw.log.as_ref().map(|l| *l.get_ref());
        let no_errno = |a: &str| match &raw.errno {
            Some(e) => Err(self.err(
                e.span(),
                format!("`errno` only applies to action = \"errno\", not \"{a}\""),
            )),
            None => Ok(()),
        };
        let no_log = |a: &str| match (&raw.log, log) {
            (Some(l), Some(true)) => Err(self.err(
                l.span(),
                format!("`log = true` only applies to action = \"errno\", not \"{a}\""),
            )),
            _ => Ok(()),
        };
        match action {
            "allow" | "kill" => {
                no_errno(action)?;
                no_log(action)?;
                Ok(if action == "allow" {
                    DefaultAction::Allow
                } else {
                    DefaultAction::Kill
                })
            }
            "errno" => {
                let errno = match &raw.errno {
                    Some(e) => self.errno(e)?,
                    None => {
                        return Err(self.err(
                            raw.action.span(),
                            "action = \"errno\" needs `errno = \"NAME\"`",
                        ))
                    }
                };
                Ok(DefaultAction::Errno {
                    errno,
                    log: log.unwrap_or(false),
                })
            }
            "notify" => Err(self.err(
                raw.action.span(),
                "notify cannot be the default action; to have the supervisor deny and log \
                 unlisted calls write action = \"errno\", errno = \"EPERM\", log = true",
            )),
            other => Err(self.err(
                raw.action.span(),
                format!("unknown default action `{other}` (allow, errno, kill)"),
            )),
        }
    }

    fn syscall(&self, s: &Spanned<RawSyscall>) -> Result<SyscallEntry, PolicyError> {
        let raw = s.get_ref();
        let name = raw.name.get_ref().clone();
        let what = format!("syscall `{name}`");
        let nr = match ScmpSyscall::from_name(&name) {
            Ok(sc) => i32::from(sc),
            Err(_) => {
                return Err(self.err(raw.name.span(), format!("unknown syscall `{name}`")));
            }
        };
        if nr < 0 {
            return Err(self.err(
                raw.name.span(),
                format!("`{name}` is not a syscall on this architecture"),
            ));
        }
        let reason = self.reason(&raw.reason, s.span(), &what)?;
        let action = match raw.action.get_ref().as_str() {
            "allow" => SyscallAction::Allow,
            "notify" => SyscallAction::Notify,
            "kill" => SyscallAction::Kill,
            "errno" => match &raw.errno {
                Some(e) => SyscallAction::Errno(self.errno(e)?),
                None => {
                    return Err(self.err(
                        raw.action.span(),
                        format!("{what}: action = \"errno\" needs `errno = \"NAME\"`"),
                    ))
                }
            },
            other => {
                return Err(self.err(
                    raw.action.span(),
                    format!("{what}: unknown action `{other}` (allow, notify, errno, kill)"),
                ))
            }
        };
        if let (Some(e), false) = (&raw.errno, matches!(action, SyscallAction::Errno(_))) {
            return Err(self.err(
                e.span(),
                format!("{what}: `errno` only applies to action = \"errno\""),
            ));
        }
        if action == SyscallAction::Notify && NEVER_NOTIFY.contains(&name.as_str()) {
            return Err(self.err(
                raw.action.span(),
                format!(
                    "{what} must not be notified: the supervisor would sit in every read/write \
                     of the target; allow or deny it"
                ),
            ));
        }
        if action == SyscallAction::Notify && !raw.when.is_empty() {
            return Err(self.err(
                raw.when[0].span(),
                format!(
                    "{what}: a notify entry cannot have `when` conditions (a call failing them \
                     would reach the supervisor indistinguishable from a path call)"
                ),
            ));
        }
        let mut when = Vec::new();
        for c in &raw.when {
            when.push(self.cmp(c, &what)?);
        }
        let origin = match &raw.origin {
            None => None,
            Some(o) => Some(match o.get_ref().as_str() {
                "table-3.1" => Origin::Table31,
                "addition" => Origin::Addition,
                other => {
                    return Err(self.err(
                        o.span(),
                        format!("{what}: unknown origin `{other}` (table-3.1, addition)"),
                    ))
                }
            }),
        };
        Ok(SyscallEntry {
            name,
            nr,
            action,
            when,
            reason,
            origin,
            line: self.line(raw.name.span()),
        })
    }

    fn cmp(&self, c: &Spanned<RawCmp>, what: &str) -> Result<ArgCmp, PolicyError> {
        let raw = c.get_ref();
        if raw.arg > 5 {
            return Err(self.err(
                c.span(),
                format!("{what}: `arg = {}` out of range 0..=5", raw.arg),
            ));
        }
        let op = match (raw.op.as_str(), raw.mask) {
            ("eq", None) => CmpOp::Eq,
            ("ne", None) => CmpOp::Ne,
            ("masked_eq", Some(mask)) => CmpOp::MaskedEq(mask),
            ("masked_eq", None) => {
                return Err(self.err(c.span(), format!("{what}: op = \"masked_eq\" needs `mask`")))
            }
            ("eq" | "ne", Some(_)) => {
                return Err(self.err(
                    c.span(),
                    format!("{what}: `mask` only applies to op = \"masked_eq\""),
                ))
            }
            (other, _) => {
                return Err(self.err(
                    c.span(),
                    format!("{what}: unknown op `{other}` (eq, ne, masked_eq)"),
                ))
            }
        };
        Ok(ArgCmp {
            arg: raw.arg,
            op,
            value: raw.value,
        })
    }

    fn path(&self, p: &Spanned<RawPath>) -> Result<PathRule, PolicyError> {
        let raw = p.get_ref();
        let prefix = paths::check_prefix(raw.prefix.get_ref())
            .map_err(|m| self.err(raw.prefix.span(), m))?;
        let what = format!("path `{}`", prefix.display());
        let reason = self.reason(&raw.reason, p.span(), &what)?;
        let action_name = raw.action.get_ref().as_str();
        if let (Some(e), false) = (&raw.errno, action_name == "deny") {
            return Err(self.err(
                e.span(),
                format!("{what}: `errno` only applies to action = \"deny\""),
            ));
        }
        if let (Some(d), false) = (&raw.dir, action_name == "serve") {
            return Err(self.err(
                d.span(),
                format!("{what}: `dir` only applies to action = \"serve\""),
            ));
        }
        let action = match action_name {
            "continue" => PathAction::Continue,
            "deny" => PathAction::Deny(match &raw.errno {
                Some(e) => self.errno(e)?,
                None => libc::EACCES,
            }),
            "serve" => {
                let Some(d) = &raw.dir else {
                    return Err(self.err(
                        raw.action.span(),
                        format!("{what}: action = \"serve\" needs `dir = \"/abs/dir\"`"),
                    ));
                };
                let dir = paths::check_prefix(d.get_ref())
                    .map_err(|m| self.err(d.span(), m.replacen("path prefix", "serve dir", 1)))?;
                PathAction::Serve(dir)
            }
            other => {
                return Err(self.err(
                    raw.action.span(),
                    format!("{what}: unknown action `{other}` (continue, deny, serve)"),
                ))
            }
        };
        Ok(PathRule {
            prefix,
            action,
            reason,
        })
    }
}

/// The exact complement of a condition, when one comparison can express it: `eq` <-> `ne`, and
/// `masked_eq` on a single bit between "clear" and "set".
pub(crate) fn complement(c: &ArgCmp) -> Option<ArgCmp> {
    let (op, value) = match c.op {
        CmpOp::Eq => (CmpOp::Ne, c.value),
        CmpOp::Ne => (CmpOp::Eq, c.value),
        CmpOp::MaskedEq(m) if m.is_power_of_two() && c.value == 0 => (CmpOp::MaskedEq(m), m),
        CmpOp::MaskedEq(m) if m.is_power_of_two() && c.value == m => (CmpOp::MaskedEq(m), 0),
        CmpOp::MaskedEq(_) => return None,
    };
    Some(ArgCmp {
        arg: c.arg,
        op,
        value,
    })
}

/// The complement of a set of conditions on one argument (the argument matches none of them),
/// as a union of single comparisons; `None` when it cannot be written that way.
///
/// - one condition with an exact complement ([`complement`]): that one comparison;
/// - `masked_eq` conditions on the same argument with the same mask of at most 32 bits (e.g.
///   ioctl requests, compared on their low 32 bits as the kernel reads them): the values that
///   differ from every excluded one, as `masked_eq` patterns on a prefix of the mask's bits
///   (one pattern per bit where a path to an excluded value branches off: at most
///   32 × the number of excluded values).
pub(crate) fn complement_all(conds: &[ArgCmp]) -> Option<Vec<ArgCmp>> {
    if let [c] = conds {
        if let Some(c) = complement(c) {
            return Some(vec![c]);
        }
    }
    let first = conds.first()?;
    let CmpOp::MaskedEq(mask) = first.op else {
        return None;
    };
    if mask == 0
        || mask.count_ones() > 32
        || conds
            .iter()
            .any(|c| c.arg != first.arg || c.op != first.op || c.value & !mask != 0)
    {
        return None;
    }
    let bits: Vec<u64> = (0..64)
        .rev()
        .map(|b| 1u64 << b)
        .filter(|b| mask & b != 0)
        .collect();
    let excluded: Vec<u64> = conds.iter().map(|c| c.value).collect();
    let mut out = Vec::new();
    fn walk(bits: &[u64], pmask: u64, pval: u64, excl: &[u64], arg: u32, out: &mut Vec<ArgCmp>) {
        if excl.is_empty() {
            out.push(ArgCmp {
                arg,
                op: CmpOp::MaskedEq(pmask),
                value: pval,
            });
            return;
        }
        let Some((&b, rest)) = bits.split_first() else {
            return; // exactly an excluded value
        };
        for v in [0, b] {
            let sub: Vec<u64> = excl.iter().copied().filter(|x| x & b == v).collect();
            walk(rest, pmask | b, pval | v, &sub, arg, out);
        }
    }
    walk(&bits, 0, 0, &excluded, first.arg, &mut out);
    Some(out)
}

/// A syscall may have several entries: at most one unconditional (checked with the duplicates)
/// and conditional ones (never `notify`, refused in [`Ctx::syscall`]). Next to an unconditional
/// entry, the conditional entries must share one action (not the unconditional one) and have
/// one condition each whose set has a complement [`complement_all`] can write: libseccomp lets
/// an unconditional rule swallow every conditional rule for the same syscall, so
/// [`Profile::filter_spec`] emits the unconditional entry under that complement instead,
/// whatever the kernel default is.
fn check_mixed(
    cx: &Ctx<'_>,
    raw: &[Spanned<RawSyscall>],
    entries: &[SyscallEntry],
) -> Result<(), PolicyError> {
    for (i, e) in entries.iter().enumerate() {
        if e.when.is_empty() {
            continue;
        }
        let Some(u) = entries
            .iter()
            .find(|u| u.name == e.name && u.when.is_empty())
        else {
            continue;
        };
        let what = format!("syscall `{}`", e.name);
        let span = raw[i].get_ref().name.span();
        if e.action == u.action {
            return Err(cx.err(
                span,
                format!(
                    "{what}: the conditional entry has the same action as the unconditional \
                     entry at line {} (redundant)",
                    u.line
                ),
            ));
        }
        if let Some(first) = entries[..i]
            .iter()
            .find(|c| c.name == e.name && !c.when.is_empty() && c.action != e.action)
        {
            return Err(cx.err(
                span,
                format!(
                    "{what}: next to the unconditional entry at line {} the conditional \
                     entries must share one action (first at line {})",
                    u.line, first.line
                ),
            ));
        }
        let conds: Vec<ArgCmp> = entries[..=i]
            .iter()
            .filter(|c| c.name == e.name && !c.when.is_empty())
            .flat_map(|c| c.when.iter().copied())
            .collect();
        let singles = entries[..=i]
            .iter()
            .all(|c| c.name != e.name || c.when.len() <= 1);
        if !singles || complement_all(&conds).is_none() {
            return Err(cx.err(
                raw[i].get_ref().when[0].span(),
                format!(
                    "{what}: next to the unconditional entry at line {} a conditional entry \
                     needs exactly one condition with an exact complement (eq, ne, \
                     masked_eq on a single bit with value 0 or that bit, or masked_eq on the \
                     same argument with the same mask of at most 32 bits as the other \
                     conditional entries)",
                    u.line
                ),
            ));
        }
    }
    Ok(())
}

impl Profile {
    /// Parse and validate profile text; `file` names it in errors.
    pub fn parse(src: &str, file: &str) -> Result<Profile, PolicyError> {
        let cx = Ctx::new(file, src);
        let raw: RawProfile = toml::from_str(src).map_err(|e| PolicyError::Invalid {
            file: file.to_owned(),
            line: e.span().map_or(1, |s| line_of(src, s.start)),
            message: e.message().trim().replace('\n', " "),
        })?;
        let name = raw.name.get_ref().trim().to_owned();
        if name.is_empty() {
            return Err(cx.err(raw.name.span(), "`name` is empty"));
        }
        let default = cx.default_action(&raw.default)?;

        let mut syscalls: Vec<SyscallEntry> = Vec::with_capacity(raw.syscall.len());
        for s in &raw.syscall {
            let entry = cx.syscall(s)?;
            let span = s.get_ref().name.span();
            let same = |e: &&SyscallEntry| e.name == entry.name;
            if let Some(first) = syscalls.iter().filter(same).find(|e| e.when == entry.when) {
                let what = if entry.when.is_empty() {
                    String::new()
                } else {
                    " with the same `when`".to_owned()
                };
                return Err(cx.err(
                    span,
                    format!(
                        "duplicate entry for syscall `{}`{what} (first at line {})",
                        entry.name, first.line
                    ),
                ));
            }
            syscalls.push(entry);
        }
        check_mixed(&cx, &raw.syscall, &syscalls)?;

        let mut rules: Vec<PathRule> = Vec::with_capacity(raw.path.len());
        let mut seen_prefix: HashMap<PathBuf, usize> = HashMap::new();
        for p in &raw.path {
            let rule = cx.path(p)?;
            let line = cx.line(p.get_ref().prefix.span());
            if let Some(first) = seen_prefix.insert(rule.prefix.clone(), line) {
                return Err(cx.err(
                    p.get_ref().prefix.span(),
                    format!(
                        "duplicate path rule for `{}` (first at line {first})",
                        rule.prefix.display()
                    ),
                ));
            }
            rules.push(rule);
        }

        Ok(Profile {
            name,
            description: raw.description,
            source: file.to_owned(),
            default,
            syscalls,
            paths: rules,
        })
    }

    /// Read and validate a profile file.
    pub fn from_file(path: &Path) -> Result<Profile, PolicyError> {
        let file = path.display().to_string();
        let src = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            file: file.clone(),
            source,
        })?;
        Profile::parse(&src, &file)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// The file the profile came from (for builtins, its path in the repository).
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn default_action(&self) -> DefaultAction {
        self.default
    }

    pub fn syscalls(&self) -> &[SyscallEntry] {
        &self.syscalls
    }

    pub fn path_rules(&self) -> &[PathRule] {
        &self.paths
    }

    /// The errno unlisted syscalls fail with, if the default is to fail them.
    pub fn denied_errno(&self) -> Option<i32> {
        match self.default {
            DefaultAction::Errno { errno, .. } => Some(errno),
            _ => None,
        }
    }

    /// Whether unlisted syscalls reach the supervisor (as notifications) to be denied and logged.
    pub fn logs_denied(&self) -> bool {
        matches!(self.default, DefaultAction::Errno { log: true, .. })
    }

    /// Turn logging of denied calls on or off (e.g. `--no-log-denied`, or a test without a
    /// supervisor). Has no effect unless the default is an errno.
    pub fn set_logs_denied(&mut self, on: bool) {
        if let DefaultAction::Errno { log, .. } = &mut self.default {
            *log = on;
        }
    }

    /// Names of the syscalls notified for a path decision.
    pub fn notified_syscalls(&self) -> Vec<String> {
        self.notified().map(|e| e.name.clone()).collect()
    }

    /// Native numbers of the syscalls notified for a path decision.
    pub fn notified_syscall_nrs(&self) -> Vec<i32> {
        self.notified().map(|e| e.nr).collect()
    }

    fn notified(&self) -> impl Iterator<Item = &SyscallEntry> {
        self.syscalls
            .iter()
            .filter(|e| e.action == SyscallAction::Notify)
    }

    /// How to treat a notification for syscall number `nr`; `None` if this profile's filter
    /// never notifies it (the supervisor should then refuse it with EPERM and log loudly).
    pub fn notification_kind(&self, nr: i32) -> Option<NotificationKind> {
        if self.notified().any(|e| e.nr == nr) {
            return Some(NotificationKind::Path);
        }
        match self.default {
            DefaultAction::Errno { errno, log: true } => Some(NotificationKind::Denied { errno }),
            _ => None,
        }
    }

    /// The decision for an absolute, resolved path: the rule with the longest prefix (counted in
    /// components, so `/etc/pass` does not match `/etc/passwd`) applies; no rule => `Continue`.
    pub fn decide(&self, path: &Path) -> PathDecision {
        paths::decide(&self.paths, path)
    }

    /// Add a serve rule (from `--serve PREFIX=DIR`); it replaces a file rule for the same prefix.
    pub fn add_serve(&mut self, arg: &str) -> Result<(), PolicyError> {
        let (prefix, dir) = parse_serve_arg(arg)?;
        self.paths.retain(|r| r.prefix != prefix);
        self.paths.push(PathRule {
            prefix,
            action: PathAction::Serve(dir),
            reason: format!("--serve {arg}"),
        });
        Ok(())
    }

    /// The filter for the child. Kernel default: `Allow`, `Errno(e)`, `KillProcess`, or `Notify`
    /// when denied calls are logged (the supervisor answers those with the errno). Entries whose
    /// action equals the kernel default are left out: they are redundant, and libseccomp refuses
    /// a rule whose action is the default (so under a logging default the notified path calls
    /// are covered by the default itself; [`Profile::notification_kind`] tells them apart).
    /// An unconditional entry next to a conditional one for the same syscall is emitted under
    /// the complement of that condition, so the conditional rule survives in libseccomp.
    pub fn filter_spec(&self) -> FilterSpec {
        let default = match self.default {
            DefaultAction::Allow => Action::Allow,
            DefaultAction::Errno { log: true, .. } => Action::Notify,
            DefaultAction::Errno { errno, log: false } => Action::Errno(errno),
            DefaultAction::Kill => Action::KillProcess,
        };
        let action = |a: SyscallAction| match a {
            SyscallAction::Allow => Action::Allow,
            SyscallAction::Notify => Action::Notify,
            SyscallAction::Errno(n) => Action::Errno(n),
            SyscallAction::Kill => Action::KillProcess,
        };
        // The conditions of each syscall that has conditional entries (few do), gathered once:
        // every run that loads a profile builds this spec.
        let mut conditional: std::collections::HashMap<&str, Vec<ArgCmp>> =
            std::collections::HashMap::new();
        for c in self.syscalls.iter().filter(|c| !c.when.is_empty()) {
            conditional
                .entry(c.name.as_str())
                .or_default()
                .extend(c.when.iter().copied());
        }
        let mut rules = Vec::with_capacity(self.syscalls.len());
        for e in &self.syscalls {
            // An unconditional entry next to a conditional one (validated: a single condition
            // with an exact complement) applies where the condition fails. Written as is,
            // libseccomp would let it swallow the conditional rule.
            if action(e.action) == default {
                continue;
            }
            let conds = conditional
                .get(e.name.as_str())
                .map_or(&[][..], |v| v.as_slice());
            if !e.when.is_empty() || conds.is_empty() {
                rules.push(SyscallRule {
                    name: e.name.clone(),
                    action: action(e.action),
                    when: e.when.clone(),
                });
                continue;
            }
            // Validated in check_mixed: the complement exists.
            for c in complement_all(conds).unwrap_or_default() {
                rules.push(SyscallRule {
                    name: e.name.clone(),
                    action: action(e.action),
                    when: vec![c],
                });
            }
        }
        FilterSpec { default, rules }
    }
}

/// Parse `PREFIX=DIR`: PREFIX absolute and normalized; DIR made absolute against the current
/// directory.
pub fn parse_serve_arg(arg: &str) -> Result<(PathBuf, PathBuf), PolicyError> {
    let bad = |message: String| PolicyError::Serve {
        arg: arg.to_owned(),
        message,
    };
    let Some((prefix, dir)) = arg.split_once('=') else {
        return Err(bad(
            "expected PREFIX=DIR, e.g. /tmp/python/Lib=/var/cache/realm/lib".into(),
        ));
    };
    let prefix = paths::check_prefix(prefix).map_err(bad)?;
    if dir.is_empty() {
        return Err(bad("DIR is empty".into()));
    }
    let dir = std::path::absolute(dir).map_err(|e| bad(format!("DIR: {e}")))?;
    Ok((prefix, dir))
}
