//! Starting a session: from a `session_start` request to a running interpreter (the
//! language, the directory and the files brought into it, the bootstrap, the environment
//! and the confinement).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::entry::Session;
use super::files::{self, InFile};
use super::interp::{Interp, Launch};
use super::manager::SessionManager;
use super::report::StartReport;
use crate::error::{ErrorKind, ToolError};
use crate::exec::child::ChildBuilder;
use crate::exec::env as cenv;
use crate::identity::Caller;
use crate::lang::{LookupError, expand, expand_command};

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

impl SessionManager {
    /// Start a session; errors are messages for the agent.
    pub async fn start(
        &self,
        caller: &Caller,
        req: StartRequest,
    ) -> Result<StartReport, ToolError> {
        let _slot = self.admit(caller).await?;
        let lang = self.registry.get(&req.language).map_err(|e| match e {
            LookupError::Unknown(n) => ToolError::new(
                ErrorKind::UnsupportedLanguage,
                format!(
                    "unknown language {n:?}. Session languages on this host: {}",
                    self.registry.session_ids().join(", ")
                ),
            ),
            LookupError::NotInstalled { id, reason } => ToolError::new(
                ErrorKind::NotInstalled,
                format!(
                    "language {id:?} is not installed on this host ({reason}). Session languages: {}",
                    self.registry.session_ids().join(", ")
                ),
            ),
        })?;
        let Some(spec) = lang.spec.session.clone() else {
            return Err(ToolError::new(
                ErrorKind::UnsupportedLanguage,
                format!(
                    "{} has no REPL driver, so it cannot hold a session; use run-code for it. Session languages: {}",
                    lang.id(),
                    self.registry.session_ids().join(", ")
                ),
            ));
        };
        for (k, v) in &req.env {
            cenv::validate_name(k)
                .and_then(|_| cenv::validate_value(k, v))
                .map_err(ToolError::invalid)?;
        }
        let cwd = match &req.cwd {
            Some(dir) => {
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
                Some(dir)
            }
            None => None,
        };
        let not_installed = |m: String| ToolError::new(ErrorKind::NotInstalled, m);
        let detected = lang
            .detect()
            .await
            .ok_or_else(|| not_installed(format!("{} is not installed", lang.id())))?
            .clone();
        let exe_path = lang.session_exe(&detected).map_err(|e| {
            not_installed(format!(
                "{} sessions cannot start on this host: {e} (run-code still works). Session languages: {}",
                lang.id(),
                self.registry.session_ids().join(", ")
            ))
        })?;
        if !self.sandbox.can_run(&exe_path) {
            return Err(not_installed(self.sandbox.cannot_run_reason(&exe_path)));
        }
        let lease = self
            .sandbox
            .lease()
            .map_err(|m| ToolError::new(ErrorKind::Limit, m))?;
        let uid = lease.as_ref().map(|l| l.uid);
        let id = uuid::Uuid::new_v4().to_string();
        let dir = self.workspace.new_session_dir(&id, uid).map_err(|e| {
            ToolError::internal(format!("cannot create the session directory: {e}"))
        })?;
        let work = dir.path().join("work");
        let ctl = dir.path().join("ctl");
        let caller_cwd = cwd.clone();
        let out = dir.path().join("out");
        let cwd = cwd.unwrap_or_else(|| work.clone());
        let brought = if req.files.is_empty() {
            Vec::new()
        } else {
            let plan =
                files::plan(req.files, &cwd, caller.is_local()).map_err(ToolError::invalid)?;
            let dest = cwd.clone();
            tokio::task::spawn_blocking(move || plan.write(&dest))
                .await
                .map_err(|e| ToolError::internal(format!("bringing the files in failed: {e}")))?
                .map_err(ToolError::invalid)?
        };
        let nonce = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
        let ctl_s = ctl.display().to_string();
        let work_s = work.display().to_string();
        let out_s = out.display().to_string();
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
        let boot_path = ctl.join(&spec.bootstrap_file);
        tokio::fs::write(&boot_path, bootstrap)
            .await
            .map_err(|e| ToolError::internal(format!("cannot write the bootstrap: {e}")))?;
        let exe = exe_path.display().to_string();
        let boot_s = boot_path.display().to_string();
        let cache_dir = self.workspace.cache_dir(lang.id(), uid);
        let cache = cache_dir.display().to_string();
        let vars = [
            ("exe", exe.as_str()),
            ("bootstrap", boot_s.as_str()),
            ("ctl", ctl_s.as_str()),
            ("work", work_s.as_str()),
            ("cache", cache.as_str()),
            ("nonce", nonce.as_str()),
        ];
        let argv = expand_command(&spec.command, &vars, &[]);
        let language = lang.spec.env.iter().chain(spec.env.iter());
        // Writable: the session's own directory, what it hands back, the build cache and a
        // caller's cwd (the kernel still decides what the session's uid may do there).
        // Readable: the control directory.
        let child = ChildBuilder::new(&self.sandbox, lease.as_ref(), &work)
            .interpreters(&[&exe_path, &detected.exe])
            .writable([out.clone(), cache_dir])
            .writable(caller_cwd)
            .readable([ctl.clone()])
            .language_env(language.map(|(k, v)| (k.clone(), expand(v, &vars))))
            .caller_env(&req.env)
            .build();
        let launch = Arc::new(Launch {
            sandbox: self.sandbox.clone(),
            jail: child.jail,
            argv,
            env: child.env,
            cwd: cwd.clone(),
            ctl,
            nonce,
            spec: spec.clone(),
            output_cap: self.config.output_cap,
        });
        let interp = Interp::start(launch, Duration::from_millis(spec.start_timeout_ms))
            .await
            .map_err(|m| ToolError::new(ErrorKind::StartFailed, m))?;
        // The baseline for the first evaluation's file changes: taken once the interpreter
        // is up, so what it wrote while starting is not taken for the code's doing.
        let mut notes = Vec::new();
        let baseline = self.baseline(&cwd).await;
        if baseline.is_none() && self.config.max_tracked_files > 0 {
            notes.push(self.untracked_note());
        }
        let idle_timeout = self.config.idle_timeout(req.idle_timeout_s);
        let pid = interp.pid;
        let now = SystemTime::now();
        let session = Arc::new(Session {
            id: id.clone(),
            owner: caller.clone(),
            lang: lang.clone(),
            cwd: cwd.clone(),
            created_at: now,
            idle_timeout,
            dir,
            out,
            files: Mutex::new(baseline),
            interp: tokio::sync::Mutex::new(Some(interp)),
            pid: AtomicU64::new(pid as u64),
            evals: AtomicU64::new(0),
            last_used: Mutex::new((now, Instant::now())),
            busy: Mutex::new(None),
            gone: Mutex::new(None),
            awaiting: Mutex::new(None),
            interrupt: Mutex::new(None),
            lease,
        });
        self.sessions.insert(id.clone(), session);
        Ok(StartReport {
            session_id: id,
            language: lang.id().to_string(),
            version: detected.version,
            pid,
            cwd: cwd.display().to_string(),
            idle_timeout_s: idle_timeout.as_secs(),
            sandbox: self.sandbox.level,
            files: brought,
            notes,
        })
    }
}
