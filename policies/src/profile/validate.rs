//! Profile text to a [`Profile`]: every entry checked, with the file and line of what is
//! wrong. Nothing here decides what the filter looks like; [`super::compile`] does.

use super::compile::complement_all;
use super::model::{DefaultAction, Need, Origin, Profile, SyscallAction, SyscallEntry};
use super::raw::{RawCmp, RawDefault, RawErrno, RawPath, RawProfile, RawSyscall};
use crate::errno;
use crate::error::PolicyError;
use crate::paths::{self, PathAction, PathRule};
use libseccomp::ScmpSyscall;
use notify::{ArgCmp, CmpOp};
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Calls that must never be notified: the supervisor would sit in every I/O of the target (and
/// could deadlock on its own output). youki refuses the same.
const NEVER_NOTIFY: &[&str] = &[
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
    "pwritev2",
];

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
        let needs = match &raw.needs {
            None => None,
            Some(n) if action == SyscallAction::Notify => {
                return Err(self.err(
                    n.span(),
                    format!("{what}: a notify entry applies to every run (no `needs`)"),
                ))
            }
            Some(n) => Some(match n.get_ref().as_str() {
                "jail" => Need::Jail,
                "own-net" => Need::OwnNet,
                other => {
                    return Err(self.err(
                        n.span(),
                        format!("{what}: unknown need `{other}` (jail, own-net)"),
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
            needs,
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
            let same = |e: &&SyscallEntry| e.name == entry.name && e.needs == entry.needs;
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
}
