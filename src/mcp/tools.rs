//! The tools: each translates its parameters into a call of `run` or `session` and the
//! answer into a tool result.

use rmcp::handler::server::tool::{Extension, schema_for_output};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};

use super::ReplboxServer;
use super::params::{
    RunCodeParams, SessionEvalParams, SessionIdParams, SessionInputParams, SessionStartParams,
};
use super::reply::{eval_result, progress_reporter, result};
use crate::error::ToolError;
use crate::identity::Caller;
use crate::run::{RunReport, RunRequest};
use crate::session::{
    CloseReport, EvalReport, InFile, InterruptReport, ListReport, StartReport, StartRequest,
};

#[tool_router(vis = "pub(super)")]
impl ReplboxServer {
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
    ) -> Result<CallToolResult, ToolError> {
        let lang = self
            .app
            .registry
            .get(&p.language_id)
            .map_err(|e| self.lookup_error(&e))?;
        let timeout = self.app.config.timeout(p.timeout_ms);
        let req = RunRequest {
            code: p.code,
            stdin: p.stdin,
            args: p.args,
            env: p.env,
            timeout,
        };
        req.check()?;
        let progress = progress_reporter(&ctx, timeout);
        let report = self
            .app
            .runner
            .run(&lang, req, &ctx.ct, progress.as_deref())
            .await;
        Ok(result(report.text(), &report, !report.success()))
    }

    /// Start a persistent interpreter session.
    #[tool(
        name = "session_start",
        // Replaced in `build` by one that names the languages installed here.
        description = "Start a persistent interpreter session in a fresh private directory (or `cwd`).",
        output_schema = schema_for_output::<StartReport>(),
        annotations(title = "Start session", read_only_hint = false, destructive_hint = false,
                    idempotent_hint = false, open_world_hint = false)
    )]
    async fn session_start(
        &self,
        Parameters(p): Parameters<SessionStartParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let req = StartRequest {
            language: p.language,
            cwd: p.cwd.map(std::path::PathBuf::from),
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
        };
        let r = self.app.sessions.start(&caller, req).await?;
        let mut text = format!(
            "session {} started: {} {} (pid {}) in {} (sandbox: {})",
            r.session_id, r.language, r.version, r.pid, r.cwd, r.sandbox
        );
        if !r.files.is_empty() {
            text.push_str(&format!("\nfiles brought in: {}", r.files.join(", ")));
        }
        for n in &r.notes {
            text.push_str(&format!("\n[{n}]"));
        }
        Ok(result(text, &r, false))
    }

    /// Evaluate code in a session.
    #[tool(
        name = "session_eval",
        description = "Evaluate code in a session, as if typed at its REPL: any number of lines, state kept. \
Returns what the terminal showed (the value of a trailing expression included) and a status: ok, error \
(the code raised), timeout (interrupted at timeout_ms; state kept), exited (the interpreter ended) or \
awaiting_input (the code is reading stdin).",
        output_schema = schema_for_output::<EvalReport>(),
        annotations(title = "Evaluate in session", read_only_hint = false, destructive_hint = false,
                    idempotent_hint = false, open_world_hint = false)
    )]
    async fn session_eval(
        &self,
        Parameters(p): Parameters<SessionEvalParams>,
        Extension(caller): Extension<Caller>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let timeout = self.app.config.timeout(p.timeout_ms);
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
        Ok(eval_result(&r))
    }

    /// Answer a program waiting for input.
    #[tool(
        name = "session_input",
        description = "Answer a program that is waiting for input (session_eval returned status \
awaiting_input): `text` is typed followed by Enter, and the same evaluation continues. Returns the same \
shape as session_eval, with the output printed after the answer.",
        output_schema = schema_for_output::<EvalReport>(),
        annotations(title = "Answer input", read_only_hint = false, destructive_hint = false,
                    idempotent_hint = false, open_world_hint = false)
    )]
    async fn session_input(
        &self,
        Parameters(p): Parameters<SessionInputParams>,
        Extension(caller): Extension<Caller>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let timeout = self.app.config.timeout(p.timeout_ms);
        let progress = progress_reporter(&ctx, timeout);
        let r = self
            .app
            .sessions
            .input(
                &caller,
                &p.session_id,
                &p.text,
                timeout,
                &ctx.ct,
                progress.as_deref(),
            )
            .await?;
        Ok(eval_result(&r))
    }

    /// Interrupt a session's evaluation.
    #[tool(
        name = "session_interrupt",
        description = "Interrupt (Ctrl-C) the evaluation of a session that is waiting for input or running \
in another call. The session keeps its state.",
        output_schema = schema_for_output::<InterruptReport>(),
        annotations(title = "Interrupt session", read_only_hint = false, destructive_hint = false,
                    idempotent_hint = false, open_world_hint = false)
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
            out.structured_content = serde_json::to_value(&r).ok();
            out.is_error = Some(false);
            return Ok(out);
        }
        let text = if r.interrupted {
            format!(
                "interrupted evaluation {} of session {}",
                r.eval_id.unwrap_or_default(),
                r.session_id
            )
        } else {
            format!("session {} has nothing to interrupt", r.session_id)
        };
        Ok(result(text, &r, false))
    }

    /// Close a session.
    #[tool(
        name = "session_close",
        description = "Close a session: its interpreter and everything it started are killed and its private \
directory is removed.",
        output_schema = schema_for_output::<CloseReport>(),
        annotations(title = "Close session", read_only_hint = false, destructive_hint = true,
                    idempotent_hint = true, open_world_hint = false)
    )]
    async fn session_close(
        &self,
        Parameters(p): Parameters<SessionIdParams>,
        Extension(caller): Extension<Caller>,
    ) -> Result<CallToolResult, ToolError> {
        let r = self.app.sessions.close(&caller, &p.session_id).await?;
        Ok(result(
            format!("session {} closed", r.session_id),
            &r,
            false,
        ))
    }

    /// List open sessions.
    #[tool(
        name = "session_list",
        description = "List the open sessions with their language, pid, directory, idle time and whether \
an evaluation is running.",
        output_schema = schema_for_output::<ListReport>(),
        annotations(title = "List sessions", read_only_hint = true, destructive_hint = false,
                    idempotent_hint = true, open_world_hint = false)
    )]
    async fn session_list(&self, Extension(caller): Extension<Caller>) -> CallToolResult {
        let r = self.app.sessions.list(&caller);
        let mut text = String::new();
        if r.sessions.is_empty() {
            text.push_str("no open sessions");
        }
        for s in &r.sessions {
            text.push_str(&format!(
                "{} {} pid {} evals {} idle {} s{} {}\n",
                s.session_id,
                s.language,
                s.pid,
                s.evals,
                s.idle_s,
                if s.busy { " busy" } else { "" },
                s.cwd
            ));
        }
        result(text, &r, false)
    }
}
