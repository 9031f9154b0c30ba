//! The state one server holds, shared by every MCP connection.

use std::sync::Arc;

use crate::config::Config;
use crate::lang::Registry;
use crate::run::Runner;
use crate::sandbox::Sandbox;
use crate::session::SessionManager;
use crate::workspace::Workspace;

pub struct App {
    pub config: Arc<Config>,
    pub registry: Arc<Registry>,
    pub workspace: Arc<Workspace>,
    pub sandbox: Arc<Sandbox>,
    pub runner: Runner,
    pub sessions: Arc<SessionManager>,
}

impl App {
    /// Load everything and decide the sandbox level. The bwrap probe runs while the registry
    /// and the workspace are set up; a named level that does not work, or one below
    /// `--require-sandbox`, is an error here, before anything is served.
    pub fn new(config: Config) -> anyhow::Result<Arc<Self>> {
        let probe = Sandbox::probe(&config);
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
            sandbox: sandbox.clone(),
        };
        let sessions = Arc::new(SessionManager::new(
            config.clone(),
            registry.clone(),
            workspace.clone(),
            sandbox.clone(),
        ));
        Ok(Arc::new(Self {
            config,
            registry,
            workspace,
            sandbox,
            runner,
            sessions,
        }))
    }

    /// Stop everything the server started.
    pub async fn shutdown(&self) {
        self.sessions.shutdown().await;
    }
}
