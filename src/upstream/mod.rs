//! Code mode: the tools of other MCP servers, callable from session and `run-code` code
//! (`from replbox import tools`), so that a chain of calls runs in code and its results land
//! in variables rather than in the model's context.
//!
//! The operator names the servers (`--mcp-servers`, [`spec`]) and who may call which
//! (`--mcp-grants`); a caller picks among them per session or run (`mcp_servers`), and
//! [`Upstreams::access`] decides. Each upstream is one [`instance::Instance`] (per server, or
//! per principal), replbox being its MCP client (rmcp's). Code reaches the server through
//! its session's [`channel::Channel`] only, and each call goes through [`relay`]; what is
//! kept of it is a [`record::CallRecord`]. The modules user code imports are real files
//! under `prompts/<language>/` ([`modules`]).
//!
//! Layering: below the services (`session`, `run`), beside `egress`; uses only the leaves
//! (`identity`, `error`, `metrics`, `workspace`).

pub mod channel;
mod endpoint;
pub mod flags;
mod instance;
pub(crate) mod modules;
pub mod record;
mod relay;
pub mod spec;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::Serialize;

pub use channel::{Channel, ScopeGuard};
pub use flags::Flags;
pub use record::{CallRecord, CallSummary};
use spec::{Grants, ServerSpec, ToolSet};

use crate::error::ToolError;
use crate::identity::Caller;
use crate::metrics::UpstreamMetrics;
use instance::Instance;

/// The bounds of every channel.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_calls: u32,
    pub max_concurrent: usize,
    pub call_timeout_ms: u64,
    pub max_result_bytes: usize,
}

/// What every channel shares: the bounds and the metrics.
pub(crate) struct Shared {
    pub(crate) limits: Limits,
    pub(crate) metrics: Option<UpstreamMetrics>,
}

/// Which instance: the server, and the principal of a per-principal server.
type InstanceKey = (String, Option<String>);

/// The configured upstreams and their running instances.
pub struct Upstreams {
    specs: Vec<Arc<ServerSpec>>,
    grants: Grants,
    shared: Arc<Shared>,
    instances: Mutex<HashMap<InstanceKey, Arc<Instance>>>,
    /// Where channels' directories are made (`tools/` in the workspace).
    root: PathBuf,
}

/// One server a session or run may call, and which of its tools.
pub(crate) struct Granted {
    pub(crate) name: String,
    pub(crate) tools: ToolSet,
    pub(crate) instance: Arc<Instance>,
}

/// What one session or run may call.
pub struct Access {
    pub principal: String,
    pub(crate) servers: Vec<Granted>,
    /// Each server's tools, as listed when access was given.
    listing: Vec<ServerTools>,
}

/// A server and its callable tools.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ServerTools {
    pub name: String,
    pub tools: Vec<String>,
}

impl Access {
    pub(crate) fn get(&self, server: &str) -> Option<&Granted> {
        self.servers.iter().find(|g| g.name == server)
    }

    pub(crate) fn names(&self) -> Vec<&str> {
        self.servers.iter().map(|g| g.name.as_str()).collect()
    }

    pub fn listing(&self) -> Vec<ServerTools> {
        self.listing.clone()
    }
}

impl Upstreams {
    /// The operator's configuration (none without `--mcp-servers`); its files are read and
    /// checked now. Channels' directories go under `workspace`.
    pub fn new(
        flags: &Flags,
        workspace: &Path,
        metrics: Option<UpstreamMetrics>,
    ) -> anyhow::Result<Self> {
        let specs = match &flags.servers {
            Some(p) => spec::load_servers(p)?,
            None => Vec::new(),
        };
        let grants = match &flags.grants {
            Some(p) if flags.servers.is_none() => {
                anyhow::bail!("--mcp-grants {} needs --mcp-servers", p.display())
            }
            Some(p) => Grants::load(p, &specs)?,
            None => Grants::default(),
        };
        let root = workspace.join("tools");
        if !specs.is_empty() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o711).create(&root)?;
        }
        Ok(Self {
            specs: specs.into_iter().map(Arc::new).collect(),
            grants,
            shared: Arc::new(Shared {
                limits: Limits {
                    max_calls: flags.max_calls.max(1),
                    max_concurrent: (flags.max_concurrent as usize).max(1),
                    call_timeout_ms: flags.call_timeout_ms.max(1),
                    max_result_bytes: flags.max_result_bytes,
                },
                metrics,
            }),
            instances: Mutex::new(HashMap::new()),
            root,
        })
    }

    /// The largest message read from an upstream: a result over the bound still reads (and
    /// is refused with its size), a much larger one is dropped unread.
    fn max_message(&self) -> usize {
        self.shared
            .limits
            .max_result_bytes
            .saturating_mul(2)
            .saturating_add(1 << 20)
            .max(16 << 20)
    }

    /// What `caller` may call of the servers it asks for: each must be configured and
    /// granted, and is started now (so the answer lists its tools). None when it asks for
    /// none.
    pub async fn access(
        &self,
        caller: &Caller,
        asked: &[String],
    ) -> Result<Option<Arc<Access>>, ToolError> {
        if asked.is_empty() {
            return Ok(None);
        }
        let names: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
        let grant = self.grants.of(
            &caller.principal,
            caller.is_local(),
            &self.specs.iter().map(|s| (**s).clone()).collect::<Vec<_>>(),
        );
        let yours: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| grant.contains_key(*n))
            .collect();
        let mut servers = Vec::new();
        let mut listing = Vec::new();
        for name in asked {
            if servers.iter().any(|g: &Granted| &g.name == name) {
                continue;
            }
            let Some(spec) = self.specs.iter().find(|s| &s.name == name) else {
                return Err(ToolError::invalid(if self.specs.is_empty() {
                    "mcp_servers: this server's operator configured no MCP servers for code \
                     to call (--mcp-servers); leave mcp_servers out"
                        .to_string()
                } else {
                    format!(
                        "mcp_servers: no MCP server {name:?} here; you may use: {}",
                        if yours.is_empty() {
                            "none".into()
                        } else {
                            yours.join(", ")
                        }
                    )
                }));
            };
            let Some(tools) = grant.get(name) else {
                return Err(ToolError::invalid(format!(
                    "mcp_servers: {name:?} is not granted to you (principal {}) by this \
                     server's operator (--mcp-grants); you may use: {}",
                    caller.principal,
                    if yours.is_empty() {
                        "none".into()
                    } else {
                        yours.join(", ")
                    }
                )));
            };
            let instance = self.instance(spec, &caller.principal);
            let live = instance.get().await?;
            listing.push(ServerTools {
                name: name.clone(),
                tools: live
                    .tools
                    .iter()
                    .filter(|t| tools.allows(&t.name))
                    .map(|t| t.name.to_string())
                    .collect(),
            });
            servers.push(Granted {
                name: name.clone(),
                tools: tools.clone(),
                instance,
            });
        }
        Ok(Some(Arc::new(Access {
            principal: caller.principal.clone(),
            servers,
            listing,
        })))
    }

    /// The instance serving `principal` for `spec` (made on first use, started later).
    fn instance(&self, spec: &Arc<ServerSpec>, principal: &str) -> Arc<Instance> {
        let key = (
            spec.name.clone(),
            spec.per_principal.then(|| principal.to_string()),
        );
        self.instances
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Instance::new(spec.clone(), key.1, self.max_message())))
            .clone()
    }

    /// A channel for one session or run (`who` names it in logs) whose code runs as `uid`.
    pub fn channel(
        &self,
        access: Arc<Access>,
        who: &str,
        uid: Option<u32>,
    ) -> Result<Channel, ToolError> {
        Channel::open(&self.root, access, self.shared.clone(), who, uid)
            .map_err(|e| ToolError::internal(format!("cannot open the channel to the tools: {e}")))
    }

    /// Stop every upstream (the server is stopping).
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Instance>> = self
            .instances
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for i in all {
            i.stop().await;
        }
    }
}
