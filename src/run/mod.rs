//! `run-code`: one program, in a fresh private directory, with a clean environment, a
//! deadline that kills the whole tree, and bounded, separate stdout and stderr.

mod report;
mod supervise;
pub(crate) mod warm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::ToolError;
use crate::exec::Proc;
use crate::exec::child::{Child, ChildBuilder, check_caller_env};
use crate::hostfs::{self, CwdPolicy};
use crate::identity::Caller;
use crate::lang::spec::RunSpec;
use crate::lang::{InterpreterInfo, Language, Why, expand, expand_command};
use crate::progress::Progress;
use crate::sandbox::{Holder, Lease, Sandbox};
use crate::share::{Shares, Use};
use crate::venv::{self, Venv, VenvPolicy};
use crate::workspace::{PrivateDir, Workspace};
pub use report::{Phase, RunReport};
use supervise::{Step, Watch, pipes};
use warm::WarmPool;

/// What the caller asked for.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub code: String,
    pub stdin: Option<String>,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
    /// A Python virtual environment to run in (a caller path, checked as the run's uid).
    pub venv: Option<PathBuf>,
    /// Who asks (the caller's principal): decides which uid the run may get.
    pub principal: String,
    /// Domains the caller asks to reach (checked against the operator's `--caller-domains`).
    pub allow_domains: Vec<String>,
    /// Code mode: the MCP servers the code may call (among those granted to the principal).
    pub mcp_servers: Vec<String>,
    /// Packages to install for this run (PEP 508 specifiers for Python, npm's for
    /// JavaScript).
    pub packages: Vec<String>,
}

impl RunRequest {
    /// Refuse what no run can take: an invalid environment variable, a `venv` for a
    /// language that takes none.
    pub(crate) fn check(&self, lang: &Language) -> Result<(), ToolError> {
        check_caller_env(&self.env)?;
        if !self.packages.is_empty() {
            crate::packages::check_request(lang.id(), self.venv.is_some(), &self.packages)?;
        }
        if self.venv.is_some() && !lang.spec.venv {
            return Err(ToolError::invalid(format!(
                "venv is a Python virtual environment, and {} takes none; leave venv out",
                lang.id()
            )));
        }
        Ok(())
    }
}

/// Runs programs. Cheap to clone; every call is independent.
#[derive(Clone)]
pub struct Runner {
    pub(crate) config: Arc<Config>,
    pub(crate) workspace: Arc<Workspace>,
    pub(crate) sandbox: Arc<Sandbox>,
    /// Interpreters started ahead of time for languages with a `[run.pool]`.
    pub(crate) pool: Arc<WarmPool>,
    /// What a caller's directory (a `venv`) may be.
    pub(crate) cwd_policy: Arc<CwdPolicy>,
    /// Every principal's share of sessions and runs (shared with the sessions).
    pub(crate) shares: Arc<Shares>,
    /// Code mode's upstream MCP servers.
    pub(crate) upstreams: Arc<crate::upstream::Upstreams>,
    /// Packages on demand (None: `--no-packages`).
    pub(crate) packages: Option<Arc<crate::packages::Packages>>,
}

/// Why there is no place to run in.
enum NoPlace {
    /// The caller asked for something refused (a `venv`).
    Refused(ToolError),
    /// The run could not be prepared: reported in the result.
    Failed(String),
}

impl From<String> for NoPlace {
    fn from(m: String) -> Self {
        NoPlace::Failed(m)
    }
}

/// Why a fresh place could not be made: reported in the run's result.
#[derive(Debug, thiserror::Error)]
pub(super) enum PlaceError {
    #[error(transparent)]
    Lease(#[from] crate::sandbox::Refused),
    #[error("cannot create a working directory: {0}")]
    Dir(std::io::Error),
}

impl From<PlaceError> for NoPlace {
    fn from(e: PlaceError) -> Self {
        NoPlace::Failed(e.to_string())
    }
}

/// Where a run happens: its directory, the uid it runs as (when the server is root), the
/// interpreter, the build cache and the CPU limit of its processes. Dropping it removes the
/// directory, then returns the uid (its processes are gone by then), on the blocking pool.
pub(crate) struct Place {
    pub(super) dir: PrivateDir,
    lease: Option<Lease>,
    exe: PathBuf,
    /// The virtual environment it runs in (`exe` is then its `bin/python`).
    venv: Option<Venv>,
    cache: PathBuf,
    cpu_s: u64,
    /// The placeholders of its command lines.
    exe_s: String,
    dir_s: String,
    cache_s: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.dir.take().remove_then(self.lease.take());
    }
}

impl Place {
    /// Drop the place and wait until its directory is removed and its uid returned.
    async fn release(mut self) {
        if let Some(task) = self.dir.take().remove_then(self.lease.take()) {
            let _ = task.await;
        }
    }

    /// Run in `venv`: its `bin/python` is the program's `{exe}`.
    fn in_venv(&mut self, venv: Venv) {
        self.exe = venv.python.clone();
        self.exe_s = self.exe.display().to_string();
        self.venv = Some(venv);
    }

    /// What the result says about the interpreter.
    fn info(&self, lang: &Language) -> InterpreterInfo {
        match &self.venv {
            Some(v) => InterpreterInfo {
                path: v.python.display().to_string(),
                why: Why::Venv,
                venv: Some(v.root.display().to_string()),
                note: None,
            },
            None => lang.info(&self.exe),
        }
    }

    fn vars<'a>(&'a self, lang: &'a Language) -> [(&'a str, &'a str); 4] {
        [
            ("exe", self.exe_s.as_str()),
            ("file", lang.spec.run.file.as_str()),
            ("dir", self.dir_s.as_str()),
            ("cache", self.cache_s.as_str()),
        ]
    }
}

impl Runner {
    /// [`run`](Self::run) for `caller`, holding one of its shares (`share`) while it runs:
    /// refused when the caller already holds all its shares in sessions and runs.
    pub async fn run_for(
        &self,
        caller: &Caller,
        lang: &Arc<Language>,
        req: RunRequest,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<RunReport, ToolError> {
        let _share = self.shares.take(caller, Use::Run)?;
        self.run(lang, req, cancel, progress).await
    }

    /// Run `req` once: in a pooled interpreter when the pool can honour it, else in a fresh
    /// place; compile first for compiled languages. A refused request (see
    /// [`RunRequest::check`], a `venv` the run's uid may not use) is an error; a run that
    /// failed is a report.
    pub async fn run(
        &self,
        lang: &Arc<Language>,
        req: RunRequest,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<RunReport, ToolError> {
        req.check(lang)?;
        let domains = self.sandbox.check_caller_domains(&req.allow_domains)?;
        let caller = Caller {
            principal: req.principal.clone(),
        };
        let access = self.upstreams.access(&caller, &req.mcp_servers).await?;
        let started = Instant::now();
        let watch = Watch {
            deadline: tokio::time::Instant::from_std(started + req.timeout),
            cancel,
            progress,
        };
        let mut report = RunReport::new(lang.id(), self.sandbox.level);
        let fail = |mut r: RunReport, msg: String| {
            r.error = Some(msg);
            r.duration_ms = started.elapsed().as_millis() as u64;
            r
        };
        let cpu_s = self.cpu_limit(req.timeout);
        let (place, warm) = match self.place_for(lang, &req, cpu_s).await {
            Ok(p) => p,
            Err(NoPlace::Refused(e)) => return Err(e),
            Err(NoPlace::Failed(m)) => return Ok(fail(report, m)),
        };
        report.interpreter = Some(place.info(lang));
        if let Err(e) = write_program(lang, &place, &req.code).await {
            return Ok(fail(report, format!("cannot write the program: {e}")));
        }
        let layer = match self.install(lang, &place, &req, cancel).await {
            Ok(Some((layer, installed))) => {
                report.packages = Some(installed);
                Some(layer)
            }
            Ok(None) => None,
            Err(e) => {
                place.release().await;
                return Err(e.into());
            }
        };
        let (child, channel) =
            match self.tooled_child(&place, lang, &req, &domains, access, layer.as_ref()) {
                Ok(c) => c,
                Err(NoPlace::Refused(e)) => return Err(e),
                Err(NoPlace::Failed(m)) => return Ok(fail(report, m)),
            };
        let _calls = channel.as_ref().map(|c| {
            report.mcp_servers = c.listing();
            c.begin(0, watch.deadline, Vec::new())
        });
        let ready = Ready {
            runner: self,
            lang,
            place: &place,
            child: &child,
            watch,
        };
        if let Some(failed) = ready.compile().await {
            report.phase = Phase::Compile;
            Self::fill(&mut report, failed);
            report.hide_dir(place.dir.path());
            report.duration_ms = started.elapsed().as_millis() as u64;
            return Ok(report);
        }
        let step = ready.program(warm, &req.args, req.stdin, cpu_s).await;
        Self::fill(&mut report, step);
        if compile_failure(&lang.spec.run, &report) {
            report.phase = Phase::Compile;
        }
        report.hide_dir(place.dir.path());
        report.duration_ms = started.elapsed().as_millis() as u64;
        drop(_calls);
        if let Some(c) = &channel {
            report.tool_calls = c.take_calls(0).iter().map(|r| r.summary()).collect();
        }
        place.release().await;
        // Replace what this run used (or what the pool dropped), now that the run is over.
        self.refill(lang);
        Ok(report)
    }

    /// What the run's processes start with (see [`child`](Self::child)), with the egress
    /// the caller may use, code mode's own channel for the run (answering for the whole
    /// run) and the packages' layer; and that channel.
    fn tooled_child(
        &self,
        place: &Place,
        lang: &Language,
        req: &RunRequest,
        domains: &[String],
        access: Option<Arc<crate::upstream::Access>>,
        layer: Option<&crate::packages::Layer>,
    ) -> Result<(Child, Option<crate::upstream::Channel>), NoPlace> {
        let who = format!("run {}", place.dir_s);
        let child = match self.sandbox.egress_endpoint(&who, &req.principal, domains) {
            Ok(ep) => self.child(place, lang, &req.env).with_egress(ep),
            Err(e) => return Err(NoPlace::Failed(e.to_string())),
        };
        let uid = place.lease.as_ref().map(|l| l.uid);
        let channel = match access {
            Some(a) => Some(
                self.upstreams
                    .channel(a, &who, uid)
                    .map_err(NoPlace::Refused)?,
            ),
            None => None,
        };
        // Packages after the tools: their search path goes in front of the tools' module.
        let child = child
            .with_tools(channel.as_ref())
            .with_packages(layer.map(crate::packages::Layer::view));
        Ok((child, channel))
    }

    /// The run's packages installed into a layer of its own (None when it asks for none).
    async fn install(
        &self,
        lang: &Language,
        place: &Place,
        req: &RunRequest,
        cancel: &CancellationToken,
    ) -> Result<
        Option<(crate::packages::Layer, crate::packages::Installed)>,
        crate::packages::PackageError,
    > {
        if req.packages.is_empty() {
            return Ok(None);
        }
        let pk = crate::packages::enabled(self.packages.as_ref())?;
        let eco = crate::packages::Eco::of(lang.id()).ok_or_else(|| {
            crate::packages::PackageError::Refused(format!(
                "packages: {} takes no packages",
                lang.id()
            ))
        })?;
        let layer = pk.layer(eco, None)?;
        let installed = pk
            .provide(&place.exe, &req.packages, &layer, &req.principal, cancel)
            .await?;
        Ok(Some((layer, installed)))
    }

    /// Where to run: a pooled interpreter's place when the pool can honour the request
    /// (with the interpreter), else a fresh one.
    async fn place_for(
        &self,
        lang: &Arc<Language>,
        req: &RunRequest,
        cpu_s: u64,
    ) -> Result<(Place, Option<Proc>), NoPlace> {
        let Some(detected) = lang.detect().await else {
            return Err(format!("{} is not installed", lang.id()).into());
        };
        if !self.sandbox.can_run(&detected.exe) {
            return Err(self.sandbox.cannot_run_reason(&detected.exe).into());
        }
        if let Some(requested) = &req.venv {
            // Never pooled: the environment is checked as this run's uid, and the
            // interpreter is its own.
            let holder = Holder::Visits(&req.principal);
            let mut place = self.place(lang, &detected.exe, cpu_s, holder, true).await?;
            let policy = VenvPolicy {
                dirs: (*self.cwd_policy).clone(),
                trusted: self.sandbox.interpreter_dirs(&detected.exe),
                shown: self.sandbox.view().trees().map(Path::to_path_buf).collect(),
            };
            let (uid, requested) = (place.lease.as_ref().map(|l| l.uid), requested.clone());
            let venv = hostfs::as_uid(uid, move || venv::inspect(&policy, &requested, uid))
                .await
                .map_err(|e| NoPlace::Failed(e.to_string()))?
                .map_err(|e| NoPlace::Refused(e.into()))?;
            place.in_venv(venv);
            return Ok((place, None));
        }
        let warm = if self.poolable(lang, req, cpu_s) {
            self.take_warm(lang, req).await
        } else {
            None
        };
        match warm {
            Some(w) => Ok((w.place, Some(w.proc))),
            None => {
                let holder = Holder::Visits(&req.principal);
                Ok((
                    self.place(lang, &detected.exe, cpu_s, holder, true).await?,
                    None,
                ))
            }
        }
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
    /// The uid is `holder`'s (see `Sandbox::lease`). With `reclaim`, a pool of uids all in
    /// use first takes one back from the warm pool or the kept files of an ended session.
    async fn place(
        &self,
        lang: &Language,
        exe: &Path,
        cpu_s: u64,
        holder: Holder<'_>,
        reclaim: bool,
    ) -> Result<Place, PlaceError> {
        let lease = if reclaim {
            self.sandbox.lease_or_reclaim(holder).await?
        } else {
            self.sandbox.lease(holder)?
        };
        let uid = lease.as_ref().map(|l| l.uid);
        let dir = self.workspace.new_run_dir(uid).map_err(PlaceError::Dir)?;
        let cache = crate::workspace::cache_dir(&dir, lang.id(), uid);
        Ok(Place {
            exe_s: exe.display().to_string(),
            dir_s: dir.path().display().to_string(),
            cache_s: cache.display().to_string(),
            exe: exe.to_path_buf(),
            venv: None,
            cache,
            cpu_s,
            dir,
            lease,
        })
    }

    /// What a run's processes start with in `place`: the allowlist, the language's
    /// settings and, as their own layer, the caller's variables; confined to the place's
    /// directory and build cache, as its uid, under its CPU limit.
    fn child(&self, place: &Place, lang: &Language, caller: &BTreeMap<String, String>) -> Child {
        let vars = place.vars(lang);
        let language = lang.spec.env.iter().chain(lang.spec.run.env.iter());
        let builder = ChildBuilder::new(&self.sandbox, place.lease.as_ref(), place.dir.path());
        let builder = match &place.venv {
            // A caller's environment: never looked at with the server's rights.
            Some(v) => builder.venv(v),
            None => builder.interpreters(&[&place.exe]),
        };
        builder
            .language_reads(&lang.spec.reads)
            .writable([place.cache.clone()])
            .cpu_limit(place.cpu_s)
            .language_env(language.map(|(k, v)| (k.clone(), expand(v, &vars))))
            .caller_env(caller)
            .build()
    }

    /// The longest a run can take (callers' timeouts are clamped to it).
    fn max_timeout(&self) -> Duration {
        Duration::from_millis(self.config.max_timeout_ms.max(1))
    }
}

/// A run ready to start its processes: its place, what they start with, and what they
/// are watched for.
struct Ready<'a> {
    runner: &'a Runner,
    lang: &'a Language,
    place: &'a Place,
    child: &'a Child,
    watch: Watch<'a>,
}

impl Ready<'_> {
    /// Compile the program, for a compiled language: the step when it failed (the run
    /// goes no further), None when it succeeded or there is nothing to compile.
    async fn compile(&self) -> Option<Step> {
        let compile = self.lang.spec.run.compile.as_ref()?;
        let argv = expand_command(compile, &self.place.vars(self.lang), &[]);
        let spawn = pipes(argv, self.child, self.place.dir.path());
        let step = self.runner.step(spawn, None, self.watch).await;
        let ok = step.status.is_some_and(|s| s.success()) && !step.timed_out;
        (!ok || step.cancelled || step.spawn_error.is_some()).then_some(step)
    }

    /// Run the program with the caller's arguments and input: in the pooled interpreter
    /// (`warm`, under the run's CPU limit `cpu_s`), else in a process of its own.
    async fn program(
        &self,
        warm: Option<Proc>,
        args: &[String],
        stdin: Option<String>,
        cpu_s: u64,
    ) -> Step {
        let spec = &self.lang.spec.run;
        let argv = expand_command(&spec.command, &self.place.vars(self.lang), args);
        // stdin is always a pipe, closed after the caller's input (if any): a pooled
        // interpreter reads its request on that same pipe, and a cold run must see the same.
        let input = stdin.map(String::into_bytes).unwrap_or_default();
        match warm {
            Some(proc) => {
                let env = self.child.env.merged();
                let mut data = warm::request(&spec.file, cpu_s, args.len(), &argv, &env);
                data.extend_from_slice(&input);
                self.runner.supervise(proc, data, self.watch).await
            }
            None => {
                let spawn = pipes(argv, self.child, self.place.dir.path());
                self.runner.step(spawn, Some(input), self.watch).await
            }
        }
    }
}

/// Write the program into its place, with Unix newlines when the language needs them.
async fn write_program(lang: &Language, place: &Place, code: &str) -> std::io::Result<()> {
    let spec = &lang.spec.run;
    let program = place.dir.path().join(&spec.file);
    let code = if spec.unix_newlines {
        crate::session::interp::unix_newlines(code)
    } else {
        std::borrow::Cow::Borrowed(code)
    };
    tokio::fs::write(program, code.as_bytes()).await
}

/// Whether a program that failed failed to compile: the language compiles as it runs, and
/// the last line of its stderr is the one that says so.
fn compile_failure(spec: &RunSpec, report: &RunReport) -> bool {
    report.exit_code.is_some_and(|c| c != 0)
        && !report.timed_out
        && spec.compile_failure.as_deref().is_some_and(|last| {
            report.stderr.trim_end().lines().next_back().map(str::trim) == Some(last)
        })
}
