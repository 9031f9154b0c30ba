//! `run-code`: one program, in a fresh private directory, with a clean environment, a
//! deadline that kills the whole tree, and bounded, separate stdout and stderr.

pub mod pool;
pub mod report;
mod supervise;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::exec::{self, env as cenv};
use crate::lang::{Language, Registry, expand, expand_command};
use crate::progress::Progress;
use crate::sandbox::{Jail, Lease, Sandbox};
use crate::workspace::{PrivateDir, Workspace};
use pool::{Pool, Warm};
pub use report::{Phase, RunReport};
use supervise::pipes;

/// What the caller asked for.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub code: String,
    pub stdin: Option<String>,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
}

/// Runs programs. Cheap to clone; every call is independent.
#[derive(Clone)]
pub struct Runner {
    pub config: Arc<Config>,
    pub workspace: Arc<Workspace>,
    pub sandbox: Arc<Sandbox>,
    /// Interpreters started ahead of time for languages with a `[run.pool]`.
    pub pool: Arc<Pool>,
}

/// Where a run happens: its directory, the uid it runs as (when the server is root), the
/// placeholders of its command lines and the confinement of its processes.
pub struct Place {
    pub(super) dir: PrivateDir,
    /// Held for its drop: the uid goes back to the pool after the directory is removed.
    _lease: Option<Lease>,
    exe: String,
    dir_s: String,
    cache: String,
    pub(super) jail: Jail,
}

impl Place {
    fn vars<'a>(&'a self, lang: &'a Language) -> [(&'a str, &'a str); 4] {
        [
            ("exe", self.exe.as_str()),
            ("file", lang.spec.run.file.as_str()),
            ("dir", self.dir_s.as_str()),
            ("cache", self.cache.as_str()),
        ]
    }
}

impl Runner {
    pub async fn run(
        &self,
        lang: &Arc<Language>,
        req: RunRequest,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> RunReport {
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + req.timeout);
        let mut report = RunReport {
            language: lang.id().to_string(),
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            signal: None,
            timed_out: false,
            duration_ms: 0,
            truncated: false,
            phase: Phase::Run,
            error: None,
            sandbox: self.sandbox.level,
        };
        let fail = |mut r: RunReport, msg: String| {
            r.error = Some(msg);
            r.duration_ms = started.elapsed().as_millis() as u64;
            r
        };
        let Some(detected) = lang.detect().await else {
            return fail(report, format!("{} is not installed", lang.id()));
        };
        if !self.sandbox.can_run(&detected.exe) {
            let why = self.sandbox.cannot_run_reason(&detected.exe);
            return fail(report, why);
        }
        let cpu_s = self.cpu_limit(req.timeout);
        // A pooled interpreter when the pool can honour the request, else a cold start.
        let warm = if self.poolable(lang, &req, cpu_s) {
            self.pool.take(lang.id())
        } else {
            None
        };
        let (place, warm) = match warm {
            Some(w) => (w.place, Some(w.proc)),
            None => match self.place(lang, &detected.exe, cpu_s) {
                Ok(p) => (p, None),
                Err(e) => return fail(report, e),
            },
        };
        let spec = &lang.spec.run;
        if let Err(e) = std::fs::write(place.dir.path().join(&spec.file), &req.code) {
            return fail(report, format!("cannot write the program: {e}"));
        }
        let vars = place.vars(lang);
        let env = self.child_env(lang, &detected.exe, place.dir.path(), &vars, &req.env);

        if let Some(compile) = &spec.compile {
            let argv = expand_command(compile, &vars, &[]);
            let spawn = pipes(argv, env.clone(), &place.jail, place.dir.path());
            let step = self.step(spawn, None, deadline, cancel, progress).await;
            let ok = step.status.is_some_and(|s| s.success()) && !step.timed_out;
            if !ok || step.cancelled || step.spawn_error.is_some() {
                report.phase = Phase::Compile;
                Self::fill(&mut report, step);
                report.duration_ms = started.elapsed().as_millis() as u64;
                return report;
            }
        }
        let argv = expand_command(&spec.command, &vars, &req.args);
        // stdin is always a pipe, closed after the caller's input (if any): a pooled
        // interpreter reads its request on that same pipe, and a cold run must see the same.
        let input = req.stdin.map(String::into_bytes).unwrap_or_default();
        let step = match warm {
            Some(proc) => {
                let mut data = pool::request(&spec.file, cpu_s, req.args.len(), &argv, &env);
                data.extend_from_slice(&input);
                self.supervise(proc, data, deadline, cancel, progress).await
            }
            None => {
                let spawn = pipes(argv, env, &place.jail, place.dir.path());
                self.step(spawn, Some(input), deadline, cancel, progress)
                    .await
            }
        };
        Self::fill(&mut report, step);
        report.duration_ms = started.elapsed().as_millis() as u64;
        // The directory, then the uid (its processes are gone by now).
        drop(place);
        // Replace what this run used (or what the pool dropped), now that the run is over.
        self.refill(lang);
        report
    }

    /// RLIMIT_CPU of a run's processes.
    fn cpu_limit(&self, timeout: Duration) -> u64 {
        match self.config.cpu_s {
            // A second past the deadline: a single-threaded program reaches the wall-clock
            // timeout first (reported as a timeout); only several busy threads trip it.
            0 => timeout.as_secs_f64().ceil() as u64 + 1,
            n => n,
        }
        .max(1)
    }

    /// A fresh place for a run: a uid from the pool (when the server is root; returned when
    /// the place is dropped, after its processes are gone) and a private directory it owns.
    fn place(&self, lang: &Language, exe: &Path, cpu_s: u64) -> Result<Place, String> {
        let lease = self.sandbox.lease()?;
        let uid = lease.as_ref().map(|l| l.uid);
        let dir = self
            .workspace
            .new_run_dir(uid)
            .map_err(|e| format!("cannot create a working directory: {e}"))?;
        let cache_dir = self.workspace.cache_dir(lang.id(), uid);
        let jail = Jail {
            uid,
            rw: vec![dir.path().to_path_buf(), cache_dir.clone()],
            ro: self.sandbox.interpreter_dirs(exe),
            cpu_s: Some(cpu_s),
            dirty: lease.as_ref().map(|l| l.dirty_flag()),
        };
        Ok(Place {
            exe: exe.display().to_string(),
            dir_s: dir.path().display().to_string(),
            cache: cache_dir.display().to_string(),
            dir,
            _lease: lease,
            jail,
        })
    }

    /// Whether a pooled interpreter can run this request exactly as a cold start would.
    fn poolable(&self, lang: &Language, req: &RunRequest, cpu_s: u64) -> bool {
        let Some(p) = &lang.spec.run.pool else {
            return false;
        };
        self.pool.enabled()
            && lang.spec.run.compile.is_none()
            // Pooled interpreters start with the largest CPU limit and lower it to the run's.
            && cpu_s <= self.cpu_limit(self.max_timeout())
            // NUL cannot be passed to a cold start either; let it fail the cold way.
            && !req.code.contains('\0')
            && !req.args.iter().any(|a| a.contains('\0'))
            && !req
                .env
                .keys()
                .any(|k| pool::starts_differently(k, &p.cold_env))
    }

    /// The longest a run can take (callers' timeouts are clamped to it).
    fn max_timeout(&self) -> Duration {
        Duration::from_millis(self.config.max_timeout_ms.max(1))
    }

    /// Start filling the pools of every installed language that has one (`serve` does this
    /// once it is up; from then on every run refills what it used).
    pub fn fill_pools(&self, registry: &Registry) {
        if !self.pool.enabled() {
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
    pub fn refill(&self, lang: &Arc<Language>) {
        if lang.spec.run.pool.is_none() {
            return;
        }
        for _ in 0..self.pool.reserve(lang.id()) {
            let me = self.clone();
            let lang = lang.clone();
            tokio::spawn(async move {
                let warm = me.start_warm(&lang).await;
                me.pool.started(lang.id(), warm);
            });
        }
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
        let place = self.place(lang, &detected.exe, self.cpu_limit(self.max_timeout()))?;
        let vars = place.vars(lang);
        let env = self.child_env(
            lang,
            &detected.exe,
            place.dir.path(),
            &vars,
            &BTreeMap::new(),
        );
        let mut with_loader = vars.to_vec();
        with_loader.push(("loader", p.loader.as_str()));
        let argv = expand_command(&p.command, &with_loader, &[]);
        let proc = exec::spawn(
            &self.sandbox,
            pipes(argv, env, &place.jail, place.dir.path()),
        )
        .map_err(|e| format!("cannot start {}: {e}", detected.exe.display()))?;
        Ok(Warm {
            proc,
            place,
            born: Instant::now(),
        })
    }

    /// The environment of a child: the allowlist, the language's settings, then the caller's.
    fn child_env(
        &self,
        lang: &Language,
        exe: &Path,
        home: &Path,
        vars: &[(&str, &str)],
        caller: &BTreeMap<String, String>,
    ) -> Vec<(String, String)> {
        let mut env = cenv::base_env(home, "dumb");
        // The interpreter's own directory first, so `python3`/`pip` in a subprocess match it.
        if let Some(bin) = exe.parent() {
            let path = format!("{}:{}", bin.display(), cenv::server_path());
            cenv::set(&mut env, "PATH", path);
        }
        cenv::set(&mut env, "TMPDIR", home.display().to_string());
        for (k, v) in lang.spec.env.iter().chain(lang.spec.run.env.iter()) {
            cenv::set(&mut env, k, expand(v, vars));
        }
        for (k, v) in caller {
            cenv::set(&mut env, k, v.clone());
        }
        env
    }
}
