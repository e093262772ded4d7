//! procd's side of the contract, read and checked: `PID PROG true|false ARGS…` and the
//! environment σOS made (`SIGMACONFIG`, `SIGMAPRINCIPAL`, ...). Everything here is input from
//! outside: a malformed value is a one-line error, never a panic.
#![forbid(unsafe_code)]

use anyhow::{anyhow, bail};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;

/// Longest SIGMAPRINCIPAL accepted (its frame's length is an i32).
const MAX_PRINCIPAL: usize = 64 << 10;

/// One proc as procd asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contract {
    /// σOS's pid of the proc (for messages).
    pub pid: String,
    /// `/mnt/binfs/<name>-v<version>`, as given.
    pub prog: PathBuf,
    /// The program's name without its version: `sleeper`, `hello.py`, `python3`.
    pub name: String,
    /// Hand the proc a dialproxy connection (`true`).
    pub dialproxy: bool,
    pub args: Vec<OsString>,
    /// `SIGMAPRINCIPAL`, checked when `dialproxy`.
    pub principal: Option<String>,
    /// The proc's σOS realm (`realmStr` of SIGMACONFIG), empty if it names none.
    pub realm: String,
    /// SIGMACONFIG's `useSPProxy`: σOS's own client in the proc dials spproxyd's socket.
    pub use_spproxy: bool,
}

/// `args` is what follows the trampoline's name (`PID PROG true|false ARGS…`); `env` reads
/// one variable of the environment.
pub fn parse(
    args: &[OsString],
    env: impl Fn(&str) -> Option<OsString>,
) -> anyhow::Result<Contract> {
    let usage = "usage: uproc-trampoline PID PROG true|false [ARGS...]";
    let [pid, prog, dialproxy, rest @ ..] = args else {
        bail!(
            "expected at least 3 arguments, got {} ({usage})",
            args.len()
        );
    };
    let pid = pid
        .to_str()
        .filter(|p| {
            !p.is_empty()
                && p.len() <= 256
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
        .ok_or_else(|| anyhow!("PID {pid:?} is not a σOS pid (letters, digits, `._-`)"))?
        .to_owned();
    let prog = PathBuf::from(prog);
    if !prog.is_absolute() {
        bail!("PROG {} is not an absolute path ({usage})", prog.display());
    }
    let file = prog
        .file_name()
        .filter(|_| !prog.as_os_str().as_bytes().ends_with(b"/"))
        .ok_or_else(|| anyhow!("PROG {} names no file", prog.display()))?;
    let name = program_name(file)?;
    let dialproxy = match dialproxy.to_str() {
        Some("true") => true,
        Some("false") => false,
        _ => bail!("the third argument {dialproxy:?} is neither true nor false ({usage})"),
    };
    let config = env(spproxy::procenv::SIGMACONFIG)
        .ok_or_else(|| anyhow!("SIGMACONFIG is not set (procd sets it for every proc)"))?;
    let config = config
        .to_str()
        .ok_or_else(|| anyhow!("SIGMACONFIG is not UTF-8"))?;
    let pe = spproxy::procenv::from_json(config).map_err(|e| anyhow!("{e}"))?;
    let (realm, use_spproxy) = (pe.realm_str, pe.use_sp_proxy);
    let principal = if dialproxy {
        let p = env("SIGMAPRINCIPAL").ok_or_else(|| {
            anyhow!("SIGMAPRINCIPAL is not set (the dialproxy handshake needs it)")
        })?;
        let p = p
            .into_string()
            .map_err(|_| anyhow!("SIGMAPRINCIPAL is not UTF-8"))?;
        if p.is_empty() || p.len() > MAX_PRINCIPAL {
            bail!("SIGMAPRINCIPAL is empty or longer than {MAX_PRINCIPAL} bytes");
        }
        Some(p)
    } else {
        None
    };
    Ok(Contract {
        pid,
        prog,
        name,
        dialproxy,
        args: rest.to_vec(),
        principal,
        realm,
        use_spproxy,
    })
}

/// binfs's `<name>-v<version>` without the version (a name with no `-v<digit>…` is kept
/// whole). The name becomes a file name in the jail: UTF-8, no control characters.
fn program_name(file: &OsStr) -> anyhow::Result<String> {
    let s = file
        .to_str()
        .filter(|s| !s.chars().any(char::is_control))
        .ok_or_else(|| anyhow!("PROG's file name {file:?} is not printable UTF-8"))?;
    let name = match s.rfind("-v") {
        Some(i) if s[i + 2..].starts_with(|c: char| c.is_ascii_digit()) => &s[..i],
        _ => s,
    };
    if name.is_empty() || name == "." || name == ".." {
        bail!("PROG's file name {s:?} names no program");
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn env_with(
        config: Option<&str>,
        principal: Option<&str>,
    ) -> impl Fn(&str) -> Option<OsString> {
        let (c, p) = (config.map(OsString::from), principal.map(OsString::from));
        move |k| match k {
            "SIGMACONFIG" => c.clone(),
            "SIGMAPRINCIPAL" => p.clone(),
            _ => None,
        }
    }

    const CONFIG: &str = r#"{"pidStr":"p-1","realmStr":"rootrealm"}"#;

    #[test]
    fn the_contract_parses() {
        let c = parse(
            &os(&[
                "sleeper-ab12",
                "/mnt/binfs/sleeper-v1.0",
                "true",
                "1000us",
                "-x",
            ]),
            env_with(Some(CONFIG), Some(r#"{"id":"p"}"#)),
        )
        .unwrap();
        assert_eq!(c.pid, "sleeper-ab12");
        assert_eq!(c.name, "sleeper");
        assert!(c.dialproxy);
        assert_eq!(c.args, os(&["1000us", "-x"]));
        assert_eq!(c.principal.as_deref(), Some(r#"{"id":"p"}"#));
        assert_eq!(c.realm, "rootrealm");
        let c = parse(
            &os(&["p", "/b/hello.py-v1.0", "false"]),
            env_with(Some("{}"), None),
        )
        .unwrap();
        assert_eq!(
            (c.name.as_str(), c.dialproxy, c.principal),
            ("hello.py", false, None)
        );
    }

    #[test]
    fn names_lose_their_version_only() {
        assert_eq!(program_name("python3-v3.11".as_ref()).unwrap(), "python3");
        assert_eq!(program_name("dev-vm".as_ref()).unwrap(), "dev-vm");
        assert_eq!(program_name("tool".as_ref()).unwrap(), "tool");
        assert!(program_name("-v1".as_ref()).is_err());
        assert!(program_name("a\nb".as_ref()).is_err());
    }

    #[test]
    fn malformed_input_is_one_line() {
        // (argv, SIGMACONFIG, SIGMAPRINCIPAL, what the error says)
        type Case<'a> = (Vec<&'a str>, Option<&'a str>, Option<&'a str>, &'a str);
        let cases: Vec<Case> = vec![
            (vec![], Some(CONFIG), None, "at least 3"),
            (vec!["p", "/b/x-v1"], Some(CONFIG), None, "at least 3"),
            (
                vec!["p/../x", "/b/x-v1", "false"],
                Some(CONFIG),
                None,
                "not a σOS pid",
            ),
            (
                vec!["", "/b/x-v1", "false"],
                Some(CONFIG),
                None,
                "not a σOS pid",
            ),
            (vec!["p", "x-v1", "false"], Some(CONFIG), None, "absolute"),
            (
                vec!["p", "/b/", "false"],
                Some(CONFIG),
                None,
                "names no file",
            ),
            (
                vec!["p", "/b/x-v1", "yes"],
                Some(CONFIG),
                None,
                "neither true nor false",
            ),
            (
                vec!["p", "/b/x-v1", "false"],
                None,
                None,
                "SIGMACONFIG is not set",
            ),
            (
                vec!["p", "/b/x-v1", "false"],
                Some("{nope"),
                None,
                "SIGMACONFIG",
            ),
            (
                vec!["p", "/b/x-v1", "true"],
                Some(CONFIG),
                None,
                "SIGMAPRINCIPAL",
            ),
            (
                vec!["p", "/b/x-v1", "true"],
                Some(CONFIG),
                Some(""),
                "SIGMAPRINCIPAL",
            ),
        ];
        for (args, config, principal, want) in cases {
            let e = parse(&os(&args), env_with(config, principal))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{args:?}: {e}");
            assert!(!e.contains('\n'), "{args:?}: {e}");
        }
    }
}
