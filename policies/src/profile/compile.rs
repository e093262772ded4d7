//! A [`Profile`] compiled into the [`FilterSpec`] the supervisor installs, and the condition
//! complements that let an unconditional entry stand next to conditional ones.

use super::model::{DefaultAction, Profile, SyscallAction};
use notify::{Action, ArgCmp, CmpOp, FilterSpec, SyscallRule};

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

impl Profile {
    /// The filter for the child. Kernel default: `Allow`, `Errno(e)`, `KillProcess`, or `Notify`
    /// when denied calls are logged (the supervisor answers those with the errno). Entries whose
    /// action equals the kernel default are left out: they are redundant, and libseccomp refuses
    /// a rule whose action is the default (so under a logging default the notified path calls
    /// are covered by the default itself; [`Profile::notification_kind`] tells them apart).
    /// An unconditional entry next to a conditional one for the same syscall is emitted under
    /// the complement of that condition, so the conditional rule survives in libseccomp.
    /// An entry whose need is not resolved ([`Profile::for_run`]) is left out: the profile as
    /// parsed is the strictest one.
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
        let resolved = || self.syscalls.iter().filter(|e| e.needs.is_none());
        for c in resolved().filter(|c| !c.when.is_empty()) {
            conditional
                .entry(c.name.as_str())
                .or_default()
                .extend(c.when.iter().copied());
        }
        let mut rules = Vec::with_capacity(self.syscalls.len());
        for e in resolved() {
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
