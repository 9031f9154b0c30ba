//! The state one server holds, shared by every MCP connection.

use std::sync::Arc;

use crate::config::Config;
use crate::lang::Registry;
use crate::run::Runner;
use crate::session::SessionManager;
use crate::workspace::Workspace;

pub struct App {
    pub config: Arc<Config>,
    pub registry: Arc<Registry>,
    pub workspace: Arc<Workspace>,
    pub runner: Runner,
    pub sessions: Arc<SessionManager>,
}

impl App {
    pub fn new(config: Config) -> anyhow::Result<Arc<Self>> {
        let registry = Arc::new(Registry::load(config.prompts.as_deref())?);
        let workspace = Arc::new(Workspace::new(config.work_dir.as_deref())?);
        let config = Arc::new(config);
        let runner = Runner {
            config: config.clone(),
            workspace: workspace.clone(),
        };
        let sessions = Arc::new(SessionManager::new(
            config.clone(),
            registry.clone(),
            workspace.clone(),
        ));
        sessions.spawn_reaper();
        Ok(Arc::new(Self {
            config,
            registry,
            workspace,
            runner,
            sessions,
        }))
    }

    /// Stop everything the server started.
    pub async fn shutdown(&self) {
        self.sessions.shutdown().await;
    }
}
