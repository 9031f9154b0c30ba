//! The warm pool's interpreters for `run-code`: per language (those whose file has a
//! `[run.pool]` section) a few started ahead of time, each in its own private run directory,
//! each used for one run and then gone.
//!
//! A pooled interpreter is an ordinary child: it is spawned through `exec::spawn` (so under
//! the helper, with the run's environment and directory, like any cold run) running the
//! language's loader, which waits on stdin for one request and then runs the program the
//! way the language's `run.command` would (see [`request`] for the format). The books
//! (which are ready, how many are starting) are [`Pool`]'s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::supervise::pipes;
use super::{Place, RunRequest, Runner};
use crate::exec::{self, Proc};
use crate::lang::{Language, PoolSpec, Registry, expand_command};
use crate::pool::{Pool, Ready};
use crate::sandbox::{Holder, Reclaim};

/// A pooled interpreter waiting for its program. Dropping it kills its tree (the helper
/// tears it down on SIGTERM) and removes its directory.
pub struct Warm {
    pub proc: Proc,
    /// Where it runs: its private directory (the run's directory once it is used) and its
    /// uid. Dropped after `proc`, so the uid is returned once its processes are gone.
    pub place: Place,
    pub born: Instant,
}

impl Ready for Warm {
    fn ended(&mut self) -> bool {
        !matches!(self.proc.child.try_wait(), Ok(None))
    }

    fn born(&self) -> Instant {
        self.born
    }

    fn pid(&self) -> u32 {
        self.proc.pid
    }
}

/// The warm pools of `run-code`.
pub type WarmPool = Pool<Warm>;

/// A pooled interpreter is only a head start: when every uid is in use, one is stopped to
/// give its uid to a caller's session or run rather than make the caller wait or fail.
impl Reclaim for WarmPool {
    /// Pooled interpreters hold unbound uids (bound to no principal): any caller may take one.
    fn reclaim<'a>(
        &'a self,
        _principal: &'a str,
        _own: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let Some(mut w) = self.take_any() else {
                return false;
            };
            tracing::info!(
                pid = w.proc.pid,
                "stopping a pooled interpreter: its uid is needed"
            );
            w.proc.kill_tree().await;
            let Warm { proc, place, .. } = w;
            drop(proc);
            // Its directory removed and its uid returned before the caller leases again.
            place.release().await;
            true
        })
    }
}

/// How often the pools are kept (see [`Runner::fill_pools`]).
const UPKEEP: Duration = Duration::from_secs(15);

/// The longest a run waits for a pooled interpreter being started (it is further along than
/// a cold start begun then), and at most a quarter of its timeout.
const PATIENCE: Duration = Duration::from_secs(2);

impl Runner {
    /// Whether a pooled interpreter can run this request exactly as a cold start would.
    pub(super) fn poolable(&self, lang: &Language, req: &RunRequest, cpu_s: u64) -> bool {
        let Some(p) = &lang.spec.run.pool else {
            return false;
        };
        self.pool.enabled()
            && self.sandbox.can_prestart()
            && lang.spec.run.compile.is_none()
            // Pooled interpreters start with a CPU limit they can only lower.
            && (cpu_s == self.pool_cpu_limit(p) || p.sets_cpu_limit && cpu_s < self.pool_cpu_limit(p))
            // NUL cannot be passed to a cold start either; let it fail the cold way.
            && !req.code.contains('\0')
            && !req.args.iter().any(|a| a.contains('\0'))
            // A virtual environment is checked as the run's own uid and has its own python.
            && req.venv.is_none()
            // The way to the egress proxy is each run's own, made when it starts.
            && self.sandbox.egress.is_none()
            // So is the way to its MCP tools (code mode), with the variables that find it.
            && req.mcp_servers.is_empty()
            // A run's packages are a directory of its own on its PYTHONPATH.
            && req.packages.is_empty()
            && !req
                .env
                .keys()
                .any(|k| starts_differently(k, &p.cold_env))
    }

    /// Start filling the pools of every installed language that has one (`serve` does this
    /// once it is up; from then on every run refills what it used), and keep them: every
    /// [`UPKEEP`] idle pools shrink, expired interpreters are replaced, and pools held while
    /// user ids ran short are filled again.
    pub(crate) fn fill_pools(&self, registry: &Registry) {
        if !self.pool.enabled() {
            return;
        }
        if !self.sandbox.can_prestart() {
            tracing::info!(
                "no warm pool at sandbox level none as root: a run's uid is bound to its \
                 caller before the run starts"
            );
            return;
        }
        self.pool.activate();
        let pooled: Vec<Arc<Language>> = registry
            .all()
            .iter()
            .filter(|l| l.spec.run.pool.is_some())
            .cloned()
            .collect();
        for lang in pooled.iter().filter(|l| l.installed()) {
            self.refill(lang);
        }
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP);
            tick.tick().await;
            loop {
                tick.tick().await;
                if me.pool.is_closed() {
                    break;
                }
                me.pool.trim();
                for lang in pooled.iter().filter(|l| l.installed()) {
                    me.refill(lang);
                }
            }
        });
    }

    /// Start as many pooled interpreters of `lang` as it lacks, in the background (none
    /// while user ids run short).
    pub(crate) fn refill(&self, lang: &Arc<Language>) {
        if lang.spec.run.pool.is_none() {
            return;
        }
        self.pool.hold(self.sandbox.uids_short());
        self.pool.refill(lang.id(), || {
            let me = self.clone();
            let lang = lang.clone();
            async move { me.start_warm(&lang).await }
        });
    }

    /// Take a pooled interpreter for a run that a pool can honour; None (run cold) when there
    /// is none.
    pub(super) async fn take_warm(&self, lang: &Arc<Language>, req: &RunRequest) -> Option<Warm> {
        let patience = PATIENCE.min(req.timeout / 4);
        let w = self.pool.take_or_wait(lang.id(), patience).await?;
        if self.pool.ready_of(lang.id()) == 0 {
            // Demand outruns the pool: start its replacements now rather than after the run.
            self.refill(lang);
        }
        Some(w)
    }

    /// The CPU limit a pooled interpreter of `p` starts with: the largest a run can have when
    /// its loader lowers it to the run's, else the limit of a run with the default timeout
    /// (then only such runs are pooled).
    fn pool_cpu_limit(&self, p: &PoolSpec) -> u64 {
        if p.sets_cpu_limit {
            self.cpu_limit(self.max_timeout())
        } else {
            self.cpu_limit(self.config.timeout(None))
        }
    }

    /// Start one pooled interpreter: a fresh place, the environment of a run there (without
    /// any caller's variables), and the language's loader, through `exec::spawn` (so in the
    /// sandbox, as the run's uid) like every other child.
    async fn start_warm(&self, lang: &Language) -> Result<Option<Warm>, WarmError> {
        let Some(p) = &lang.spec.run.pool else {
            return Err(WarmError::NoPool);
        };
        if self.sandbox.uids_short() {
            // Not a failure: callers come first.
            return Ok(None);
        }
        let detected = lang
            .detect()
            .await
            .ok_or_else(|| WarmError::NotInstalled(lang.id().to_string()))?;
        if !self.sandbox.can_run(&detected.exe) {
            return Err(WarmError::CannotRun(
                self.sandbox.cannot_run_reason(&detected.exe),
            ));
        }
        let cpu_s = self.pool_cpu_limit(p);
        let place = match self
            .place(lang, &detected.exe, cpu_s, Holder::Nobody, false)
            .await
        {
            Ok(place) => place,
            // The lease checks for short uids again as it takes one (the check above can
            // be passed by several starts at once): not a failure either.
            Err(_) if self.sandbox.uids_short() => return Ok(None),
            Err(e) => return Err(WarmError::Place(e)),
        };
        let vars = place.vars(lang);
        let child = self.child(&place, lang, &BTreeMap::new());
        let mut with_loader = vars.to_vec();
        with_loader.push(("loader", p.loader.text.as_str()));
        // A copy of the loader for interpreters that take code from files only; the loader
        // removes it before the program exists.
        let loader_file = place.dir.path().join(loader_file_name(&p.loader.file));
        let loader_s = loader_file.display().to_string();
        if p.command.iter().any(|c| c.contains("{loader_file}")) {
            tokio::fs::write(&loader_file, &p.loader.text)
                .await
                .map_err(WarmError::Loader)?;
            with_loader.push(("loader_file", loader_s.as_str()));
        }
        let argv = expand_command(&p.command, &with_loader, &[]);
        let proc =
            exec::spawn(&self.sandbox, pipes(argv, &child, place.dir.path())).map_err(|error| {
                WarmError::Spawn {
                    exe: detected.exe.clone(),
                    error,
                }
            })?;
        Ok(Some(Warm {
            proc,
            place,
            born: Instant::now(),
        }))
    }
}

/// Why a pooled interpreter was not started (logged; runs start cold meanwhile).
#[derive(Debug, thiserror::Error)]
pub(super) enum WarmError {
    #[error("the language has no pool")]
    NoPool,
    #[error("{0} is not installed")]
    NotInstalled(String),
    /// The sandbox cannot run its interpreter (the sandbox's reason).
    #[error("{0}")]
    CannotRun(String),
    #[error(transparent)]
    Place(super::PlaceError),
    #[error("cannot write the pool's loader: {0}")]
    Loader(std::io::Error),
    #[error("cannot start {}: {error}", .exe.display())]
    Spawn {
        exe: std::path::PathBuf,
        error: std::io::Error,
    },
}

/// The name of the loader's copy in an interpreter's directory: `.replbox-pool` with the
/// extension of the language's loader file.
fn loader_file_name(source: &str) -> String {
    match std::path::Path::new(source).extension() {
        Some(ext) => format!(".replbox-pool.{}", ext.to_string_lossy()),
        None => ".replbox-pool".to_string(),
    }
}

/// The request a pooled interpreter reads on stdin: the decimal length of the payload and a
/// newline, then the payload, NUL-separated UTF-8 fields:
///
/// 1. the program's file name, as `run.command` names it (relative to the directory);
/// 2. the run's CPU limit in seconds (an interpreter whose language has
///    `run.pool.sets_cpu_limit` was started with the largest a run can have, and lowers it
///    to this, soft and hard, as the helper would have set it; others already have it);
/// 3. K, the number of the caller's arguments;
/// 4. M, the length of the cold command line;
/// 5. N, the number of the run's environment variables;
/// 6. the M words of the cold command line (`run.command` expanded, the caller's arguments
///    being its last K words);
/// 7. the run's whole environment, N `NAME=VALUE`, in the order a cold run's process gets
///    it (sorted by name).
///
/// What follows the payload on stdin is the program's own input; then stdin is closed.
pub fn request(
    file: &str,
    cpu_s: u64,
    nargs: usize,
    argv: &[String],
    env: &[(String, String)],
) -> Vec<u8> {
    let mut fields: Vec<String> = Vec::with_capacity(5 + argv.len() + env.len());
    fields.push(file.to_string());
    fields.push(cpu_s.to_string());
    fields.push(nargs.to_string());
    fields.push(argv.len().to_string());
    fields.push(env.len().to_string());
    fields.extend(argv.iter().cloned());
    let mut env: Vec<&(String, String)> = env.iter().collect();
    env.sort_by(|a, b| a.0.cmp(&b.0));
    fields.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    let payload = fields.join("\0");
    let mut out = format!("{}\n", payload.len()).into_bytes();
    out.extend_from_slice(payload.as_bytes());
    out
}

/// Whether a caller's variable changes how an interpreter starts (so a pooled interpreter,
/// started without it, cannot honour it): the dynamic loader's and libc's, the locale, the
/// time zone, and the variables the run itself sets (HOME, TMPDIR, PATH, TERM), plus the
/// language's own list (`run.pool.cold_env`). A pattern ending in `*` matches a prefix.
pub fn starts_differently(name: &str, language_patterns: &[String]) -> bool {
    const ALWAYS: &[&str] = &[
        "LD_*",
        "MALLOC_*",
        "GLIBC_TUNABLES",
        "LANG",
        "LANGUAGE",
        "LC_*",
        "TZ",
        "HOME",
        "TMPDIR",
        "PATH",
        "TERM",
    ];
    let matches = |p: &str| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == p,
    };
    ALWAYS.iter().copied().any(matches) || language_patterns.iter().any(|p| matches(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why a pooled interpreter did not start, as the log says it.
    #[test]
    fn warm_messages_are_pinned() {
        let e = WarmError::Spawn {
            exe: "/usr/bin/python3".into(),
            error: std::io::Error::from_raw_os_error(13),
        };
        assert_eq!(
            e.to_string(),
            "cannot start /usr/bin/python3: Permission denied (os error 13)"
        );
        assert_eq!(
            WarmError::NotInstalled("ruby".into()).to_string(),
            "ruby is not installed"
        );
    }

    #[test]
    fn request_format() {
        let argv: Vec<String> = ["/py", "-u", "main.py", "a b", ""]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let env = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("HOME".to_string(), "/h=x".to_string()),
        ];
        let r = request("main.py", 31, 2, &argv, &env);
        let text = String::from_utf8(r).expect("utf-8");
        let (len, payload) = text.split_once('\n').expect("length line");
        assert_eq!(len.parse::<usize>().expect("number"), payload.len());
        let fields: Vec<&str> = payload.split('\0').collect();
        assert_eq!(
            fields,
            [
                "main.py",
                "31",
                "2",
                "5",
                "2",
                "/py",
                "-u",
                "main.py",
                "a b",
                "",
                "HOME=/h=x",
                "PATH=/bin"
            ]
        );
    }

    #[test]
    fn cold_variables() {
        let py = vec!["PYTHON*".to_string()];
        for name in [
            "PYTHONPATH",
            "LD_PRELOAD",
            "LC_ALL",
            "LANG",
            "TZ",
            "HOME",
            "PATH",
        ] {
            assert!(starts_differently(name, &py), "{name}");
        }
        for name in ["GREETING", "PYTHO", "MY_PYTHONPATH", "LANGX", "DEBUG"] {
            assert!(!starts_differently(name, &py), "{name}");
        }
    }
}
