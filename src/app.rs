//! The state one server holds, shared by every MCP connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::Config;
use crate::hostfs::CwdPolicy;
use crate::lang::{Registry, Why};
use crate::metrics::{Gauges, Metrics};
use crate::run::Runner;
use crate::run::warm::WarmPool;
use crate::sandbox::Sandbox;
use crate::session::SessionManager;
use crate::upstream::Upstreams;
use crate::workspace::Workspace;

pub struct App {
    pub config: Arc<Config>,
    pub registry: Arc<Registry>,
    pub(crate) sandbox: Arc<Sandbox>,
    pub runner: Runner,
    pub(crate) sessions: Arc<SessionManager>,
    /// Tool calls running now, over every connection.
    pub(crate) calls: InFlight,
    /// Counters and histograms of the calls, for `GET /metrics`.
    pub metrics: Metrics,
    /// Code mode's upstream MCP servers (`--mcp-servers`).
    pub(crate) upstreams: Arc<Upstreams>,
    /// Tool calls run as MCP tasks, of every connection.
    pub(crate) tasks: Arc<crate::tasks::Tasks>,
    /// The cluster this server is a node of (`--cluster`).
    pub(crate) cluster: Option<Arc<crate::cluster::Cluster>>,
}

/// A count of work in progress; [`InFlight::enter`] returns a guard that counts while held.
#[derive(Default, Clone)]
pub(crate) struct InFlight(Arc<AtomicUsize>);

pub(crate) struct InFlightGuard(Arc<AtomicUsize>);

impl InFlight {
    pub fn enter(&self) -> InFlightGuard {
        self.0.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.0.clone())
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The workspace, the sandbox (the level the host allows) and the languages it can run:
/// the operator's `--python` must be one; `journals` (a state directory) need a sandbox or
/// root.
fn sandbox_and_languages(
    config: &Config,
    journals: bool,
) -> anyhow::Result<(Registry, Arc<Workspace>, Arc<Sandbox>)> {
    let probe = Sandbox::probe(&config.sandbox_settings());
    let mut registry = Registry::load(config.prompts.as_deref())?;
    if let Some(python) = &config.python {
        registry
            .set_program("python", python, Why::PythonFlag)
            .map_err(|e| anyhow::anyhow!("--python {}: {e}", python.display()))?;
    }
    let workspace = Arc::new(Workspace::new(config.work_dir.as_deref())?);
    let sandbox = Arc::new(probe.finish(workspace.root())?);
    if journals && !sandbox.root && sandbox.level == crate::sandbox::Level::None {
        anyhow::bail!(
            "--state-dir needs a sandbox (level bwrap or landlock) or a server running as \
root: at level none, user code runs as the server's own user and could read the journals"
        );
    }
    registry.restrict(
        |exe| sandbox.can_run(exe),
        |exe| sandbox.cannot_run_reason(exe),
    );
    // The operator named it: one that cannot run at this level stops the server rather
    // than being replaced by another Python.
    if let Some(python) = &config.python
        && let Ok(lang) = registry.get("python")
        && let Ok(exe) = &lang.program
        && !sandbox.can_run(exe)
    {
        anyhow::bail!(
            "--python {}: {}",
            python.display(),
            sandbox.cannot_run_reason(exe)
        );
    }
    Ok((registry, workspace, sandbox))
}

/// When every uid is in use, one is taken back from the warm pools first (a head start
/// lost: run-code's, then the warm sessions), then from the kept files of ended sessions (files a caller may still read).
fn reclaim_uids_from(sandbox: &Sandbox, runner: &Runner, sessions: &Arc<SessionManager>) {
    let warm: Arc<dyn crate::sandbox::Reclaim> = runner.pool.clone();
    sandbox.add_reclaimer(Arc::downgrade(&warm));
    let warm_sessions: Arc<dyn crate::sandbox::Reclaim> = sessions.warm_pool();
    sandbox.add_reclaimer(Arc::downgrade(&warm_sessions));
    let kept: Arc<dyn crate::sandbox::Reclaim> = sessions.clone();
    sandbox.add_reclaimer(Arc::downgrade(&kept));
}

/// Flags whose values are checked when the server starts, rather than dropped later.
fn check_flags(config: &Config) -> anyhow::Result<()> {
    config.egress_policy()?;
    config.preload_modules()?;
    Ok(())
}

impl App {
    /// Load everything and decide the sandbox level. The bwrap probe runs while the registry
    /// and the workspace are set up; a named level that does not work, or one below
    /// `--require-sandbox`, is an error here, before anything is served.
    pub fn new(config: Config) -> anyhow::Result<Arc<Self>> {
        // A bad --allow-domain, --allow-host or --preload stops the server.
        check_flags(&config)?;
        // The journals' directory exists before the sandbox is decided: it is one of the
        // trees hidden from user code.
        let state = config
            .state_dir
            .as_deref()
            .map(crate::session::journal::StateDir::open)
            .transpose()?;
        let cluster = crate::cluster::Cluster::new(&config.cluster, config.state_dir.as_deref())?
            .map(Arc::new);
        let (registry, workspace, sandbox) = sandbox_and_languages(&config, state.is_some())?;
        let registry = Arc::new(registry);
        let config = Arc::new(config);
        let cwd_policy = Arc::new(CwdPolicy::new(
            workspace.root(),
            sandbox.masked(),
            &config.allow_cwd,
        ));
        let shares = crate::share::Shares::new(config.max_active_per_principal);
        let metrics = Metrics::new();
        let upstreams = Arc::new(Upstreams::new(
            &config.mcp,
            workspace.root(),
            Some(metrics.upstream()),
        )?);
        let packages = crate::packages::Packages::new(
            &config.packages,
            config.uid_base,
            sandbox.clone(),
            metrics.packages(),
        )?;
        let runner = Runner {
            packages: packages.clone(),
            upstreams: upstreams.clone(),
            config: config.clone(),
            workspace: workspace.clone(),
            pool: Arc::new(WarmPool::new(config.pool)),
            sandbox: sandbox.clone(),
            cwd_policy: cwd_policy.clone(),
            shares: shares.clone(),
        };
        let sessions = Arc::new(SessionManager::new(
            config.clone(),
            registry.clone(),
            workspace,
            sandbox.clone(),
            cwd_policy,
            state,
            shares,
        ));
        sessions.set_upstreams(upstreams.clone());
        if let Some(c) = &cluster {
            sessions.set_cluster(c.clone());
        }
        sessions.set_packages(packages);
        reclaim_uids_from(&sandbox, &runner, &sessions);
        sessions.spawn_reaper();
        let keep = std::time::Duration::from_secs(config.task_keep_s);
        // With a state directory tasks outlive the server (beside the journals, which say
        // which cell ran when it stopped).
        let tasks = Arc::new(match &config.state_dir {
            Some(dir) => crate::tasks::Tasks::open(keep, dir)?,
            None => crate::tasks::Tasks::new(keep),
        });
        Ok(Arc::new(Self {
            config,
            registry,
            sandbox,
            runner,
            sessions,
            calls: InFlight::default(),
            metrics,
            upstreams,
            tasks,
            cluster,
        }))
    }

    /// What a server starts once it answers: the removal of workspaces left by servers that
    /// are gone, the check of a remembered bwrap probe, then the warm pools. They take time or
    /// spawn processes, so they come after the transport is up rather than before.
    /// Interpreters are detected when a language is first used (a pool's fill is a use), not
    /// all at start: probing every installed language ran about 15 programs (pyenv's shim and
    /// rustup's proxy among them) for languages a server may never run.
    pub fn start_background(&self) {
        self.runner.workspace.sweep_stale_in_background();
        self.sandbox.verify_in_background();
        self.runner.fill_pools(&self.registry);
        self.sessions.fill_pools();
        if let Some(p) = &self.runner.packages {
            p.start_upkeep();
        }
    }

    /// The metrics, with the gauges read from the server's state now.
    pub fn metrics_text(&self) -> String {
        let level = self.sandbox.level.to_string();
        self.metrics.encode(Gauges {
            sessions_open: self.sessions.count(),
            warm_pool: self.runner.pool.ready(),
            warm_sessions: self.sessions.warm_pool().ready(),
            uids_in_use: self.sandbox.uids_in_use(),
            sandbox_level: &level,
        })
    }

    /// Log, once at start, the sandbox level in force and the limits calls run under.
    pub fn log_settings(&self) {
        let c = &self.config;
        let l = &self.sandbox.limits;
        tracing::info!(
            sandbox = %self.sandbox.level,
            as_root = self.sandbox.root,
            egress = %self
                .sandbox
                .egress
                .as_ref()
                .map(|e| e.policy().describe())
                .unwrap_or_else(|| "none".into()),
            memory_mb = l.memory_mb,
            processes = l.processes,
            file_size_mb = l.file_size_mb,
            open_files = l.open_files,
            cpu_s = l.cpu_s,
            tmpfs_mb = l.tmpfs_mb,
            default_timeout_ms = c.default_timeout_ms,
            max_timeout_ms = c.max_timeout_ms,
            output_cap = c.output_cap,
            max_sessions = c.max_sessions,
            max_sessions_per_principal = c.max_sessions_per_principal,
            idle_timeout_s = c.idle_timeout_s,
            pool = c.pool,
            session_pool = c.session_pool,
            uids = c.uids,
            "sandbox and limits"
        );
    }

    /// Join the cluster (`--cluster`) before serving: a registry out of reach is retried in
    /// the background, and sessions wait for it.
    pub async fn join_cluster(&self) {
        if let Some(c) = &self.cluster
            && let Err(e) = c.join().await
        {
            tracing::error!("cluster: cannot join yet ({e}); retrying every second");
        }
    }

    /// Stop everything the server started.
    pub async fn shutdown(&self) {
        // Running tasks first: while they end, their sessions are still there to record it.
        let grace = std::time::Duration::from_millis(self.config.task_stop_grace_ms);
        self.tasks.stop(grace).await;
        self.runner.pool.close();
        self.sessions.warm_pool().close();
        self.sessions.shutdown().await;
        self.upstreams.shutdown().await;
    }
}
