//! The tools: each translates its parameters into a call of `run` or `session` and the
//! answer into a tool result (its text and contents are `crate::present`'s).

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};

use super::params::{
    ExportFormat, RunCodeParams, SessionEvalParams, SessionExportParams, SessionIdParams,
    SessionInputParams, SessionInspectParams, SessionStartParams, SessionVarsParams,
};
use super::reply::{
    announce_files, eval_result, progress_reporter, result, structured_value, with_content,
};
use super::{ReplboxServer, schema};
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;
use crate::present::already_closed;
use crate::run::{RunReport, RunRequest};
use crate::session::evaluate::{InspectReport, MAX_BUDGET, MIN_BUDGET, VarsReport};
use crate::session::history::HistoryReport;
use crate::session::present::export::{ExportReport, Format};
use crate::session::report::RestoreReport;
use crate::session::{
    Answer, CloseReport, EvalReport, InFile, InterruptReport, ListReport, StartReport, StartRequest,
};
use schemars::JsonSchema;
use serde::Serialize;

/// What `session_close` returns: the session's end, or that it had ended before.
#[derive(Serialize, JsonSchema)]
struct Closed {
    #[serde(flatten)]
    report: CloseReport,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    already_closed: bool,
}

impl Closed {
    fn now(report: CloseReport) -> Self {
        Closed {
            report,
            already_closed: false,
        }
    }

    fn already(id: &str) -> Self {
        Closed {
            report: CloseReport {
                session_id: id.to_string(),
                closed: true,
                exit_code: None,
            },
            already_closed: true,
        }
    }
}

#[tool_router(vis = "pub(super)")]
impl ReplboxServer {
    /// Run a program once and return its output: a fresh process in a fresh private
    /// directory, nothing kept afterwards.
    #[tool(
        name = "run-code",
        description = "Run a snippet once in a fresh process and directory; nothing is kept. Text: stdout on exit 0 with \
empty stderr, else stdout, stderr and a trailer ([exit code 3], [timed out after 2000 ms]).",
        input_schema = schema::input::<RunCodeParams>(),
        output_schema = schema::output::<RunReport>(),
        annotations(
            title = "Run code",
            destructive_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_code(
        &self,
        Parameters(p): Parameters<RunCodeParams>,
        Extension(caller): Extension<Caller>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let lang = self
            .app
            .registry
            .get(&p.language_id)
            .map_err(|e| self.lookup_error(&e))?;
        let timeout = deadline(&self.app.config, p.timeout_ms)?;
        let req = RunRequest {
            code: p.code,
            stdin: p.stdin,
            args: p.args,
            env: p.env,
            timeout,
            venv: p.venv.map(std::path::PathBuf::from),
            principal: caller.principal.clone(),
            allow_domains: p.allow_domains,
            mcp_servers: p.mcp_servers,
            packages: p.packages,
        };
        let progress = progress_reporter(&ctx, timeout);
        let report = self
            .app
            .runner
            .run_for(&caller, &lang, req, &ctx.ct, progress.as_deref())
            .await?;
        Ok(result(report.text(), &report, !report.success()))
    }

    /// Start a persistent interpreter session.
    #[tool(
        name = "session_start",
        // Replaced in `build` by one that names the languages installed here.
        description = "Start a persistent interpreter session in a fresh private directory (or `cwd`).",
        input_schema = schema::input::<SessionStartParams>(),
        output_schema = schema::output::<StartReport>(),
        annotations(title = "Start session", destructive_hint = false,
                    open_world_hint = false)
    )]
    async fn session_start(
        &self,
        Parameters(p): Parameters<SessionStartParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let req = StartRequest {
            language: p.language,
            cwd: p.cwd.map(std::path::PathBuf::from),
            venv: p.venv.map(std::path::PathBuf::from),
            env: p.env,
            idle_timeout_s: p.idle_timeout_s,
            files: p
                .files
                .into_iter()
                .map(|f| InFile {
                    name: f.name,
                    path: f.path.map(std::path::PathBuf::from),
                    content: f.content,
                })
                .collect(),
            allow_domains: p.allow_domains,
            mcp_servers: p.mcp_servers,
            packages: p.packages,
        };
        let r = self.app.sessions.start(&caller, req).await?;
        Ok(result(r.text(), &r, false))
    }

    /// Evaluate code in a session.
    #[tool(
        name = "session_eval",
        description = "Run code in a session as at its REPL, state kept. Returns what the terminal showed (with a \
trailing expression's value) and a status: ok, error, timeout (interrupted, state kept), exited or awaiting_input.",
        input_schema = schema::input::<SessionEvalParams>(),
        output_schema = schema::output::<EvalReport>(),
        annotations(title = "Evaluate", destructive_hint = false,
                    open_world_hint = false)
    )]
    async fn session_eval(
        &self,
        Parameters(p): Parameters<SessionEvalParams>,
        Extension(caller): Extension<Caller>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let timeout = deadline(&self.app.config, p.timeout_ms)?;
        let progress = progress_reporter(&ctx, timeout);
        let r = self
            .app
            .sessions
            .eval(
                &caller,
                &p.session_id,
                &p.code,
                timeout,
                &ctx.ct,
                progress.as_deref(),
            )
            .await?;
        announce_files(&ctx, &r).await;
        Ok(eval_result(&r))
    }

    /// Answer a program waiting for input.
    #[tool(
        name = "session_input",
        description = "Answer a program waiting for input (awaiting_input) with `text`; the evaluation goes on \
as in session_eval. Unread input is discarded, never run.",
        input_schema = schema::input::<SessionInputParams>(),
        output_schema = schema::output::<EvalReport>(),
        annotations(title = "Answer input", destructive_hint = false,
                    open_world_hint = false)
    )]
    async fn session_input(
        &self,
        Parameters(p): Parameters<SessionInputParams>,
        Extension(caller): Extension<Caller>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let timeout = deadline(&self.app.config, p.timeout_ms)?;
        let progress = progress_reporter(&ctx, timeout);
        let r = self
            .app
            .sessions
            .input(
                &caller,
                &p.session_id,
                Answer {
                    text: &p.text,
                    enter: p.enter.unwrap_or(true),
                },
                timeout,
                &ctx.ct,
                progress.as_deref(),
            )
            .await?;
        announce_files(&ctx, &r).await;
        Ok(eval_result(&r))
    }

    /// Interrupt a session's evaluation.
    #[tool(
        name = "session_interrupt",
        description = "Interrupt (Ctrl-C) a session's running or input-waiting evaluation; state kept. `result` is \
as from session_eval.",
        input_schema = schema::input::<SessionIdParams>(),
        output_schema = schema::output::<InterruptReport>(),
        annotations(title = "Interrupt", destructive_hint = false,
                    open_world_hint = false)
    )]
    async fn session_interrupt(
        &self,
        Parameters(p): Parameters<SessionIdParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let r = self.app.sessions.interrupt(&caller, &p.session_id).await?;
        if let Some(res) = &r.result {
            // The paused evaluation's own result, images included.
            let mut out = eval_result(res);
            out.structured_content = Some(structured_value(&r));
            out.is_error = Some(false);
            return Ok(out);
        }
        Ok(result(r.text(), &r, false))
    }

    /// Close a session.
    #[tool(
        name = "session_close",
        description = "Close a session: its processes killed, its files readable for a while. Closing a \
closed session succeeds.",
        input_schema = schema::input::<SessionIdParams>(),
        output_schema = schema::output::<Closed>(),
        annotations(title = "Close session", destructive_hint = true,
                    idempotent_hint = true, open_world_hint = false)
    )]
    async fn session_close(
        &self,
        Parameters(p): Parameters<SessionIdParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let (text, closed) = match self.app.sessions.close(&caller, &p.session_id).await {
            Ok(r) => (r.text(), Closed::now(r)),
            // Closing is idempotent: a session that has ended is closed already.
            Err(e) if e.kind == ErrorKind::EndedSession => {
                (already_closed(&e), Closed::already(&p.session_id))
            }
            Err(e) => return Err(e),
        };
        Ok(result(text, &closed, false))
    }

    /// A session's cells.
    #[tool(
        name = "session_history",
        description = "A session's cells in order (code, status, error, duration; the newest kept), open, ended or \
suspended.",
        input_schema = schema::input::<SessionIdParams>(),
        output_schema = schema::output::<HistoryReport>(),
        annotations(title = "History", read_only_hint = true,
                    open_world_hint = false)
    )]
    async fn session_history(
        &self,
        Parameters(p): Parameters<SessionIdParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let r = self.app.sessions.history(&caller, &p.session_id).await?;
        Ok(result(r.text(), &r, false))
    }

    /// A session as a notebook or a script.
    #[tool(
        name = "session_export",
        description = "Export a session's cells as a Jupyter notebook (ipynb) or a `# %%` script, as an embedded \
resource (also replbox://sessions/{id}/export.ipynb, .py, …).",
        input_schema = schema::input::<SessionExportParams>(),
        output_schema = schema::output::<ExportReport>(),
        annotations(title = "Export", read_only_hint = true,
                    open_world_hint = false)
    )]
    async fn session_export(
        &self,
        Parameters(p): Parameters<SessionExportParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let format = match p.format {
            ExportFormat::Ipynb => Format::Ipynb,
            ExportFormat::Script => Format::Script,
        };
        let r = self
            .app
            .sessions
            .export(&caller, &p.session_id, format)
            .await?;
        Ok(with_content(r.content(), &r, false))
    }

    /// Restore a suspended session.
    #[tool(
        name = "session_restore",
        description = "Start a suspended session again: a fresh interpreter replays its successful \
cells in order, side effects included.",
        input_schema = schema::input::<SessionIdParams>(),
        output_schema = schema::output::<RestoreReport>(),
        annotations(title = "Restore", destructive_hint = false,
                    open_world_hint = false)
    )]
    async fn session_restore(
        &self,
        Parameters(p): Parameters<SessionIdParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let r = self.app.sessions.restore(&caller, &p.session_id).await?;
        Ok(result(r.text(), &r, false))
    }

    /// What a session defined.
    #[tool(
        name = "session_vars",
        description = "The names a session defined (variables, functions, classes) with type, summary (shape, dtypes) \
and size, printing nothing.",
        input_schema = schema::input::<SessionVarsParams>(),
        output_schema = schema::output::<VarsReport>(),
        annotations(title = "Variables", read_only_hint = true,
                    open_world_hint = false)
    )]
    async fn session_vars(
        &self,
        Parameters(p): Parameters<SessionVarsParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let timeout = deadline(&self.app.config, Some(p.timeout_ms.unwrap_or(10_000)))?;
        let r = self
            .app
            .sessions
            .vars(&caller, &p.session_id, timeout)
            .await?;
        Ok(result(r.text(), &r, false))
    }

    /// One name of a session, on a budget.
    #[tool(
        name = "session_inspect",
        description = "One variable within budget_bytes, printing nothing: frame schema and rows, \
array stats, source.",
        input_schema = schema::input::<SessionInspectParams>(),
        output_schema = schema::output::<InspectReport>(),
        annotations(title = "Inspect", read_only_hint = true, open_world_hint = false)
    )]
    async fn session_inspect(
        &self,
        Parameters(p): Parameters<SessionInspectParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let budget = p
            .budget_bytes
            .unwrap_or(crate::session::evaluate::DEFAULT_BUDGET as u64);
        if !(MIN_BUDGET as u64..=MAX_BUDGET as u64).contains(&budget) {
            return Err(ToolError::invalid(format!(
                "budget_bytes is {budget}; give {MIN_BUDGET} to {MAX_BUDGET}"
            )));
        }
        let timeout = deadline(&self.app.config, Some(30_000))?;
        let r = self
            .app
            .sessions
            .inspect(&caller, &p.session_id, &p.name, budget as usize, timeout)
            .await?;
        Ok(result(r.text(), &r, false))
    }

    /// List open sessions.
    #[tool(
        name = "session_list",
        description = "Open sessions (language, pid, directory, idle time, busy), then recently ended (files kept a \
while) and suspended ones (`ended`).",
        output_schema = schema::output::<ListReport>(),
        annotations(title = "List sessions", read_only_hint = true,
                    open_world_hint = false)
    )]
    async fn session_list(&self, Extension(caller): Extension<Caller>) -> CallToolResult {
        self.app.sessions.cluster_prune(&caller).await;
        let r = self.app.sessions.list(&caller);
        result(r.text(), &r, false)
    }
}

/// A caller's `timeout_ms`, clamped to the operator's maximum. 0 is refused: it would
/// interrupt the code before it could start, and a caller who sends it mostly means "no
/// limit", which no deadline gives (docs/tools.md, Deadlines).
fn deadline(
    config: &crate::config::Config,
    timeout_ms: Option<u64>,
) -> Result<std::time::Duration, ToolError> {
    if timeout_ms == Some(0) {
        return Err(ToolError::invalid(format!(
            "`timeout_ms` must be at least 1 (milliseconds), not 0: leave it out for the \
             default of {} ms, or ask for up to {} ms",
            config.default_timeout_ms, config.max_timeout_ms
        )));
    }
    Ok(config.timeout(timeout_ms))
}
