//! The environment a proc gets: the supervisor's credentials stay with it. A variable whose
//! name says it holds a credential ([`is_credential`](crate::env::is_credential)) or whose value is a URL with a password
//! ([`carries_password`](crate::env::carries_password)) is withheld unless the user hands it through by name.
#![forbid(unsafe_code)]

/// Whether an environment variable's name says it holds a credential (or leads to one): `AWS_*`,
/// and any name with TOKEN, SECRET, PASS (PASSWORD, PASSWD, PASSPHRASE, SMTP_PASS), CREDENTIAL,
/// AUTH, ACCESS_KEY, APIKEY or COOKIE in it, a word PWD, PAT or DSN (`MYSQL_PWD`, `GITHUB_PAT`,
/// `SENTRY_DSN`; not the working directory's `PWD`/`OLDPWD`), or ending in `_KEY` (API keys),
/// case-insensitively. Such variables stay with the supervisor.
pub fn is_credential(name: &[u8]) -> bool {
    let up = name.to_ascii_uppercase();
    let has = |w: &[u8]| up.windows(w.len()).any(|x| x == w);
    let word = |w: &[u8]| up.split(|&b| b == b'_').any(|x| x == w);
    up.starts_with(b"AWS_")
        || up.ends_with(b"_KEY")
        || [
            &b"TOKEN"[..],
            b"SECRET",
            b"PASS",
            b"CREDENTIAL",
            b"AUTH",
            b"ACCESS_KEY",
            b"APIKEY",
            b"COOKIE",
        ]
        .iter()
        .any(|w| has(w))
        || (up != b"PWD"
            && up != b"OLDPWD"
            && [&b"PWD"[..], b"PAT", b"DSN"].iter().any(|w| word(w)))
}

/// Whether an environment variable's value carries a password in a URL's user part
/// (`postgres://admin:pw@db/x`, `http://user:pw@proxy:3128`): withheld whatever its name.
pub fn carries_password(value: &[u8]) -> bool {
    let Some(at) = value.windows(3).position(|w| w == b"://") else {
        return false;
    };
    let rest = &value[at + 3..];
    let authority = rest
        .split(|&b| b == b'/' || b == b'?' || b == b'#')
        .next()
        .unwrap_or_default();
    match authority.iter().rposition(|&b| b == b'@') {
        Some(i) => authority[..i].contains(&b':'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_names() {
        for n in [
            "AWS_SECRET_ACCESS_KEY",
            "GITHUB_TOKEN",
            "gh_token",
            "DB_PASSWORD",
            "PGPASSWORD",
            "OPENAI_API_KEY",
            "AZURE_CLIENT_SECRET",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "SSH_AUTH_SOCK",
            "XAUTHORITY",
            "MINIO_ACCESS_KEY_ID",
            "GPG_PASSPHRASE",
            "SMTP_PASS",
            "MYSQL_PWD",
            "GITHUB_PAT",
            "SENTRY_DSN",
            "OPENAI_APIKEY",
            "SESSION_COOKIE",
        ] {
            assert!(is_credential(n.as_bytes()), "{n}");
        }
        for v in [
            "postgres://admin:hunter2@db:5432/app",
            "http://u:pw@proxy:3128",
            "redis://:pw@cache/0",
        ] {
            assert!(carries_password(v.as_bytes()), "{v}");
        }
        for v in [
            "https://example.invalid/a:b@c",
            "postgres://db/app",
            "ssh://git@host/repo",
            "/usr/bin:/bin",
            "http://proxy:3128",
        ] {
            assert!(!carries_password(v.as_bytes()), "{v}");
        }
        for n in [
            "PATH",
            "HOME",
            "PYTHONPATH",
            "LANG",
            "TERM",
            "SIGMA_SPPROXY_FD",
            "KEYBOARD",
            "PWD",
            "OLDPWD",
            "PATH_INFO",
            "DISPLAY",
        ] {
            assert!(!is_credential(n.as_bytes()), "{n}");
        }
    }
}
