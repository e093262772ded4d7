//! Preloads learned from use (SOCK's rule, learned rather than given): which top-level packages
//! the pool's recent warm runs imported, and when a set of them earns a zygote of its own.
//!
//! ```text
//! client ── Run{imports: the source's import lines} ──▶ pool: names valid? (else cold)
//!   zygote ◀── the connection + those names ──────────┘
//!     proc: runs the program; at its end, of those names, the ones in its sys.modules that it
//!           imported itself (not at start-up) from a directory of the interpreter's own
//!           sys.path (never the script's directory or the working directory) ─▶ shared page
//!   zygote: reaps the proc, reads the page (bounded, names validated again) ─▶ pool
//!   pool:   [`Learner::record`]: a window of the last N runs' sets
//!           [`Learner::candidate`] between requests: the largest set imported by at least K
//!           of them that no zygote preloads exactly ─▶ a learned zygote, started ahead
//! ```
//!
//! The bounds, since the names come from a client and a program the pool does not trust: a
//! name is `[A-Za-z_][A-Za-z0-9_]*` of at most [`MAX_NAME`] bytes, a run counts at most
//! [`MAX_PER_RUN`] of them, the window holds at most N runs (capped at [`MAX_WINDOW`]), and a
//! name is imported by the pool only once K runs' own interpreters have imported it from the
//! interpreter's own path. A name that fails to import in a zygote is dropped from learning
//! (one log line; at most [`MAX_REFUSED`] such are remembered). The page is one 4 KiB shared
//! anonymous mapping made before the fork (the one trace of learning a proc could see, in
//! `/proc/self/maps`). Cold runs report nothing: the client sees their system calls, not their
//! `sys.modules`, and their import lines alone are the client's word.
#![forbid(unsafe_code)]

use std::collections::{BTreeSet, VecDeque};

/// The longest module name counted.
pub const MAX_NAME: usize = 64;
/// At most this many names of one run are counted.
pub const MAX_PER_RUN: usize = 32;
/// The longest window.
pub const MAX_WINDOW: usize = 1000;
/// At most this many names that failed to import are remembered (the oldest forgotten).
pub const MAX_REFUSED: usize = 256;

/// A top-level module name the pool accepts: `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_NAME`].
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// The defaults: a set imported by 3 of the last 20 runs earns a zygote; at most 2 learned
/// zygotes, the least recently used replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnOpts {
    pub enabled: bool,
    /// K: runs that must have imported a set.
    pub threshold: usize,
    /// N: the runs remembered.
    pub window: usize,
    /// M: learned zygotes at most.
    pub zygotes: usize,
}

impl Default for LearnOpts {
    fn default() -> Self {
        LearnOpts {
            enabled: true,
            threshold: 3,
            window: 20,
            zygotes: 2,
        }
    }
}

/// The pool's memory of what its runs imported.
#[derive(Debug)]
pub struct Learner {
    pub opts: LearnOpts,
    runs: VecDeque<BTreeSet<String>>,
    refused: VecDeque<String>,
}

impl Learner {
    pub fn new(opts: LearnOpts) -> Learner {
        let opts = LearnOpts {
            window: opts.window.clamp(1, MAX_WINDOW),
            threshold: opts.threshold.max(1),
            ..opts
        };
        Learner {
            opts,
            runs: VecDeque::new(),
            refused: VecDeque::new(),
        }
    }

    /// One run's imported names (as its zygote reported them): invalid ones dropped, at most
    /// [`MAX_PER_RUN`] counted.
    pub fn record(&mut self, names: &[String]) {
        if !self.opts.enabled {
            return;
        }
        let set: BTreeSet<String> = names
            .iter()
            .filter(|n| valid_name(n) && !self.refused.contains(n))
            .take(MAX_PER_RUN)
            .cloned()
            .collect();
        self.runs.push_back(set);
        while self.runs.len() > self.opts.window {
            self.runs.pop_front();
        }
    }

    /// Drop `name` from learning (it failed to import in a zygote).
    pub fn refuse(&mut self, name: &str) {
        if self.refused.iter().any(|r| r == name) {
            return;
        }
        self.refused.push_back(name.to_owned());
        while self.refused.len() > MAX_REFUSED {
            self.refused.pop_front();
        }
        for run in &mut self.runs {
            run.remove(name);
        }
    }

    /// How many of the remembered runs imported every name of `set`.
    fn support(&self, set: &BTreeSet<String>) -> usize {
        self.runs.iter().filter(|r| set.is_subset(r)).count()
    }

    /// How many of the remembered runs imported every one of `names` (a learned zygote whose
    /// place a candidate would take must be used less: no two sets take turns).
    pub fn used_by(&self, names: &[String]) -> usize {
        self.support(&names.iter().cloned().collect())
    }

    /// The set that earns a zygote, if one does: of the names at least K runs imported, each
    /// run's share is a candidate, unless a zygote preloads exactly it (`have`); the largest
    /// imported by at least K runs (then the most used, then the first by name) wins.
    pub fn candidate(&self, have: &[Vec<String>]) -> Option<Vec<String>> {
        if !self.opts.enabled {
            return None;
        }
        let k = self.opts.threshold;
        let frequent: BTreeSet<String> = self
            .counts()
            .into_iter()
            .filter(|(_, c)| *c >= k)
            .map(|(n, _)| n)
            .collect();
        let have: Vec<BTreeSet<&String>> = have.iter().map(|h| h.iter().collect()).collect();
        let mut best: Option<(usize, usize, BTreeSet<String>)> = None;
        for run in &self.runs {
            let set: BTreeSet<String> = run.intersection(&frequent).cloned().collect();
            if set.is_empty() || have.iter().any(|h| h.iter().copied().eq(set.iter())) {
                continue;
            }
            let support = self.support(&set);
            if support < k {
                continue;
            }
            let better = match &best {
                None => true,
                Some((len, sup, b)) => {
                    (set.len(), support) > (*len, *sup)
                        || ((set.len(), support) == (*len, *sup) && set < *b)
                }
            };
            if better {
                best = Some((set.len(), support, set));
            }
        }
        best.map(|(_, _, set)| set.into_iter().collect())
    }

    /// Each name and how many remembered runs imported it, most first.
    pub fn counts(&self) -> Vec<(String, usize)> {
        let mut all: std::collections::BTreeMap<&str, usize> = Default::default();
        for n in self.runs.iter().flatten() {
            *all.entry(n).or_default() += 1;
        }
        let mut v: Vec<(String, usize)> = all.into_iter().map(|(n, c)| (n.to_owned(), c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// Runs remembered.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Names dropped because they failed to import, oldest first.
    pub fn refused(&self) -> Vec<String> {
        self.refused.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn names_are_validated() {
        for good in ["json", "_x", "numpy2", "A_b"] {
            assert!(valid_name(good), "{good}");
        }
        let long = "a".repeat(MAX_NAME + 1);
        for bad in ["", "2x", "a.b", "../x", "a b", "os;rm", "é", long.as_str()] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_set_earns_a_zygote_after_k_of_n_runs() {
        let mut l = Learner::new(LearnOpts::default());
        l.record(&v(&["json", "decimal"]));
        l.record(&v(&["json", "decimal", "csv"]));
        assert_eq!(l.candidate(&[]), None, "two runs are not three");
        l.record(&v(&["decimal", "json", "bad name", "../x"]));
        assert_eq!(l.candidate(&[]), Some(v(&["decimal", "json"])));
        // A zygote that preloads exactly it: nothing more to learn (no run imported json
        // without decimal), until runs import another set.
        assert_eq!(l.candidate(&[v(&["json", "decimal"])]), None);
        let mut more = Learner::new(LearnOpts::default());
        for names in [
            &["json"][..],
            &["json"],
            &["json"],
            &["csv"],
            &["csv"],
            &["csv"],
        ] {
            more.record(&v(names));
        }
        assert_eq!(
            more.candidate(&[]),
            Some(v(&["csv"])),
            "ties: the first by name"
        );
        assert_eq!(more.candidate(&[v(&["csv"])]), Some(v(&["json"])));
        // A name that failed to import is dropped, and so is what it earned.
        l.refuse("decimal");
        assert_eq!(l.candidate(&[]), Some(v(&["json"])));
        l.record(&v(&["decimal"]));
        assert_eq!(l.counts()[0], ("json".to_owned(), 3));
        assert!(!l.counts().iter().any(|(n, _)| n == "decimal"));
    }

    #[test]
    fn the_window_and_each_run_are_bounded() {
        let mut l = Learner::new(LearnOpts {
            window: 3,
            ..LearnOpts::default()
        });
        let many: Vec<String> = (0..1000).map(|i| format!("m{i}")).collect();
        for _ in 0..10 {
            l.record(&many);
        }
        assert_eq!(l.runs(), 3);
        assert_eq!(l.counts().len(), MAX_PER_RUN);
        let off = Learner::new(LearnOpts {
            enabled: false,
            ..LearnOpts::default()
        });
        assert_eq!(off.candidate(&[]), None);
    }
}
