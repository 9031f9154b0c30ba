//! The state one server holds, shared by every MCP connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::Config;
use crate::lang::Registry;
use crate::run::Runner;
use crate::run::warm::WarmPool;
use crate::sandbox::Sandbox;
use crate::session::SessionManager;
use crate::workspace::Workspace;

pub struct App {
    pub config: Arc<Config>,
    pub registry: Arc<Registry>,
    pub(crate) sandbox: Arc<Sandbox>,
    pub runner: Runner,
    pub(crate) sessions: Arc<SessionManager>,
    /// Tool calls running now, over every connection.
    pub(crate) calls: InFlight,
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

impl App {
    /// Load everything and decide the sandbox level. The bwrap probe runs while the registry
    /// and the workspace are set up; a named level that does not work, or one below
    /// `--require-sandbox`, is an error here, before anything is served.
    pub fn new(config: Config) -> anyhow::Result<Arc<Self>> {
        let probe = Sandbox::probe(&config.sandbox_settings());
        let mut registry = Registry::load(config.prompts.as_deref())?;
        let workspace = Arc::new(Workspace::new(config.work_dir.as_deref())?);
        let sandbox = Arc::new(probe.finish(workspace.root())?);
        registry.restrict(
            |exe| sandbox.can_run(exe),
            |exe| sandbox.cannot_run_reason(exe),
        );
        let registry = Arc::new(registry);
        let config = Arc::new(config);
        let runner = Runner {
            config: config.clone(),
            workspace: workspace.clone(),
            pool: Arc::new(WarmPool::new(config.pool)),
            sandbox: sandbox.clone(),
        };
        let sessions = Arc::new(SessionManager::new(
            config.clone(),
            registry.clone(),
            workspace,
            sandbox.clone(),
        ));
        sessions.spawn_reaper();
        Ok(Arc::new(Self {
            config,
            registry,
            sandbox,
            runner,
            sessions,
            calls: InFlight::default(),
        }))
    }

    /// What a server starts once it answers: the removal of workspaces left by servers that
    /// are gone, interpreter detection, the check of a remembered bwrap probe, then the warm
    /// pools. They take time or spawn processes, so they come after the transport is up
    /// rather than before.
    pub fn start_background(&self) {
        self.runner.workspace.sweep_stale_in_background();
        self.registry.detect_all_in_background();
        self.sandbox.verify_in_background();
        self.runner.fill_pools(&self.registry);
    }

    /// Stop everything the server started.
    pub async fn shutdown(&self) {
        self.runner.pool.close();
        self.sessions.shutdown().await;
    }
}
