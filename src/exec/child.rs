//! What a child starts with, built the same way for runs and sessions: its environment, in
//! layers, and its confinement ([`Jail`]).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::env as cenv;
use crate::egress::Endpoint;
use crate::sandbox::{Jail, Lease, Sandbox};
use crate::venv::Venv;

/// Check a caller's variables before anything is started: names must be non-empty and hold
/// neither `=` nor NUL, values no NUL.
pub fn check_caller_env(vars: &BTreeMap<String, String>) -> Result<(), cenv::EnvError> {
    for (k, v) in vars {
        cenv::validate_name(k).and_then(|_| cenv::validate_value(k, v))?;
    }
    Ok(())
}

/// A child's environment in two layers, kept apart until the spawn: what the server builds,
/// and what the caller asked for (which must reach only the final program, after
/// confinement).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChildEnv {
    /// The allowlist (PATH, HOME, locale, TERM), TMPDIR and the language's own variables.
    pub server: Vec<(String, String)>,
    /// The caller's variables (validated), applied over the server's.
    pub caller: Vec<(String, String)>,
}

impl ChildEnv {
    /// Both layers as one list, a caller's variable replacing the server's of that name.
    pub fn merged(&self) -> Vec<(String, String)> {
        let mut env = self.server.clone();
        for (k, v) in &self.caller {
            cenv::set(&mut env, k, v.clone());
        }
        env
    }
}

/// The environment and confinement of a run's or a session's processes.
#[derive(Debug, Clone)]
pub struct Child {
    pub env: ChildEnv,
    pub jail: Jail,
}

impl Child {
    /// Give it its way to the egress proxy: the endpoint in its Jail, and the proxy
    /// variables (both spellings) that HTTP clients, pip and npm read, with the endpoint's
    /// credentials in the URL (it refuses connections without them).
    pub fn with_egress(mut self, endpoint: Option<Arc<Endpoint>>) -> Self {
        let Some(ep) = endpoint else {
            return self;
        };
        let url = ep.proxy_url();
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
            cenv::set(&mut self.env.server, k, url.clone());
            cenv::set(&mut self.env.server, &k.to_ascii_lowercase(), url.clone());
        }
        self.jail.egress = Some(ep);
        self
    }

    /// Give it its packages: directories readable to it (its layer, the store of shared
    /// layers), and the variables that name them (PYTHONPATH, NODE_PATH) set by the server.
    pub fn with_packages(mut self, layer: Option<PackagesView>) -> Self {
        let Some((dirs, vars)) = layer else {
            return self;
        };
        for (k, v) in vars {
            // In front of a search path set already (code mode's module), not instead.
            let v = match self.env.server.iter().find(|(n, _)| *n == k) {
                Some((_, old)) if !old.is_empty() => format!("{v}:{old}"),
                _ => v,
            };
            cenv::set(&mut self.env.server, &k, v);
        }
        self.jail.ro.extend(dirs);
        self
    }

    /// Give it its way to its MCP tools (code mode): the channel's directory readable, and
    /// the variables by which each language's module (and `replbox-tool`) finds it.
    pub fn with_tools(mut self, channel: Option<&crate::upstream::Channel>) -> Self {
        let Some(c) = channel else {
            return self;
        };
        let path = self
            .env
            .server
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(cenv::server_path);
        for (k, v) in c.env(&path) {
            cenv::set(&mut self.env.server, &k, v);
        }
        self.jail.ro.push(c.dir().to_path_buf());
        self
    }
}

/// The directories a program reads its packages from, and the variables naming them.
pub type PackagesView = (Vec<PathBuf>, Vec<(String, String)>);

/// Builds a [`Child`]: its home (HOME and TMPDIR, writable), the interpreter it runs, the
/// other directories it may write or read, its CPU limit, and the two environment layers.
pub struct ChildBuilder<'a> {
    sandbox: &'a Sandbox,
    home: PathBuf,
    lease: Option<&'a Lease>,
    exes: Vec<PathBuf>,
    /// A virtual environment to run in (its directory).
    venv: Option<PathBuf>,
    rw: Vec<PathBuf>,
    ro: Vec<PathBuf>,
    opened: Vec<(PathBuf, Arc<OwnedFd>)>,
    cpu_s: Option<u64>,
    language: Vec<(String, String)>,
    caller: Vec<(String, String)>,
}

impl<'a> ChildBuilder<'a> {
    /// A child running as `lease`'s uid (when the server is root), at home in `home`.
    pub fn new(sandbox: &'a Sandbox, lease: Option<&'a Lease>, home: &Path) -> Self {
        Self {
            sandbox,
            home: home.to_path_buf(),
            lease,
            exes: Vec::new(),
            venv: None,
            rw: vec![home.to_path_buf()],
            ro: Vec::new(),
            opened: Vec::new(),
            cpu_s: None,
            language: Vec::new(),
            caller: Vec::new(),
        }
    }

    /// The interpreter's executables: their directories go first on PATH, so that the tools
    /// it runs (a compiler, a package manager) come from the same installation, and their
    /// installation prefixes are readable where the level would hide them.
    pub fn interpreters(mut self, exes: &[&Path]) -> Self {
        self.exes.extend(exes.iter().map(|e| e.to_path_buf()));
        self
    }

    /// Run in the Python virtual environment `v`, as activating it would: its `bin/` first
    /// on PATH and `VIRTUAL_ENV` set; what it exposes (the environment and the interpreter
    /// it links to, as `venv::inspect` decided) readable where the level would hide it, the
    /// caller's directories from the handles opened when they were decided.
    pub fn venv(mut self, v: &Venv) -> Self {
        self.venv = Some(v.root.clone());
        self.ro.extend(v.expose.iter().cloned());
        self.opened.extend(v.opened.iter().cloned());
        self
    }

    /// A caller's directory it may write (a session's `cwd`), shown from `fd`, the handle
    /// opened as the session's uid when it was decided.
    pub fn caller_dir(mut self, path: &Path, fd: Arc<OwnedFd>) -> Self {
        self.rw.push(path.to_path_buf());
        self.opened.push((path.to_path_buf(), fd));
        self
    }

    /// Host trees the language's programs read besides its installation (its `reads`),
    /// readable where the view does not show them.
    pub fn language_reads(mut self, reads: &[String]) -> Self {
        let extra = self.sandbox.language_reads(reads);
        self.ro.extend(extra);
        self
    }

    /// More directories it may write (after its home).
    pub fn writable(mut self, dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        self.rw.extend(dirs);
        self
    }

    /// Directories it may read that the level would otherwise hide.
    pub fn readable(mut self, dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        self.ro.extend(dirs);
        self
    }

    /// RLIMIT_CPU, in seconds (runs only).
    pub fn cpu_limit(mut self, seconds: u64) -> Self {
        self.cpu_s = Some(seconds);
        self
    }

    /// The language's own variables (placeholders already expanded), over the allowlist.
    pub fn language_env(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        self.language.extend(vars);
        self
    }

    /// The caller's variables: a layer of their own, never mixed into the server's.
    pub fn caller_env(mut self, vars: &BTreeMap<String, String>) -> Self {
        self.caller = vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        self
    }

    pub fn build(self) -> Child {
        let mut server = cenv::base_env(&self.home, "dumb");
        let mut bins: Vec<&Path> = Vec::new();
        let venv_bin = self.venv.as_ref().map(|v| v.join("bin"));
        for bin in venv_bin
            .as_deref()
            .into_iter()
            .chain(self.exes.iter().filter_map(|e| e.parent()))
        {
            if !bins.contains(&bin) {
                bins.push(bin);
            }
        }
        if !bins.is_empty() {
            let mut path = String::new();
            for bin in bins {
                path.push_str(&bin.display().to_string());
                path.push(':');
            }
            path.push_str(&cenv::server_path());
            cenv::set(&mut server, "PATH", path);
        }
        cenv::set(&mut server, "TMPDIR", self.home.display().to_string());
        for (k, v) in self.language {
            cenv::set(&mut server, &k, v);
        }
        if let Some(v) = &self.venv {
            cenv::set(&mut server, "VIRTUAL_ENV", v.display().to_string());
        }
        let mut ro = self.ro;
        for exe in &self.exes {
            for d in self.sandbox.interpreter_dirs(exe) {
                if !ro.contains(&d) {
                    ro.push(d);
                }
            }
        }
        let jail = Jail {
            uid: self.lease.map(|l| l.uid),
            rw: self.rw,
            ro,
            opened: self.opened,
            cpu_s: self.cpu_s,
            egress: None,
            dirty: self.lease.map(|l| l.dirty_flag()),
        };
        Child {
            env: ChildEnv {
                server,
                caller: self.caller,
            },
            jail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caller_layer_stays_apart_and_wins() {
        let env = ChildEnv {
            server: vec![("PATH".into(), "/bin".into()), ("HOME".into(), "/h".into())],
            caller: vec![
                ("HOME".into(), "/x".into()),
                ("GREETING".into(), "hi".into()),
            ],
        };
        assert_eq!(
            env.merged(),
            vec![
                ("PATH".to_string(), "/bin".to_string()),
                ("HOME".to_string(), "/x".to_string()),
                ("GREETING".to_string(), "hi".to_string()),
            ]
        );
    }
}
