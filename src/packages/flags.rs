//! The operator's package settings (a leaf: `config` flattens them into its flags).

use std::ffi::OsString;
use std::path::PathBuf;

// 1/0, yes/no, on/off as well as true/false for a switch's variable (see `config`).
use clap::builder::BoolishValueParser;

use crate::sandbox::Level;

/// Packages on demand: what `packages` and `%pip install` may get.
#[derive(clap::Args, Debug, Clone, Default)]
#[group(id = "package-flags")]
pub struct Flags {
    /// Turn packages off: `packages` and `%pip install` are refused.
    #[arg(long, env = "REPLBOX_NO_PACKAGES", value_parser = BoolishValueParser::new())]
    pub no_packages: bool,

    /// Python index the installer uses: `pypi` (pypi.org and files.pythonhosted.org, the
    /// default) or the URL of a simple index, reached whatever it resolves to.
    #[arg(long, env = "REPLBOX_PACKAGE_INDEX", value_name = "pypi|URL")]
    pub package_index: Option<String>,

    /// The shared package cache (default: /var/cache/replbox/packages as root, else
    /// $XDG_CACHE_HOME/replbox/packages or ~/.cache/replbox/packages).
    #[arg(long, env = "REPLBOX_PACKAGE_CACHE", value_name = "DIR")]
    pub package_cache: Option<PathBuf>,

    /// The most the shared cache may hold, in MiB (default: no cap). Past it, the
    /// packages used least recently are evicted, never one a running installation or a
    /// live session's or run's packages use.
    #[arg(long, env = "REPLBOX_PACKAGE_CACHE_MB", value_name = "MIB")]
    pub package_cache_mb: Option<u64>,

    /// The uid (and gid) the installer runs as when the server runs as root; it alone
    /// writes the cache (default: --uid-base minus 1).
    #[arg(long, env = "REPLBOX_INSTALLER_UID", value_name = "UID")]
    pub installer_uid: Option<u32>,

    /// Longest one installation may take, in seconds (default 300).
    #[arg(long, env = "REPLBOX_PACKAGE_TIMEOUT_S")]
    pub package_timeout_s: Option<u64>,

    /// The `uv` binary (default: beside the Python sessions run, else on PATH).
    #[arg(long, env = "REPLBOX_UV", value_name = "PATH")]
    pub uv: Option<PathBuf>,

    /// npm registry the JavaScript installer uses: `npmjs` (registry.npmjs.org, the
    /// default) or the URL of a registry, reached whatever it resolves to.
    #[arg(long, env = "REPLBOX_NPM_REGISTRY", value_name = "npmjs|URL")]
    pub npm_registry: Option<String>,

    /// npm's `npm-cli.js`, run by the sessions' node (default: the `npm` on PATH, else the
    /// one installed beside node).
    #[arg(long, env = "REPLBOX_NPM", value_name = "PATH")]
    pub npm: Option<PathBuf>,

    /// Let the Python installer build a package the index has only as source (an sdist)
    /// when no wheel fits. Its build code runs confined as the installer's uid (never
    /// root), with a throwaway cache of its own and the index as its only network; what it
    /// builds goes into the asking run's or session's own packages, never the shared cache
    /// or layers. Needs the sandbox level bwrap (at landlock or none the server does not
    /// start). Default: wheels only.
    #[arg(long, env = "REPLBOX_PACKAGE_BUILDS", value_parser = BoolishValueParser::new())]
    pub package_builds: bool,
}

/// Where an index is, as the installer's egress policy needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// What the installer is given (`--index-url`).
    pub url: String,
    /// Names reached at public addresses only (the public indexes).
    pub domains: Vec<String>,
    /// An operator's own host, reached whatever it resolves to.
    pub host: Option<(String, u16)>,
}

/// The public Python index.
const PYPI: &str = "https://pypi.org/simple";
/// The public npm registry.
const NPMJS: &str = "https://registry.npmjs.org/";

impl Flags {
    /// The Python index in force.
    pub fn python_index(&self) -> Result<Index, FlagError> {
        index(
            "--package-index",
            self.package_index.as_deref(),
            ("pypi", PYPI, &["pypi.org", "files.pythonhosted.org"]),
        )
    }

    /// The npm registry in force.
    pub fn npm_registry(&self) -> Result<Index, FlagError> {
        index(
            "--npm-registry",
            self.npm_registry.as_deref(),
            ("npmjs", NPMJS, &["registry.npmjs.org"]),
        )
    }

    /// The flags that give another process these settings.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        if self.no_packages {
            a.push("--no-packages".into());
        }
        if let Some(v) = &self.package_index {
            a.extend(["--package-index".into(), v.into()]);
        }
        if let Some(v) = &self.package_cache {
            a.extend(["--package-cache".into(), v.into()]);
        }
        if let Some(m) = self.package_cache_mb {
            a.extend(["--package-cache-mb".into(), m.to_string().into()]);
        }
        if let Some(u) = self.installer_uid {
            a.extend(["--installer-uid".into(), u.to_string().into()]);
        }
        if let Some(t) = self.package_timeout_s {
            a.extend(["--package-timeout-s".into(), t.to_string().into()]);
        }
        if let Some(v) = &self.uv {
            a.extend(["--uv".into(), v.into()]);
        }
        if let Some(v) = &self.npm_registry {
            a.extend(["--npm-registry".into(), v.into()]);
        }
        if let Some(v) = &self.npm {
            a.extend(["--npm".into(), v.into()]);
        }
        if self.package_builds {
            a.push("--package-builds".into());
        }
        a
    }

    /// Check the values a server cannot run with.
    pub fn check(&self) -> Result<(), FlagError> {
        self.python_index()?;
        self.npm_registry()?;
        if self.package_cache_mb == Some(0) {
            return Err(FlagError::CacheMb);
        }
        if self.package_timeout_s == Some(0) {
            return Err(FlagError::Timeout);
        }
        Ok(())
    }

    /// Check the flags against the sandbox level in force. Build code is the package's
    /// own and runs as the installer's uid, which owns the shared cache and every layer:
    /// only bwrap keeps those out of its sight. Landlock does not control chmod, so there
    /// it could make them unreadable for every principal; at none nothing confines it.
    pub fn check_level(&self, level: Level) -> Result<(), FlagError> {
        if self.package_builds && level != Level::Bwrap {
            return Err(FlagError::BuildsNeedBwrap(level));
        }
        Ok(())
    }
}

/// A package flag the server cannot run with: the operator's to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("{flag}: {value:?} is neither {short} nor an http(s) URL")]
    NotUrl {
        flag: &'static str,
        value: String,
        short: &'static str,
    },
    #[error("{flag}: {value:?}: only http and https URLs")]
    Scheme { flag: &'static str, value: String },
    #[error("{flag}: {value:?}: credentials in the URL are not supported")]
    Credentials { flag: &'static str, value: String },
    #[error("{flag}: {value:?}: bad port")]
    Port { flag: &'static str, value: String },
    #[error("{flag}: {value:?}: no host name")]
    Host { flag: &'static str, value: String },
    #[error("--package-cache-mb must be at least 1 (leave it out for no cap)")]
    CacheMb,
    #[error("--package-timeout-s must be at least 1")]
    Timeout,
    #[error(
        "--package-builds needs the sandbox level bwrap, and this server's is {0}: a build runs \
         the package's own code as the installer's uid, which owns the shared package cache \
         and every run's and session's packages, and {why}. Run with --sandbox bwrap (bwrap \
         installed and working), or drop --package-builds (wheels only)",
        why = unconfined(*.0)
    )]
    BuildsNeedBwrap(Level),
}

/// What a build's code could do at `level` (below bwrap), for [`FlagError::BuildsNeedBwrap`].
fn unconfined(level: Level) -> &'static str {
    match level {
        Level::None => "at level none nothing confines that code",
        _ => {
            "Landlock does not control chmod, so that code could make them unreadable for \
             every caller until the server restarts"
        }
    }
}

/// `value` (a public index's short name, else a URL) as an [`Index`].
fn index(
    flag: &'static str,
    value: Option<&str>,
    (short, url, domains): (&'static str, &str, &[&str]),
) -> Result<Index, FlagError> {
    let v = value.map(str::trim).unwrap_or(short);
    if v == short {
        return Ok(Index {
            url: url.to_string(),
            domains: domains.iter().map(|d| d.to_string()).collect(),
            host: None,
        });
    }
    let (scheme, rest) = v.split_once("://").ok_or_else(|| FlagError::NotUrl {
        flag,
        value: v.into(),
        short,
    })?;
    let default_port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => {
            return Err(FlagError::Scheme {
                flag,
                value: v.into(),
            });
        }
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(FlagError::Credentials {
            flag,
            value: v.into(),
        });
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (
            h,
            p.parse::<u16>().map_err(|_| FlagError::Port {
                flag,
                value: v.into(),
            })?,
        ),
        _ => (authority, default_port),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty()
        || !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':'))
    {
        return Err(FlagError::Host {
            flag,
            value: v.into(),
        });
    }
    Ok(Index {
        url: v.to_string(),
        domains: Vec::new(),
        host: Some((host.to_ascii_lowercase(), port)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_flag_and_value() {
        let f = |v: &str| Flags {
            package_index: Some(v.into()),
            ..Flags::default()
        };
        assert_eq!(
            f("pip").check().unwrap_err().to_string(),
            "--package-index: \"pip\" is neither pypi nor an http(s) URL"
        );
        assert_eq!(
            f("http://u:p@h/").check().unwrap_err().to_string(),
            "--package-index: \"http://u:p@h/\": credentials in the URL are not supported"
        );
        let f = Flags {
            package_timeout_s: Some(0),
            ..Flags::default()
        };
        assert_eq!(
            f.check().unwrap_err().to_string(),
            "--package-timeout-s must be at least 1"
        );
    }

    #[test]
    fn builds_need_bwrap() {
        let builds = Flags {
            package_builds: true,
            ..Flags::default()
        };
        assert_eq!(builds.check_level(Level::Bwrap), Ok(()));
        for level in [Level::Landlock, Level::None] {
            let e = builds.check_level(level).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!(
                    "--package-builds needs the sandbox level bwrap, and this server's is {level}:"
                )),
                "{e}"
            );
            assert!(
                e.ends_with("Run with --sandbox bwrap (bwrap installed and working), or drop --package-builds (wheels only)"),
                "{e}"
            );
        }
        assert!(
            builds
                .check_level(Level::Landlock)
                .unwrap_err()
                .to_string()
                .contains("Landlock does not control chmod")
        );
        for level in [Level::Bwrap, Level::Landlock, Level::None] {
            assert_eq!(Flags::default().check_level(level), Ok(()));
        }
    }

    #[test]
    fn indexes_are_the_public_ones_or_an_operators_url() {
        let f = Flags::default();
        let py = f.python_index().unwrap();
        assert_eq!(py.url, PYPI);
        assert_eq!(py.domains, ["pypi.org", "files.pythonhosted.org"]);
        assert_eq!(f.npm_registry().unwrap().domains, ["registry.npmjs.org"]);
        let f = Flags {
            package_index: Some("http://10.0.0.5:8080/simple".into()),
            ..Flags::default()
        };
        assert_eq!(
            f.python_index().unwrap().host,
            Some(("10.0.0.5".into(), 8080))
        );
        for bad in [
            "ftp://x/simple",
            "pypi.org",
            "https://user:pw@x/simple",
            "https:///x",
        ] {
            let f = Flags {
                package_index: Some(bad.into()),
                ..Flags::default()
            };
            assert!(f.check().is_err(), "{bad}");
        }
    }
}
