//! The profile file as written: what TOML deserializes into, with the spans that errors
//! point at. Unknown keys are refused (`deny_unknown_fields`), so a typo is an error.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    pub(super) name: Spanned<String>,
    #[serde(default)]
    pub(super) description: String,
    pub(super) default: Spanned<RawDefault>,
    #[serde(default)]
    pub(super) syscall: Vec<Spanned<RawSyscall>>,
    #[serde(default)]
    pub(super) path: Vec<Spanned<RawPath>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefault {
    pub(super) action: Spanned<String>,
    pub(super) errno: Option<Spanned<RawErrno>>,
    pub(super) log: Option<Spanned<bool>>,
    pub(super) reason: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSyscall {
    pub(super) name: Spanned<String>,
    pub(super) action: Spanned<String>,
    pub(super) errno: Option<Spanned<RawErrno>>,
    pub(super) reason: Option<Spanned<String>>,
    pub(super) origin: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) when: Vec<Spanned<RawCmp>>,
    pub(super) needs: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCmp {
    pub(super) arg: u32,
    pub(super) op: String,
    pub(super) value: u64,
    pub(super) mask: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPath {
    pub(super) prefix: Spanned<String>,
    pub(super) action: Spanned<String>,
    pub(super) errno: Option<Spanned<RawErrno>>,
    pub(super) dir: Option<Spanned<String>>,
    pub(super) reason: Option<Spanned<String>>,
}

/// `errno = "EPERM"` or `errno = 1`.
pub(super) enum RawErrno {
    Number(i64),
    Name(String),
}

impl<'de> Deserialize<'de> for RawErrno {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawErrno;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an errno name such as \"EPERM\" or a number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawErrno, E> {
                Ok(RawErrno::Number(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawErrno, E> {
                Ok(RawErrno::Number(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawErrno, E> {
                Ok(RawErrno::Name(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}
