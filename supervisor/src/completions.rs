//! Shell completions and man pages from the command line itself (the `Cli` that `main` parses,
//! handed in as a [`clap::Command`]), so they never drift from `--help`. Hidden subcommands:
//! `generate-shell-completion SHELL` prints the script; `generate-man-page` prints
//! sigma-supervise.1, `generate-man-page DIR` writes a page per subcommand into DIR. The wheel's
//! build (wheel/build.py) installs their output under share/.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set while the command line is built for what is generated: the generators themselves are
/// then left out of it, so no completion or page offers them.
static GENERATING: AtomicBool = AtomicBool::new(false);

/// Whether the command line being built is for a completion script or a page.
pub fn generating() -> bool {
    GENERATING.load(Ordering::Relaxed)
}

#[derive(Debug, clap::Subcommand)]
pub enum Generate {
    /// Print the completion script for SHELL.
    #[command(name = "generate-shell-completion", hide = true)]
    ShellCompletion { shell: clap_complete::Shell },
    /// Print the man page, or write one page per subcommand into DIR.
    #[command(name = "generate-man-page", hide = true)]
    ManPage { dir: Option<PathBuf> },
}

/// Runs one of the hidden subcommands on the whole command line, which `command` builds (once
/// [`generating`] is set, so without these subcommands).
pub fn main(what: &Generate, command: impl FnOnce() -> clap::Command) -> ExitCode {
    GENERATING.store(true, Ordering::Relaxed);
    let cmd = command();
    // Named as installed whatever the binary was called as; no `help` subcommand in the pages.
    let mut cmd = cmd.name("sigma-supervise").disable_help_subcommand(true);
    let mut out = Vec::new();
    let written = match what {
        Generate::ShellCompletion { shell } => {
            clap_complete::generate(*shell, &mut cmd, "sigma-supervise", &mut out);
            Ok(())
        }
        Generate::ManPage { dir: None } => clap_mangen::Man::new(cmd).render(&mut out),
        Generate::ManPage { dir: Some(dir) } => {
            std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(cmd, dir))
        }
    };
    let mut stdout = std::io::stdout();
    match written.and_then(|()| stdout.write_all(&out).and_then(|()| stdout.flush())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sigma-supervise: cannot write what was generated: {e}");
            ExitCode::FAILURE
        }
    }
}
