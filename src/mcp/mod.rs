//! The MCP surface: parameter and result types and the tool router. It only translates;
//! the work happens in `run`, `session` and `lang`.

pub mod params;

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};
use serde::Serialize;
use serde_json::Value;

use crate::app::App;
use crate::lang::LookupError;
use crate::run::{RunReport, RunRequest};
use params::RunCodeParams;

/// One MCP connection's handler. Cheap to clone; all state lives in [`App`].
#[derive(Clone)]
pub struct ReplboxServer {
    app: Arc<App>,
    tool_router: ToolRouter<Self>,
    instructions: Arc<String>,
}

/// A result with both a text and a structured form.
fn result<T: Serialize>(text: String, structured: &T, is_error: bool) -> CallToolResult {
    let value = serde_json::to_value(structured).unwrap_or(Value::Null);
    let mut r = if is_error {
        CallToolResult::structured_error(value)
    } else {
        CallToolResult::structured(value)
    };
    r.content = vec![ContentBlock::text(text)];
    r
}

/// A failure the agent should read: `isError` with a message saying what to do.
pub fn error_result(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

#[tool_router]
impl ReplboxServer {
    pub fn new(app: Arc<App>) -> Self {
        let mut tool_router = Self::tool_router();
        // The schema advertises the language ids installed on this host.
        let names = app.registry.available_names();
        if let Some(route) = tool_router.map.get_mut("run-code") {
            let mut schema = (*route.attr.input_schema).clone();
            if let Some(Value::Object(props)) = schema.get_mut("properties")
                && let Some(Value::Object(lang)) = props.get_mut("languageId")
            {
                lang.insert("enum".into(), Value::from(names.clone()));
            }
            route.attr.input_schema = Arc::new(schema);
        }
        let instructions = Arc::new(instructions(&app));
        Self {
            app,
            tool_router,
            instructions,
        }
    }

    /// Run a program once and return its output: a fresh process in a fresh private
    /// directory, nothing kept afterwards.
    #[tool(
        name = "run-code",
        description = "Run a code snippet once in a fresh process and private directory and return its output. \
On exit 0 with nothing on stderr the text is exactly stdout; otherwise stdout, stderr and a trailer such as \
[exit code 3] or [timed out after 2000 ms]. Optional: stdin, args, env, timeout_ms. Nothing is kept between \
calls; use session_start/session_eval to keep state.",
        output_schema = schema_for_output::<RunReport>(),
        annotations(
            title = "Run code",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_code(
        &self,
        Parameters(p): Parameters<RunCodeParams>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let lang = match self.app.registry.get(&p.language_id) {
            Ok(l) => l,
            Err(e) => return error_result(self.lookup_message(&e)),
        };
        for (k, v) in &p.env {
            if let Err(msg) = crate::exec::env::validate_name(k)
                .and_then(|_| crate::exec::env::validate_value(k, v))
            {
                return error_result(msg);
            }
        }
        let req = RunRequest {
            code: p.code,
            stdin: p.stdin,
            args: p.args,
            env: p.env,
            timeout: self.app.config.timeout(p.timeout_ms),
        };
        let report = self.app.runner.run(&lang, req, &ctx.ct).await;
        result(report.text(), &report, !report.success())
    }
}

impl ReplboxServer {
    fn lookup_message(&self, e: &LookupError) -> String {
        let available = self.app.registry.available_names().join(", ");
        match e {
            LookupError::Unknown(name) => format!(
                "unknown language {name:?}. Available language ids on this host: {available}"
            ),
            LookupError::NotInstalled { id, reason } => format!(
                "language {id:?} is not installed on this host ({reason}). Available language ids: {available}"
            ),
        }
    }
}

fn instructions(app: &App) -> String {
    let installed = app.registry.installed_ids().join(", ");
    format!(
        "replbox runs code for you.\n\
- run-code: run a snippet once (fresh process, private directory, nothing kept). Use it for one-off checks. \
Languages installed here: {installed}.\n\
Limits: default timeout {} ms (ask for up to {} ms with timeout_ms); output keeps the first and last {} KiB \
of each stream.",
        app.config.default_timeout_ms,
        app.config.max_timeout_ms,
        app.config.output_cap / 1024,
    )
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ReplboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("replbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.instructions.as_str())
    }
}
