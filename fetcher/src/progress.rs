//! A download progress bar on stderr: only when stderr is a terminal, and only once a download
//! has taken longer than `FetchConfig::progress_after`.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    shown: bool,
    start: Instant,
    after: Duration,
}

impl Progress {
    pub(crate) fn new(enabled: bool, after: Duration, label: &str, total: u64) -> Self {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(label.to_owned());
            bar
        });
        Progress {
            bar,
            shown: false,
            start: Instant::now(),
            after,
        }
    }

    pub(crate) fn advance(&mut self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
            if !self.shown && self.start.elapsed() >= self.after {
                bar.set_draw_target(ProgressDrawTarget::stderr());
                self.shown = true;
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
