//! The one sequence the supervisor runs for a realm: "show realm R to this proc". Before the
//! fork, [`show`] makes the plan and picks the way (the first that applies, see the crate's
//! drawing); the supervisor then adds [`Showing::mounts`] to the proc's view, or
//! [`Showing::serve_rule`] to its policy, and hides [`Showing::hidden`]. After the fork,
//! [`Showing::resolver`] gives the answers for the notification path and the `--stats` line.
#![forbid(unsafe_code)]

use crate::realm::{imports_of, python_of, LazyView, RealmOpts, RealmPlan};
use crate::serve::Resolver;
use anyhow::anyhow;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// How the realm is shown, chosen before the fork.
enum Way {
    /// Complete in the lib dir: bound read-only at the prefix (this many packages).
    Kernel(usize),
    /// Every package in the store's shared trees: each bound over its placeholder.
    Trees(fetcher::TreeView),
    /// The lazy backend's image or FUSE mount, with the installed packages over it.
    Lazy(LazyView),
    /// The lib dir served by notification.
    Notified,
}

/// A realm as it is shown to one proc.
pub struct Showing {
    plan: RealmPlan,
    way: Way,
}

/// Show the realm of `opts` to a proc that runs `command` (`program` resolved): `None` without
/// `--bucket`. `jailed`: the proc runs in its σcontainer. `on_helper`: see
/// [`RealmPlan::on_helper`].
pub fn show(
    opts: &RealmOpts,
    program: &Path,
    command: &[OsString],
    jailed: bool,
    on_helper: fn(i32),
) -> anyhow::Result<Option<Showing>> {
    let Some(mut r) = RealmPlan::new(opts)? else {
        return Ok(None);
    };
    r.compile_with = python_of(program);
    r.delegate = r.opts.fill_process.delegates(jailed);
    r.on_helper = on_helper;
    if r.compile_with.is_some() {
        r.prefetch = imports_of(command);
    }
    let way = if let Some(n) = r.kernel_served(jailed) {
        Way::Kernel(n)
    } else if let Some(view) = r.tree_view(jailed) {
        Way::Trees(view)
    } else if let Some(view) = r.lazy_image(jailed) {
        Way::Lazy(view)
    } else {
        Way::Notified
    };
    Ok(Some(Showing { plan: r, way }))
}

impl Showing {
    /// `existing` (the supervisor's PYTHONPATH) with the realm's prefix on it.
    pub fn pythonpath(&self, existing: Option<&OsStr>) -> OsString {
        self.plan.pythonpath(existing)
    }

    /// The `--serve` rule of a realm served by notification (`None`: the kernel shows it).
    pub fn serve_rule(&self) -> Option<String> {
        matches!(self.way, Way::Notified).then(|| self.plan.serve_rule())
    }

    /// The lazy image is marked once the target exists, before its program may touch it: the
    /// target must not exec before the supervisor has done so.
    pub fn marks_image(&self) -> bool {
        matches!(self.way, Way::Lazy(LazyView::Image(_)))
    }

    /// What to bind read-only into the proc's view, `(host path, path in the view)`, in order.
    pub fn mounts(&self) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
        let (lib, prefix) = (&self.plan.lib, &self.plan.opts.lib_prefix);
        Ok(match &self.way {
            Way::Kernel(_) => vec![(lib.clone(), prefix.clone())],
            Way::Trees(view) => self.plan.tree_mounts(view)?,
            Way::Lazy(view) => std::iter::once((view.mnt().to_path_buf(), prefix.clone()))
                .chain(
                    view.lib_entries()
                        .iter()
                        .map(|e| (lib.join(e), prefix.join(e))),
                )
                .collect(),
            Way::Notified => Vec::new(),
        })
    }

    /// The realm's cache root: never shown to the proc.
    pub fn hidden(&self) -> &Path {
        &self.plan.root
    }

    /// Call once the proc's first process exists: the lazy image to make for a later run is
    /// made off this run's path.
    pub fn forked(&self) {
        self.plan.prepare_image();
    }

    /// After the fork: the answers of the notification path and the `--stats` line. `pid` is
    /// the supervisor's child (the jail's init when `jailed`), not yet released; `release` lets
    /// it run, called here only before a start that takes a while (the program loads
    /// meanwhile).
    pub fn resolver(
        self,
        pid: i32,
        jailed: bool,
        release: impl FnOnce(),
    ) -> anyhow::Result<Box<dyn Resolver>> {
        let r = self.plan;
        Ok(match self.way {
            Way::Kernel(n) => Box::new(r.kernel_served_resolver(n)),
            Way::Trees(view) => Box::new(r.trees_resolver(&view)),
            // Marked before the target is released: its first touch already waits for a fill.
            Way::Lazy(LazyView::Fuse(m)) => Box::new(r.fuse_served(m)),
            Way::Lazy(LazyView::Image(img)) => {
                // The child's view is built (it waits to be released): mark the proc's mount of
                // the image. Our child, not yet reaped: the pid names it.
                img.watch(pid, &r.opts.lib_prefix)
                    .map_err(|e| anyhow!("realm {}: lazy backend: {e}", r.opts.realm))?;
                let init = jailed
                    .then(|| notify::pidfd_open(pid, 0))
                    .transpose()
                    .map_err(|e| anyhow!("pidfd_open of the jail's init: {e}"))?;
                Box::new(r.start_lazy(img, init)?)
            }
            // Notified calls wait in the kernel until the notification thread reads them: the
            // program loads while the realm's cache, runtime and prefetch start.
            Way::Notified => {
                release();
                let resolver = r.start()?;
                jail::mark("resolver");
                Box::new(resolver)
            }
        })
    }
}
