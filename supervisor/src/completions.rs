//! Shell completions and the man page, generated from the command line itself (the `Cli` that
//! `main` parses, handed in as a [`clap::Command`]), so they never drift from `--help`:
//!
//! ```text
//! sigma-supervise generate-shell-completion bash|zsh|fish   > the script, on stdout
//! sigma-supervise generate-man-page [DIR]                   > sigma-supervise.1 on stdout, or
//!                                                             DIR/sigma-supervise{,-publish}.1
//! ```
//!
//! Both subcommands are hidden (neither completed nor in `--help`); the wheel's build
//! (wheel/build.py) runs them and installs their output under the environment's share/.
#![forbid(unsafe_code)]

use clap_complete::Shell;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// The hidden subcommands, parsed as a part of `cli::Sub`.
#[derive(Debug, clap::Subcommand)]
pub enum Generate {
    /// Print the completion script for SHELL.
    #[command(name = "generate-shell-completion", hide = true)]
    ShellCompletion {
        #[arg(value_enum)]
        shell: Completed,
    },
    /// Print the man page, or write one page per subcommand into DIR.
    #[command(name = "generate-man-page", hide = true)]
    ManPage { dir: Option<PathBuf> },
}

/// The shells a completion script is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Completed {
    Bash,
    Zsh,
    Fish,
}

impl From<Completed> for Shell {
    fn from(c: Completed) -> Shell {
        match c {
            Completed::Bash => Shell::Bash,
            Completed::Zsh => Shell::Zsh,
            Completed::Fish => Shell::Fish,
        }
    }
}

/// The command's name in scripts and pages, whatever the binary was called as.
const NAME: &str = "sigma-supervise";

/// `shell`'s completion script for `cmd`.
pub fn completion(shell: Completed, mut cmd: clap::Command) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(Shell::from(shell), &mut cmd, NAME, &mut out);
    out
}

/// The top command's man page (roff), as `clap_mangen::generate_to` writes it: no `help`
/// subcommand.
pub fn man_page(cmd: clap::Command) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.name(NAME).disable_help_subcommand(true)).render(&mut out)?;
    Ok(out)
}

/// Runs one of the hidden subcommands.
pub fn main(what: &Generate, cmd: clap::Command) -> ExitCode {
    let written = match what {
        Generate::ShellCompletion { shell } => {
            std::io::stdout().write_all(&completion(*shell, cmd))
        }
        Generate::ManPage { dir: None } => {
            man_page(cmd).and_then(|page| std::io::stdout().write_all(&page))
        }
        Generate::ManPage { dir: Some(dir) } => std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(cmd.name(NAME), dir)),
    };
    match written.and_then(|()| std::io::stdout().flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{NAME}: cannot write the generated file: {e}");
            ExitCode::FAILURE
        }
    }
}
