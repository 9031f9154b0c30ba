//! Starting a session: from a `session_start` request to a running interpreter (the
//! language, the directory and the files brought into it, the bootstrap, the environment
//! and the confinement).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::entry::Session;
use super::files::{self, InFile};
use super::interp::{Interp, Launch};
use super::manager::SessionManager;
use super::report::StartReport;
use crate::error::{ErrorKind, ToolError};
use crate::exec::child::{ChildBuilder, check_caller_env};
use crate::identity::Caller;
use crate::lang::{Detected, Language, LookupError, SessionSpec, expand, expand_command};
use crate::sandbox::Lease;
use crate::workspace::PrivateDir;

/// What the caller asked `session_start` for.
#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    pub language: String,
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub idle_timeout_s: Option<u64>,
    /// Files to put into the session's directory before it starts.
    pub files: Vec<InFile>,
}

/// The interpreter a session runs: its language, REPL driver, what detection found, and
/// the program the REPL starts.
struct Interpreter {
    lang: Arc<Language>,
    spec: SessionSpec,
    detected: Detected,
    exe: PathBuf,
}

/// The directories of a session being started.
struct Dirs {
    /// The session's own directory (`work/`, `ctl/`, `out/`), removed with it.
    dir: PrivateDir,
    work: PathBuf,
    ctl: PathBuf,
    out: PathBuf,
    /// Where the code runs: the caller's `cwd`, or `work/`.
    cwd: PathBuf,
    /// The caller's `cwd`, when given (kept at close).
    caller_cwd: Option<PathBuf>,
}

impl SessionManager {
    /// Start a session; errors are messages for the agent.
    pub async fn start(
        &self,
        caller: &Caller,
        req: StartRequest,
    ) -> Result<StartReport, ToolError> {
        let _slot = self.admit(caller).await?;
        let (lang, spec) = self.session_language(&req.language)?;
        check_caller_env(&req.env).map_err(ToolError::invalid)?;
        let caller_cwd = self.caller_cwd(req.cwd.as_deref())?;
        let it = self.interpreter(lang, spec).await?;
        let lease = self
            .sandbox
            .lease()
            .map_err(|m| ToolError::new(ErrorKind::Limit, m))?;
        let id = uuid::Uuid::new_v4().to_string();
        let dirs = self.dirs(&id, lease.as_ref(), caller_cwd)?;
        let brought = bring_in(req.files, &dirs.cwd, caller).await?;
        let launch = self.launch(&it, &dirs, lease.as_ref(), &req.env).await?;
        let interp = Interp::start(launch, Duration::from_millis(it.spec.start_timeout_ms))
            .await
            .map_err(|m| ToolError::new(ErrorKind::StartFailed, m))?;
        // The baseline for the first evaluation's file changes: taken once the interpreter
        // is up, so what it wrote while starting is not taken for the code's doing.
        let mut notes = Vec::new();
        let baseline = self.baseline(&dirs.cwd).await;
        if baseline.is_none() && self.config.max_tracked_files > 0 {
            notes.push(self.untracked_note());
        }
        let idle_timeout = self.config.idle_timeout(req.idle_timeout_s);
        let report = StartReport {
            session_id: id.clone(),
            language: it.lang.id().to_string(),
            version: it.detected.version,
            pid: interp.pid,
            cwd: dirs.cwd.display().to_string(),
            idle_timeout_s: idle_timeout.as_secs(),
            sandbox: self.sandbox.level,
            files: brought,
            notes,
        };
        let now = SystemTime::now();
        let session = Arc::new(Session {
            id: id.clone(),
            owner: caller.clone(),
            lang: it.lang,
            cwd: dirs.cwd,
            created_at: now,
            idle_timeout,
            dir: dirs.dir,
            out: dirs.out,
            files: Mutex::new(baseline),
            pid: AtomicU64::new(interp.pid as u64),
            interp: tokio::sync::Mutex::new(Some(interp)),
            evals: AtomicU64::new(0),
            last_used: Mutex::new((now, Instant::now())),
            busy: Mutex::new(None),
            gone: Mutex::new(None),
            awaiting: Mutex::new(None),
            interrupt: Mutex::new(None),
            lease,
        });
        self.sessions.insert(id, session);
        Ok(report)
    }

    /// The language asked for, and its REPL driver.
    fn session_language(&self, name: &str) -> Result<(Arc<Language>, SessionSpec), ToolError> {
        let sessions = || self.registry.session_ids().join(", ");
        let lang = self.registry.get(name).map_err(|e| match e {
            LookupError::Unknown(n) => ToolError::new(
                ErrorKind::UnsupportedLanguage,
                format!(
                    "unknown language {n:?}. Session languages on this host: {}",
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

    /// The caller's `cwd`, checked: an existing directory outside the server's workspace.
    fn caller_cwd(&self, cwd: Option<&Path>) -> Result<Option<PathBuf>, ToolError> {
        let Some(dir) = cwd else {
            return Ok(None);
        };
        let meta = std::fs::metadata(dir)
            .map_err(|e| ToolError::invalid(format!("cwd {}: {e}", dir.display())))?;
        if !meta.is_dir() {
            return Err(ToolError::invalid(format!(
                "cwd {} is not a directory",
                dir.display()
            )));
        }
        let dir = std::fs::canonicalize(dir)
            .map_err(|e| ToolError::invalid(format!("cwd {}: {e}", dir.display())))?;
        self.sandbox
            .check_cwd(&dir, self.workspace.root())
            .map_err(ToolError::invalid)?;
        Ok(Some(dir))
    }

    /// The language's interpreter on this host, and the program its sessions start, which
    /// must be runnable at the sandbox level.
    async fn interpreter(
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
            lang,
            spec,
            detected,
            exe,
        })
    }

    /// The session's directory, owned by the lease's uid where it writes.
    fn dirs(
        &self,
        id: &str,
        lease: Option<&Lease>,
        caller_cwd: Option<PathBuf>,
    ) -> Result<Dirs, ToolError> {
        let uid = lease.map(|l| l.uid);
        let dir = self.workspace.new_session_dir(id, uid).map_err(|e| {
            ToolError::internal(format!("cannot create the session directory: {e}"))
        })?;
        let work = dir.path().join("work");
        Ok(Dirs {
            ctl: dir.path().join("ctl"),
            out: dir.path().join("out"),
            cwd: caller_cwd.clone().unwrap_or_else(|| work.clone()),
            work,
            caller_cwd,
            dir,
        })
    }

    /// How to start (and restart) the interpreter: its bootstrap, written into `ctl/`, its
    /// command line, environment and confinement.
    async fn launch(
        &self,
        it: &Interpreter,
        dirs: &Dirs,
        lease: Option<&Lease>,
        caller_env: &BTreeMap<String, String>,
    ) -> Result<Arc<Launch>, ToolError> {
        let spec = &it.spec;
        let nonce = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
        let ctl_s = dirs.ctl.display().to_string();
        let work_s = dirs.work.display().to_string();
        let out_s = dirs.out.display().to_string();
        let max_images = self.config.max_images.to_string();
        let bootstrap = expand(
            &spec.bootstrap,
            &[
                ("nonce", &nonce),
                ("ctl", &ctl_s),
                ("work", &work_s),
                ("out", &out_s),
                ("max_images", &max_images),
            ],
        );
        let boot_path = dirs.ctl.join(&spec.bootstrap_file);
        tokio::fs::write(&boot_path, bootstrap)
            .await
            .map_err(|e| ToolError::internal(format!("cannot write the bootstrap: {e}")))?;
        let exe = it.exe.display().to_string();
        let boot_s = boot_path.display().to_string();
        let cache_dir = self.workspace.cache_dir(it.lang.id(), lease.map(|l| l.uid));
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
        // Readable: the control directory.
        let child = ChildBuilder::new(&self.sandbox, lease, &dirs.work)
            .interpreters(&[&it.exe, &it.detected.exe])
            .writable([dirs.out.clone(), cache_dir])
            .writable(dirs.caller_cwd.clone())
            .readable([dirs.ctl.clone()])
            .language_env(language.map(|(k, v)| (k.clone(), expand(v, &vars))))
            .caller_env(caller_env)
            .build();
        Ok(Arc::new(Launch {
            sandbox: self.sandbox.clone(),
            jail: child.jail,
            argv: expand_command(&spec.command, &vars, &[]),
            env: child.env,
            cwd: dirs.cwd.clone(),
            ctl: dirs.ctl.clone(),
            nonce,
            spec: spec.clone(),
            output_cap: self.config.output_cap,
        }))
    }
}

/// Bring the requested files into `cwd` (checked first, then written off the async
/// workers); their names.
async fn bring_in(
    requested: Vec<InFile>,
    cwd: &Path,
    caller: &Caller,
) -> Result<Vec<String>, ToolError> {
    if requested.is_empty() {
        return Ok(Vec::new());
    }
    let plan = files::plan(requested, cwd, caller.is_local()).map_err(ToolError::invalid)?;
    let dest = cwd.to_path_buf();
    tokio::task::spawn_blocking(move || plan.write(&dest))
        .await
        .map_err(|e| ToolError::internal(format!("bringing the files in failed: {e}")))?
        .map_err(ToolError::invalid)
}
