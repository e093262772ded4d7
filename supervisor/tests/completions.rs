//! The shell completions and man page the binary generates from its own command line
//! (`generate-shell-completion`, `generate-man-page`): each names the subcommands and options
//! `--help` shows, and a shell that is installed here parses its script.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_sigma-supervise");

fn generated(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn installed(shell: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {shell}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn completions_for_bash_zsh_and_fish_name_the_subcommands_and_options() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, check) in [
        ("bash", &["-n"][..]),
        ("zsh", &["-n"][..]),
        ("fish", &["--no-execute"][..]),
    ] {
        let script = generated(&["generate-shell-completion", shell]);
        // fish names a long option `-l NAME`.
        let long = |name: &str| match shell {
            "fish" => format!("-l {name}"),
            _ => format!("--{name}"),
        };
        for word in [
            "sigma-supervise".into(),
            "publish".into(),
            long("realm"),
            long("requirement"),
        ] {
            assert!(script.contains(&word), "{shell}'s script lacks {word}");
        }
        // The generators are hidden: no script offers them.
        assert!(
            !script.contains("generate-"),
            "{shell}'s script offers a hidden subcommand"
        );
        // Syntax, by the shell itself where it is installed (bash always is: scripts/bootstrap's
        // Debian); the others say so rather than pass quietly.
        if installed(shell) {
            let file = dir.path().join(shell);
            std::fs::write(&file, &script).unwrap();
            let st = Command::new(shell).args(check).arg(&file).status().unwrap();
            assert!(
                st.success(),
                "{shell} {check:?} refuses the generated script"
            );
        } else {
            assert_ne!(shell, "bash", "bash is missing");
            eprintln!("completions: {shell} is not installed here: its script's syntax unchecked");
        }
    }
    let out = Command::new(BIN)
        .args(["generate-shell-completion", "tcsh"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn man_pages_show_the_long_help_and_one_page_per_subcommand() {
    let page = generated(&["generate-man-page"]);
    assert!(page.contains(".TH sigma-supervise 1"), "{page}");
    assert!(page.contains("σcontainer"), "the long about is missing");
    assert!(page.contains(r"\-\-realm"), "--realm is missing");
    assert!(
        page.contains("publish"),
        "the publish subcommand is missing"
    );
    assert!(
        !page.contains("generate"),
        "the page names a hidden subcommand"
    );

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    generated(&["generate-man-page", out.to_str().unwrap()]);
    let read = |name: &str| std::fs::read_to_string(Path::new(&out).join(name)).unwrap();
    assert_eq!(read("sigma-supervise.1"), page);
    let publish = read("sigma-supervise-publish.1");
    assert!(publish.contains(r"\-\-bucket"), "{publish}");
    // The pool's page shows its own options (it is parsed apart, by the pool).
    let pool = read("sigma-supervise-pool.1");
    assert!(pool.contains(r"\-\-preload"), "{pool}");
    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    // The hidden subcommands get no page.
    assert_eq!(
        names,
        [
            "sigma-supervise-doctor.1",
            "sigma-supervise-pool.1",
            "sigma-supervise-publish.1",
            "sigma-supervise.1"
        ]
    );
}

#[test]
fn the_generators_stay_out_of_help() {
    let help = generated(&["--help"]);
    assert!(help.contains("publish"), "{help}");
    assert!(!help.contains("generate-"), "{help}");
}
