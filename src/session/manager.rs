//! The sessions of one server: the [`Table`] and the services over it, and the calls the
//! tools make, each checked against the caller (another principal's session is unknown).

use std::collections::HashSet;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::evaluate::{Answer, Evaluator, VarsReport};
use super::journal::StateDir;
use super::launch::Launcher;
use super::launch::warm::{SessionPool, WarmSessions};
use super::live::Session;
use super::persist::Journals;
use super::report::{EvalReport, EvalStatus, InterruptReport};
use super::table::{Miss, Table};
use crate::config::Config;
use crate::error::{ErrorKind, ToolError};
use crate::hostfs::CwdPolicy;
use crate::identity::Caller;
use crate::lang::Registry;
use crate::progress::Progress;
use crate::sandbox::Sandbox;
use crate::share::Shares;
use crate::workspace::{DirId, Workspace};

/// The sessions, shared by every MCP connection.
pub struct SessionManager {
    pub(super) config: Arc<Config>,
    pub(super) registry: Arc<Registry>,
    pub(super) workspace: Arc<Workspace>,
    pub(super) sandbox: Arc<Sandbox>,
    /// Every session id this server knows.
    pub(super) table: Table,
    /// Starts interpreters.
    pub(super) launcher: Arc<Launcher>,
    /// Sessions started ahead of time (`--session-pool`).
    pub(super) warm: Arc<WarmSessions>,
    /// Runs evaluations.
    pub(super) evaluator: Evaluator,
    /// The journals (`--state-dir`).
    pub(super) journals: Journals,
    /// Every principal's share of sessions and runs (shared with `run-code`).
    pub(super) shares: Arc<Shares>,
    /// The cluster this server is a node of (`--cluster`).
    pub(super) cluster: OnceLock<Arc<crate::cluster::Cluster>>,
}

impl SessionManager {
    /// The sessions; with a state directory (checked and locked already), its journals are
    /// read: their sessions are suspended.
    pub fn new(
        config: Arc<Config>,
        registry: Arc<Registry>,
        workspace: Arc<Workspace>,
        sandbox: Arc<Sandbox>,
        cwd_policy: Arc<CwdPolicy>,
        state: Option<StateDir>,
        shares: Arc<Shares>,
    ) -> Self {
        let launcher = Arc::new(Launcher::new(
            config.clone(),
            registry.clone(),
            workspace.clone(),
            sandbox.clone(),
            cwd_policy,
        ));
        let warm = Arc::new(WarmSessions::new(
            config.session_pool,
            config.preload_modules().unwrap_or_default(),
            launcher.clone(),
            registry.clone(),
        ));
        let skip: Vec<DirId> = workspace.root_id().into_iter().collect();
        let me = Self {
            table: Table::new(config.max_ended_sessions, config.max_sessions),
            evaluator: Evaluator::new(config.clone(), skip),
            journals: Journals::new(config.clone(), state),
            config,
            registry,
            workspace,
            sandbox,
            launcher,
            warm,
            shares,
            cluster: OnceLock::new(),
        };
        me.journals.load(&me.table);
        me
    }

    /// Give sessions their way to code mode's upstream MCP servers.
    pub fn set_upstreams(&self, upstreams: Arc<crate::upstream::Upstreams>) {
        let _ = self.launcher.upstreams.set(upstreams);
    }

    /// Give sessions their packages service.
    pub fn set_packages(&self, packages: Option<Arc<crate::packages::Packages>>) {
        let _ = self.launcher.packages.set(packages);
    }

    pub fn count(&self) -> usize {
        self.table.read(|st| st.open().count())
    }

    /// Principals that hold at least one open session.
    pub fn owners(&self) -> usize {
        self.table.read(|st| {
            st.open()
                .map(|s| &s.owner)
                .collect::<HashSet<&Caller>>()
                .len()
        })
    }

    /// The pool of warm sessions (for the sandbox's reclaimers and the metrics).
    pub fn warm_pool(&self) -> Arc<SessionPool> {
        self.warm.pool()
    }

    /// Start filling the warm pools (`serve` does this once it answers) and keep them.
    pub fn fill_pools(&self) {
        self.warm.fill();
    }

    /// Directories a session's listing never enters and a read never goes through: the
    /// server's workspace (other sessions' directories), should a caller's cwd contain it.
    pub(super) fn skip_dirs(&self) -> Vec<DirId> {
        self.workspace.root_id().into_iter().collect()
    }

    /// Close idle sessions, and forget what is kept too long, in the background for as
    /// long as the manager lives.
    pub fn spawn_reaper(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let Some(me) = weak.upgrade() else { return };
                me.reap_idle().await;
                me.expire_kept().await;
                me.journals.expire(&me.table).await;
            }
        });
    }

    /// Find a session of this caller. Another principal's session is "no session", so
    /// its existence is not revealed.
    pub(super) fn lookup(&self, caller: &Caller, id: &str) -> Result<Arc<Session>, ToolError> {
        self.table
            .open(caller, id)
            .map_err(|miss| self.miss_error(id, miss))
    }

    /// The error for a call on an id that is not an open session of the caller.
    pub(super) fn miss_error(&self, id: &str, miss: Miss) -> ToolError {
        match miss {
            Miss::Unknown => ToolError::new(
                ErrorKind::UnknownSession,
                format!(
                    "no session {id:?}. Start one with session_start, or see session_list for the open ones."
                ),
            )
            .session(id),
            Miss::Starting => ToolError::new(
                ErrorKind::Busy,
                format!(
                    "session {id} is being restored by another call. Try again once that call \
has returned."
                ),
            )
            .session(id),
            Miss::Ended(how) => {
                ToolError::new(ErrorKind::EndedSession, how.message(id)).session(id)
            }
            Miss::Suspended(s) => self.journals.suspended_error(&s),
        }
    }

    /// The language id of one of the caller's open sessions (for logs and metrics).
    pub fn language_of(&self, caller: &Caller, id: &str) -> Option<String> {
        self.table
            .open(caller, id)
            .ok()
            .map(|s| s.lang.id().to_string())
    }

    /// Whether the caller's session `id` is still paused on evaluation `eval`, its program
    /// waiting for input (false once it was answered, interrupted or ended, by any call).
    pub fn awaits_input(&self, caller: &Caller, id: &str, eval: u64) -> bool {
        self.table.open(caller, id).ok().is_some_and(
            |s| matches!(s.phase(), super::live::Phase::AwaitingInput { eval: e, .. } if e == eval),
        )
    }

    /// Why the caller's session `id` is not open (ended, reaped, suspended, unknown), or
    /// None while it is.
    pub fn not_open(&self, caller: &Caller, id: &str) -> Option<ToolError> {
        self.lookup(caller, id).err()
    }

    /// Evaluate code in a session; a suspended one is restored first (unless the operator
    /// said not to).
    pub async fn eval(
        &self,
        caller: &Caller,
        id: &str,
        code: &str,
        timeout: Duration,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<EvalReport, ToolError> {
        self.cluster_gate(caller, id).await?;
        let restored = if self.journals.restores_on_eval(&self.table, caller, id) {
            Some(self.restore(caller, id).await?)
        } else {
            None
        };
        let session = self.lookup(caller, id)?;
        let report = self
            .evaluator
            .eval(&self.table, &session, code, timeout, cancel, progress)
            .await;
        self.after_call(&session).await;
        let mut report = report?;
        if let Some(e) = self
            .handed_over(&session, report.status == EvalStatus::Exited)
            .await
        {
            return Err(e);
        }
        if let Some(r) = restored {
            report.notes.insert(
                0,
                format!(
                    "session {id} was suspended: it was restored first ({} cell(s) replayed in {} \
ms{})",
                    r.replayed,
                    r.duration_ms,
                    if r.failed.is_empty() {
                        String::new()
                    } else {
                        format!(", {} failed on replay", r.failed.len())
                    }
                ),
            );
            // What the restore said (a cell not run again among it) is this call's news too.
            for (i, n) in r.notes.into_iter().enumerate() {
                report.notes.insert(1 + i, n);
            }
            report.replayed = Some(r.replayed);
            report.replay_failed = r.failed;
        }
        Ok(report)
    }

    /// Answer an evaluation that is waiting for input.
    pub async fn input(
        &self,
        caller: &Caller,
        id: &str,
        answer: Answer<'_>,
        timeout: Duration,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<EvalReport, ToolError> {
        self.cluster_gate(caller, id).await?;
        let session = self.lookup(caller, id)?;
        let text = (answer.text, answer.enter);
        let report = self
            .evaluator
            .input(&self.table, &session, text, timeout, cancel, progress)
            .await;
        self.after_call(&session).await;
        let report = report?;
        match self
            .handed_over(&session, report.status == EvalStatus::Exited)
            .await
        {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Interrupt the evaluation that is waiting for input, or the one running in another call.
    pub async fn interrupt(&self, caller: &Caller, id: &str) -> Result<InterruptReport, ToolError> {
        self.cluster_gate(caller, id).await?;
        let session = self.lookup(caller, id)?;
        let report = self.evaluator.interrupt(&self.table, &session).await;
        self.after_call(&session).await;
        let report = report?;
        let exited = report
            .result
            .as_ref()
            .is_some_and(|r| r.status == EvalStatus::Exited);
        match self.handed_over(&session, exited).await {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Look at one name of the caller's session `id` within `budget` bytes.
    pub async fn inspect(
        &self,
        caller: &Caller,
        id: &str,
        name: &str,
        budget: usize,
        timeout: Duration,
    ) -> Result<crate::session::evaluate::InspectReport, ToolError> {
        self.cluster_gate(caller, id).await?;
        let session = self.lookup(caller, id)?;
        let report = self
            .evaluator
            .inspect(&self.table, &session, name, budget, timeout)
            .await;
        self.after_call(&session).await;
        report
    }

    /// List the names the user defined in the caller's session `id`.
    pub async fn vars(
        &self,
        caller: &Caller,
        id: &str,
        timeout: Duration,
    ) -> Result<VarsReport, ToolError> {
        self.cluster_gate(caller, id).await?;
        let session = self.lookup(caller, id)?;
        let report = self.evaluator.vars(&self.table, &session, timeout).await;
        self.after_call(&session).await;
        report
    }
}
