//! Starting a session: from a `session_start` request to a running interpreter (the
//! language, the directory and the files brought into it, the bootstrap, the environment
//! and the confinement).

mod compiled;
mod prepare;
pub(super) mod warm;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::files::InFile;
use super::history::Record;
use super::interp::{Interp, Launch};
use super::journal::Writer;
use super::live::{Footprint, Parts};
use super::report::StartReport;
use super::watch::Tracked;
use crate::config::Config;
use crate::error::{ErrorKind, ToolError};
use crate::exec::child::{Child, ChildBuilder, check_caller_env};
use crate::hostfs::{self, CwdPolicy};
use crate::identity::Caller;
use crate::lang::protocol::SessionValues;
use crate::lang::{
    Detected, InterpreterInfo, Language, LookupError, Registry, SessionSpec, Why, did_you_mean,
    expand, expand_command_lists,
};
use crate::sandbox::{Holder, Lease, Sandbox};
use crate::share::Share;
use crate::venv::{Venv, VenvPolicy};
use crate::workspace::{PrivateDir, Workspace};
use prepare::{Prepared, VenvAsk, prepare_dirs, read_only_note};

/// What the caller asked `session_start` for.
#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    pub language: String,
    pub cwd: Option<PathBuf>,
    /// A Python virtual environment (else a `.venv` in `cwd` is used, for languages that
    /// take one).
    pub venv: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub idle_timeout_s: Option<u64>,
    /// Files to put into the session's directory before it starts.
    pub files: Vec<InFile>,
    /// Domains the caller asks to reach (checked against the operator's `--caller-domains`).
    pub allow_domains: Vec<String>,
    /// Code mode: the MCP servers its code may call (among those granted to the principal).
    pub mcp_servers: Vec<String>,
    /// Python packages installed into the session's own layer before it starts.
    pub packages: Vec<String>,
}

/// The interpreter a session runs: its language, REPL driver, what detection found, and
/// the program the REPL starts (a virtual environment's `bin/python` when it runs in one).
pub(super) struct Interpreter {
    pub(super) lang: Arc<Language>,
    pub(super) spec: SessionSpec,
    detected: Detected,
    exe: PathBuf,
    version: String,
    info: InterpreterInfo,
    venv: Option<Venv>,
}

impl Interpreter {
    /// Run in `venv`, chosen for `why`; its version is the one its pyvenv.cfg states.
    fn in_venv(mut self, venv: Venv, why: Why) -> Self {
        self.exe = venv.python.clone();
        self.version = venv.version.clone();
        self.info = InterpreterInfo {
            path: venv.python.display().to_string(),
            why,
            venv: Some(venv.root.display().to_string()),
            note: None,
        };
        self.venv = Some(venv);
        self
    }
}

/// A session's interpreter up and running, not yet in the table: what a cold start makes
/// for its caller, and a warm one ahead of time.
pub(super) struct Up {
    pub(super) id: String,
    pub(super) it: Interpreter,
    pub(super) dirs: Dirs,
    pub(super) prepared: Prepared,
    pub(super) lease: Option<Lease>,
    pub(super) interp: Interp,
    /// The files of its cwd as the interpreter left them once up.
    pub(super) baseline: Option<Tracked>,
    /// What the start result says besides.
    pub(super) notes: Vec<String>,
}

impl Up {
    /// The start result, and what the session is made of: the interpreter up, for `owner`,
    /// with its journal, its share and an empty history.
    pub(super) fn into_session(
        self,
        owner: &Caller,
        level: crate::sandbox::Level,
        (idle_timeout, warm): (Duration, bool),
        (journal, share, record): (Option<Arc<Writer>>, Option<Share>, Record),
    ) -> (StartReport, Parts) {
        let Up {
            id,
            it,
            dirs,
            prepared,
            lease,
            interp,
            baseline,
            notes,
        } = self;
        let report = StartReport {
            session_id: id.clone(),
            language: it.lang.id().to_string(),
            version: it.version,
            interpreter: it.info,
            pid: interp.pid,
            cwd: dirs.cwd.display().to_string(),
            cwd_writable: prepared.writable,
            idle_timeout_s: idle_timeout.as_secs(),
            sandbox: level,
            files: prepared.brought.names.clone(),
            notes,
            warm,
            mcp_servers: dirs.tools.as_ref().map(|t| t.listing()).unwrap_or_default(),
            packages: dirs.installed,
        };
        let parts = Parts {
            id,
            owner: owner.clone(),
            lang: it.lang,
            cwd: dirs.cwd,
            cwd_fd: prepared.cwd_fd,
            out_fd: prepared.out_fd,
            idle_timeout,
            footprint: Footprint {
                dir: dirs.dir,
                lease,
            },
            baseline,
            interp,
            record,
            journal,
            share,
            tools: dirs.tools,
            packages: dirs.packages,
        };
        (report, parts)
    }
}

/// The directories of a session being started.
pub(super) struct Dirs {
    /// The session's own directory (`work/`, `ctl/`, `out/`), removed with it.
    pub(super) dir: PrivateDir,
    work: PathBuf,
    ctl: PathBuf,
    out: PathBuf,
    /// Where the code runs: the caller's `cwd`, or `work/`.
    cwd: PathBuf,
    /// The caller's `cwd`, when given (kept at close).
    caller_cwd: Option<PathBuf>,
    /// Its handle, opened as the session's uid when it was decided: what the sandbox shows.
    caller_cwd_fd: Option<Arc<OwnedFd>>,
    /// Whose session it is (its egress connections count against the principal's).
    principal: String,
    /// Code mode: its channel to the MCP tools, when it asked for servers.
    pub(super) tools: Option<Arc<crate::upstream::Channel>>,
    /// Its package layer, and what `packages` installed into it at the start.
    pub(super) packages: Option<Arc<crate::packages::SessionPackages>>,
    installed: Option<crate::packages::Installed>,
}

/// Starts sessions' interpreters: from a request to an interpreter up and running in its
/// directories, not yet in the table.
pub(super) struct Launcher {
    config: Arc<Config>,
    registry: Arc<Registry>,
    workspace: Arc<Workspace>,
    pub(super) sandbox: Arc<Sandbox>,
    /// What a caller's cwd may be.
    cwd_policy: Arc<CwdPolicy>,
    /// Code mode's upstream MCP servers (set once by the App).
    pub(super) upstreams: std::sync::OnceLock<Arc<crate::upstream::Upstreams>>,
    /// Packages on demand (set once by the App; None: `--no-packages`).
    pub(super) packages: std::sync::OnceLock<Option<Arc<crate::packages::Packages>>>,
    /// Bootstrap modules compiled once (ghci's).
    compiled: compiled::Builds,
}

impl Launcher {
    pub(super) fn new(
        config: Arc<Config>,
        registry: Arc<Registry>,
        workspace: Arc<Workspace>,
        sandbox: Arc<Sandbox>,
        cwd_policy: Arc<CwdPolicy>,
    ) -> Self {
        Self {
            config,
            registry,
            workspace,
            sandbox,
            cwd_policy,
            upstreams: std::sync::OnceLock::new(),
            packages: std::sync::OnceLock::new(),
            compiled: compiled::Builds::new(None),
        }
    }

    /// `idle_timeout_s` 0 would close the session at once: refused, saying what it means.
    pub(super) fn check_idle_timeout(&self, requested: Option<u64>) -> Result<(), ToolError> {
        if requested != Some(0) {
            return Ok(());
        }
        Err(ToolError::invalid(format!(
            "idle_timeout_s must be at least 1: it is how many seconds the session may stay \
unused before it is closed (omit it for the default, {} s; at most {} s)",
            self.config.idle_timeout_s, self.config.max_idle_timeout_s
        )))
    }

    /// Start session `id`'s interpreter for `caller` now: its uid, its directory, the
    /// caller's cwd, venv and files, then the interpreter.
    pub(super) async fn start_cold(
        &self,
        caller: &Caller,
        req: StartRequest,
        id: String,
        (lang, spec): (Arc<Language>, SessionSpec),
        (domains, access): (&[String], Option<Arc<crate::upstream::Access>>),
    ) -> Result<Up, ToolError> {
        let ask = VenvAsk::of(&lang, req.venv, req.cwd.is_some())?;
        let it = self.interpreter(lang, spec).await?;
        let lease = self
            .sandbox
            .lease_or_reclaim(Holder::Binds(&caller.principal))
            .await?;
        let uid = lease.as_ref().map(|l| l.uid);
        let (mut dirs, mut prepared, it) = self
            .dirs(&id, uid, req.cwd, req.files, (ask, it), Some(caller))
            .await?;
        dirs.tools = crate::session::tools::channel(self.upstreams.get(), access, &id, uid)?;
        if !req.packages.is_empty() {
            dirs.installed = Some(self.install_at_start(&dirs, &req.packages, caller).await?);
        }
        let interp = self
            .bring_up(&it, &dirs, &prepared, lease.as_ref(), (&req.env, domains))
            .await?;
        let mut notes: Vec<String> = prepared.venv_note.take().into_iter().collect();
        if !prepared.writable {
            notes.push(read_only_note(&dirs.cwd, uid));
        }
        let mut up = Up {
            id,
            it,
            dirs,
            prepared,
            lease,
            interp,
            baseline: None,
            notes,
        };
        self.take_baseline(&mut up).await;
        Ok(up)
    }

    /// A snapshot of `cwd` to compare the next evaluation against; None when the directory
    /// has more entries than tracking looks at (or tracking is off).
    async fn baseline(&self, uid: Option<u32>, cwd: &Arc<OwnedFd>) -> Option<Tracked> {
        let max = self.config.max_tracked_files;
        if max == 0 {
            return None;
        }
        let cwd = cwd.clone();
        let skip: Vec<_> = self.workspace.root_id().into_iter().collect();
        hostfs::as_uid(uid, move || Tracked::start(cwd.as_fd(), max, &skip))
            .await
            .ok()
            .flatten()
    }

    fn untracked_note(&self) -> String {
        format!(
            "file changes are not tracked in this session: its directory has more than {} \
files and folders (--max-tracked-files)",
            self.config.max_tracked_files
        )
    }

    /// The baseline for the first evaluation's file changes: taken once the interpreter
    /// is up, so what it wrote while starting is not taken for the code's doing.
    pub(super) async fn take_baseline(&self, up: &mut Up) {
        let uid = up.lease.as_ref().map(|l| l.uid);
        up.baseline = self.baseline(uid, &up.prepared.cwd_fd).await;
        if up.baseline.is_none() && self.config.max_tracked_files > 0 {
            up.notes.push(self.untracked_note());
        }
    }

    /// Refuse what no session can take: an invalid variable, domains the operator does not
    /// let callers ask for. The domains, checked.
    pub(super) fn check_request(
        &self,
        lang: &Language,
        req: &StartRequest,
    ) -> Result<Vec<String>, ToolError> {
        check_caller_env(&req.env)?;
        if !req.packages.is_empty() {
            crate::packages::check_request(lang.id(), req.venv.is_some(), &req.packages)?;
            crate::packages::enabled(self.packages.get().and_then(Option::as_ref))?;
        }
        self.sandbox
            .check_caller_domains(&req.allow_domains)
            .map_err(ToolError::from)
    }

    /// Start the interpreter in its directories; until it is up, a failure takes the files
    /// brought in away again.
    pub(super) async fn bring_up(
        &self,
        it: &Interpreter,
        dirs: &Dirs,
        prepared: &Prepared,
        lease: Option<&Lease>,
        (env, domains): (&BTreeMap<String, String>, &[String]),
    ) -> Result<Interp, ToolError> {
        let uid = lease.map(|l| l.uid);
        let undo = |e: ToolError| {
            let (fd, names) = (prepared.cwd_fd.clone(), prepared.brought.clone());
            async move {
                if !names.names.is_empty() {
                    let _ = hostfs::as_uid(uid, move || names.remove(fd.as_fd())).await;
                }
                e
            }
        };
        let launch = match self.launch(it, dirs, lease, env, domains).await {
            Ok(l) => l,
            Err(e) => return Err(undo(e).await),
        };
        match Interp::start(launch, Duration::from_millis(it.spec.start_timeout_ms)).await {
            Ok(i) => Ok(i),
            Err(e) => Err(undo(e.into()).await),
        }
    }

    /// The language asked for, and its REPL driver.
    pub(super) fn session_language(
        &self,
        name: &str,
    ) -> Result<(Arc<Language>, SessionSpec), ToolError> {
        let sessions = || self.registry.session_ids().join(", ");
        let lang = self.registry.get(name).map_err(|e| match e {
            LookupError::Unknown(n) => ToolError::new(
                ErrorKind::UnsupportedLanguage,
                format!(
                    "unknown language {n:?}.{} Session languages on this host: {}",
                    did_you_mean(self.registry.suggest(&n, true).as_deref()),
                    sessions()
                ),
            ),
            LookupError::NotInstalled { id, reason } => ToolError::new(
                ErrorKind::NotInstalled,
                format!(
                    "language {id:?} is not installed on this host ({reason}). Session languages: {}",
                    sessions()
                ),
            ),
        })?;
        let Some(spec) = lang.spec.session.clone() else {
            return Err(ToolError::new(
                ErrorKind::UnsupportedLanguage,
                format!(
                    "{} has no REPL driver, so it cannot hold a session; use run-code for it. Session languages: {}",
                    lang.id(),
                    sessions()
                ),
            ));
        };
        Ok((lang, spec))
    }

    /// The language's interpreter on this host, and the program its sessions start, which
    /// must be runnable at the sandbox level.
    pub(super) async fn interpreter(
        &self,
        lang: Arc<Language>,
        spec: SessionSpec,
    ) -> Result<Interpreter, ToolError> {
        let not_installed = |m: String| ToolError::new(ErrorKind::NotInstalled, m);
        let detected = lang
            .detect()
            .await
            .ok_or_else(|| not_installed(format!("{} is not installed", lang.id())))?
            .clone();
        let exe = lang.session_exe(&detected).map_err(|e| {
            not_installed(format!(
                "{} sessions cannot start on this host: {e} (run-code still works). Session languages: {}",
                lang.id(),
                self.registry.session_ids().join(", ")
            ))
        })?;
        if !self.sandbox.can_run(&exe) {
            return Err(not_installed(self.sandbox.cannot_run_reason(&exe)));
        }
        Ok(Interpreter {
            info: lang.info(&exe),
            version: detected.version.clone(),
            lang,
            spec,
            detected,
            exe,
            venv: None,
        })
    }

    /// What decides a caller's venv for a session of `it`: the cwd policy, and the
    /// installation of the default interpreter, which its sessions already see.
    fn venv_policy(&self, it: &Interpreter) -> VenvPolicy {
        VenvPolicy {
            dirs: (*self.cwd_policy).clone(),
            trusted: [&it.exe, &it.detected.exe]
                .iter()
                .flat_map(|e| self.sandbox.interpreter_dirs(e))
                .collect(),
            shown: self.sandbox.view().trees().map(Path::to_path_buf).collect(),
        }
    }

    /// The session's directory, owned by the lease's uid where it writes, and the caller's
    /// cwd, virtual environment (which then runs instead of `it`) and files, dealt with as
    /// that uid (never with the server's rights).
    pub(super) async fn dirs(
        &self,
        id: &str,
        uid: Option<u32>,
        cwd: Option<PathBuf>,
        files: Vec<InFile>,
        (ask, it): (VenvAsk, Interpreter),
        caller: Option<&Caller>,
    ) -> Result<(Dirs, Prepared, Interpreter), ToolError> {
        // A warm session has no caller yet; it has no egress endpoint either (none is
        // started while the proxy runs), so its empty principal counts against nobody.
        let local = caller.is_some_and(Caller::is_local);
        let venv = (ask, self.venv_policy(&it));
        let dir = self.workspace.new_session_dir(id, uid).map_err(|e| {
            ToolError::internal(format!("cannot create the session directory: {e}"))
        })?;
        let work = dir.path().join("work");
        let out = dir.path().join("out");
        // Handles on the session's own directories, opened with the server's rights: every
        // directory on the way is the server's, so nothing user code made is followed.
        let own = |p: &Path| {
            hostfs::open_dir_path(p)
                .map_err(|e| ToolError::internal(format!("cannot open the session directory: {e}")))
        };
        let (work_fd, out_fd) = (own(&work)?, own(&out)?);
        let mut prepared = hostfs::as_uid(uid, {
            let policy = self.cwd_policy.clone();
            let sandbox = self.sandbox.clone();
            move || {
                let bind = |p: &Path| sandbox.check_bind(p);
                prepare_dirs(
                    &policy, &bind, uid, cwd, venv, work_fd, out_fd, files, local,
                )
            }
        })
        .await??;
        let mut dirs = Dirs {
            ctl: dir.path().join("ctl"),
            out,
            cwd: prepared.caller_cwd.clone().unwrap_or_else(|| work.clone()),
            work,
            caller_cwd: prepared.caller_cwd.clone(),
            caller_cwd_fd: prepared
                .caller_cwd
                .as_ref()
                .map(|_| prepared.cwd_fd.clone()),
            dir,
            principal: caller.map(|c| c.principal.clone()).unwrap_or_default(),
            tools: None,
            packages: None,
            installed: None,
        };
        // A `.venv` found in the cwd, not named by the caller: used only when no other
        // principal's code could have put it there or changed it.
        if let (Some(w), Some(c)) = (prepared.venv_writers.take(), caller)
            && let Some(why) = self.sandbox.foreign_writer(&w, &c.principal, local)
        {
            prepared.venv = None;
            prepared.venv_note = Some(format!(
                "the .venv in cwd was not used: {why}, so code of another principal could \
have put it there; this session runs the server's Python. Pass venv to use it anyway"
            ));
        }
        let it = match prepared.venv.take() {
            Some((v, why)) => it.in_venv(v, why),
            None => it,
        };
        dirs.packages = self.package_layer(&it, dirs.dir.path());
        Ok((dirs, prepared, it))
    }

    /// A Python or JavaScript session's package layer (none in a caller's venv: its
    /// interpreter is never run by the installer; none with packages off).
    fn package_layer(
        &self,
        it: &Interpreter,
        dir: &Path,
    ) -> Option<Arc<crate::packages::SessionPackages>> {
        let pk = self.packages.get()?.as_ref()?;
        let eco = crate::packages::Eco::of(it.lang.id())?;
        if it.venv.is_some() {
            return None;
        }
        match pk.layer(eco, Some(dir)) {
            Ok(layer) => Some(Arc::new(crate::packages::SessionPackages {
                service: pk.clone(),
                layer,
                exe: it.exe.clone(),
            })),
            Err(e) => {
                tracing::warn!(error = e.message(), "no package layer for a session");
                None
            }
        }
    }

    /// `packages` installed into the session's layer before its interpreter starts.
    async fn install_at_start(
        &self,
        dirs: &Dirs,
        packages: &[String],
        caller: &Caller,
    ) -> Result<crate::packages::Installed, ToolError> {
        let pk = crate::packages::enabled(self.packages.get().and_then(Option::as_ref))?;
        let Some(sp) = &dirs.packages else {
            return Err(ToolError::invalid(
                "packages: this session runs in a virtual environment (the `.venv` of its \
                 cwd); packages are not installed into a caller's environment: install them \
                 there, or start without packages",
            ));
        };
        let cancel = tokio_util::sync::CancellationToken::new();
        pk.provide(&sp.exe, packages, &sp.layer, &caller.principal, &cancel)
            .await
            .map_err(ToolError::from)
    }

    /// How to start (and restart) the interpreter: its bootstrap, written into `ctl/`, its
    /// command line, environment and confinement.
    async fn launch(
        &self,
        it: &Interpreter,
        dirs: &Dirs,
        lease: Option<&Lease>,
        caller_env: &BTreeMap<String, String>,
        domains: &[String],
    ) -> Result<Arc<Launch>, ToolError> {
        let spec = &it.spec;
        let nonce = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
        let ctl_s = dirs.ctl.display().to_string();
        let work_s = dirs.work.display().to_string();
        // The bootstrap and init lines are code: their placeholders become literals.
        let values = spec.values(
            &nonce,
            &dirs.ctl,
            &dirs.work,
            &dirs.out,
            &dirs.cwd,
            u64::from(self.config.max_images),
        );
        let (built, boot_path) = self.write_bootstrap(it, dirs, &values).await?;
        let init = spec.init.iter().map(|l| values.expand(l)).collect();
        let exe = it.exe.display().to_string();
        let boot_s = boot_path.display().to_string();
        let cache_dir = crate::workspace::cache_dir(&dirs.dir, it.lang.id(), lease.map(|l| l.uid));
        let cache = cache_dir.display().to_string();
        let vars = [
            ("exe", exe.as_str()),
            ("bootstrap", boot_s.as_str()),
            ("ctl", ctl_s.as_str()),
            ("work", work_s.as_str()),
            ("cache", cache.as_str()),
            ("nonce", nonce.as_str()),
        ];
        let language = it.lang.spec.env.iter().chain(spec.env.iter());
        // Writable: the session's own directory, what it hands back, the build cache and a
        // caller's cwd (the kernel still decides what the session's uid may do there).
        // Readable: the control directory, the interpreter (a caller's venv as decided by
        // `venv::inspect`, never looked at with the server's rights).
        let builder = ChildBuilder::new(&self.sandbox, lease, &dirs.work);
        let builder = match &it.venv {
            Some(v) => builder.venv(v),
            None => builder.interpreters(&[&it.exe, &it.detected.exe]),
        };
        let builder = match (&dirs.caller_cwd, &dirs.caller_cwd_fd) {
            (Some(p), Some(fd)) => builder.caller_dir(p, fd.clone()),
            _ => builder,
        };
        let child = builder
            .language_reads(&it.lang.spec.reads)
            .writable([dirs.out.clone(), cache_dir])
            .readable(
                std::iter::once(dirs.ctl.clone()).chain(built.as_ref().map(|b| b.dir.clone())),
            )
            .language_env(language.map(|(k, v)| (k.clone(), expand(v, &vars))))
            .caller_env(caller_env)
            .build();
        let child = self.connect(child, dirs, domains)?;
        Ok(Arc::new(Launch {
            sandbox: self.sandbox.clone(),
            jail: child.jail,
            argv: expand_command_lists(
                &spec.command,
                &vars,
                &[("compiled_args", built.as_ref().map_or(&[][..], |b| &b.args))],
            ),
            env: child.env,
            cwd: dirs.cwd.clone(),
            ctl: dirs.ctl.clone(),
            nonce,
            init,
            spec: spec.clone(),
            output_cap: self.config.output_cap,
            whole_output_cap: self.config.whole_output_cap(),
        }))
    }

    /// Write the session's bootstrap into `ctl/`, its placeholders filled in: the compiled
    /// module when there is one (built at the language's first session), else the bootstrap
    /// as it is. The build it loads, if any, and the file's path.
    async fn write_bootstrap(
        &self,
        it: &Interpreter,
        dirs: &Dirs,
        values: &SessionValues,
    ) -> Result<(Option<Arc<compiled::Built>>, PathBuf), ToolError> {
        let spec = &it.spec;
        // It is shared by path with every session: only where none can change it (as root it
        // is root's and sessions run as other uids; at bwrap it is bound read-only). Not
        // root at landlock or none, sessions run as the server's own uid and could chmod it
        // for every other principal's ghci: those start from the interpreted bootstrap.
        let shared_read_only =
            self.sandbox.root || self.sandbox.level == crate::sandbox::Level::Bwrap;
        let built = match &spec.compiled {
            Some(c) if shared_read_only => self.compiled.get(c, &it.exe).await,
            _ => None,
        };
        let source = match (&built, &spec.compiled) {
            (Some(_), Some(c)) => &c.bootstrap.text,
            _ => &spec.bootstrap.text,
        };
        let boot_path = dirs.ctl.join(&spec.bootstrap.file);
        let (path, text) = (boot_path.clone(), values.expand(source));
        tokio::task::spawn_blocking(move || crate::workspace::write_ctl(&path, text))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(|e| ToolError::internal(format!("cannot write the bootstrap: {e}")))?;
        Ok((built, boot_path))
    }

    /// What the session's processes reach beyond its directories: the egress the caller
    /// may use, its channel to the MCP tools and its packages' layer.
    fn connect(&self, child: Child, dirs: &Dirs, domains: &[String]) -> Result<Child, ToolError> {
        let who = format!("session {}", dirs.dir.path().display());
        let endpoint = self
            .sandbox
            .egress_endpoint(&who, &dirs.principal, domains)?;
        Ok(child
            .with_egress(endpoint)
            .with_tools(dirs.tools.as_deref())
            .with_packages(dirs.packages.as_ref().map(|p| p.layer.view())))
    }
}
