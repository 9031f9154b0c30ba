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
use std::time::Instant;

use super::pool::{Pool, Ready};
use super::supervise::pipes;
use super::{Place, RunRequest, Runner};
use crate::exec::{self, Proc};
use crate::lang::{Language, Registry, expand_command};
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

impl Runner {
    /// Whether a pooled interpreter can run this request exactly as a cold start would.
    pub(super) fn poolable(&self, lang: &Language, req: &RunRequest, cpu_s: u64) -> bool {
        let Some(p) = &lang.spec.run.pool else {
            return false;
        };
        self.pool.enabled()
            && self.sandbox.can_prestart()
            && lang.spec.run.compile.is_none()
            // Pooled interpreters start with the largest CPU limit and lower it to the run's.
            && cpu_s <= self.cpu_limit(self.max_timeout())
            // NUL cannot be passed to a cold start either; let it fail the cold way.
            && !req.code.contains('\0')
            && !req.args.iter().any(|a| a.contains('\0'))
            // A virtual environment is checked as the run's own uid and has its own python.
            && req.venv.is_none()
            // The way to the egress proxy is each run's own, made when it starts.
            && self.sandbox.egress.is_none()
            && !req
                .env
                .keys()
                .any(|k| starts_differently(k, &p.cold_env))
    }

    /// Start filling the pools of every installed language that has one (`serve` does this
    /// once it is up; from then on every run refills what it used).
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
        for lang in registry.all() {
            if lang.installed() && lang.spec.run.pool.is_some() {
                self.refill(lang);
            }
        }
    }

    /// Start as many pooled interpreters of `lang` as it lacks, in the background.
    pub(crate) fn refill(&self, lang: &Arc<Language>) {
        if lang.spec.run.pool.is_none() {
            return;
        }
        self.pool.refill(lang.id(), || {
            let me = self.clone();
            let lang = lang.clone();
            async move { me.start_warm(&lang).await }
        });
    }

    /// Start one pooled interpreter: a fresh place, the environment of a run there (without
    /// any caller's variables), and the language's loader, through `exec::spawn` (so in the
    /// sandbox, as the run's uid) like every other child.
    async fn start_warm(&self, lang: &Language) -> Result<Warm, String> {
        let Some(p) = &lang.spec.run.pool else {
            return Err("the language has no pool".into());
        };
        let detected = lang
            .detect()
            .await
            .ok_or_else(|| format!("{} is not installed", lang.id()))?;
        if !self.sandbox.can_run(&detected.exe) {
            return Err(self.sandbox.cannot_run_reason(&detected.exe));
        }
        let place = self
            .place(
                lang,
                &detected.exe,
                self.cpu_limit(self.max_timeout()),
                Holder::Nobody,
                false,
            )
            .await?;
        let vars = place.vars(lang);
        let child = self.child(&place, lang, &BTreeMap::new());
        let mut with_loader = vars.to_vec();
        with_loader.push(("loader", p.loader.text.as_str()));
        let argv = expand_command(&p.command, &with_loader, &[]);
        let proc = exec::spawn(&self.sandbox, pipes(argv, &child, place.dir.path()))
            .map_err(|e| format!("cannot start {}: {e}", detected.exe.display()))?;
        Ok(Warm {
            proc,
            place,
            born: Instant::now(),
        })
    }
}

/// The request a pooled interpreter reads on stdin: the decimal length of the payload and a
/// newline, then the payload, NUL-separated UTF-8 fields:
///
/// 1. the program's file name, as `run.command` names it (relative to the directory);
/// 2. the run's CPU limit in seconds (the interpreter was started with the largest a run
///    can have, and lowers it to this, soft and hard, as the helper would have set it);
/// 3. K, the number of the caller's arguments;
/// 4. M, the length of the cold command line, then its M words (`run.command` expanded,
///    the caller's arguments being its last K words);
/// 5. the run's whole environment, `NAME=VALUE` each, in the order a cold run's process
///    gets it (sorted by name).
///
/// What follows the payload on stdin is the program's own input; then stdin is closed.
pub fn request(
    file: &str,
    cpu_s: u64,
    nargs: usize,
    argv: &[String],
    env: &[(String, String)],
) -> Vec<u8> {
    let mut fields: Vec<String> = Vec::with_capacity(4 + argv.len() + env.len());
    fields.push(file.to_string());
    fields.push(cpu_s.to_string());
    fields.push(nargs.to_string());
    fields.push(argv.len().to_string());
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
