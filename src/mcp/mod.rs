//! The MCP surface: parameter and result types and the tool router. It only translates;
//! the work happens in `run`, `session` and `lang`.

pub mod params;

use std::sync::Arc;

use base64::Engine;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{ToolCallContext, schema_for_output};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use serde::Serialize;
use serde_json::Value;

use crate::app::App;
use crate::lang::LookupError;
use crate::run::{RunReport, RunRequest};
use crate::session::files::{URI_TEMPLATE, file_uri, parse_uri};
use crate::session::interp::Progress;
use crate::session::{
    Caller, CloseReport, EvalReport, FileError, InFile, InterruptReport, ListReport, StartReport,
    StartRequest,
};
use params::{
    RunCodeParams, SessionEvalParams, SessionIdParams, SessionInputParams, SessionStartParams,
};

/// One MCP connection's handler. Cheap to clone; all state lives in [`App`].
#[derive(Clone)]
pub struct ReplboxServer {
    app: Arc<App>,
    /// Who the calls come from (sessions belong to them).
    caller: CallerSource,
    tool_router: ToolRouter<Self>,
    instructions: Arc<String>,
}

/// Where a handler learns its caller.
#[derive(Clone)]
enum CallerSource {
    /// One principal for the whole connection (stdio).
    Fixed(Caller),
    /// Each request carries its own: the HTTP layer authenticates the request and puts
    /// the [`Caller`] in its extensions, which rmcp hands to the tool with the request's
    /// `http::request::Parts`.
    PerRequest,
}

/// The caller the HTTP layer attached to this request, if any.
pub fn request_caller(ctx: &RequestContext<RoleServer>) -> Option<Caller> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
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

/// An evaluation's result: its text, then its images as image contents.
fn eval_result(r: &EvalReport) -> CallToolResult {
    let mut out = result(r.text(), r, r.is_error());
    let b64 = base64::engine::general_purpose::STANDARD;
    for a in &r.attachments {
        out.content.push(ContentBlock::image(
            b64.encode(&a.data),
            a.mime_type.clone(),
        ));
    }
    out
}

/// When the request carries a progress token, a reporter that forwards the latest output
/// line as a progress notification (in order, through one task).
fn progress_reporter(
    ctx: &RequestContext<RoleServer>,
    timeout: std::time::Duration,
) -> Option<Box<Progress>> {
    let token = ctx.meta.get_progress_token()?;
    let peer = ctx.peer.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<ProgressNotificationParam>();
    tokio::spawn(async move {
        while let Some(p) = rx.recv().await {
            if peer.notify_progress(p).await.is_err() {
                break;
            }
        }
    });
    let started = std::time::Instant::now();
    let total = timeout.as_secs_f64();
    Some(Box::new(move |line: String| {
        let elapsed = started.elapsed().as_secs_f64();
        let message = if line.trim().is_empty() {
            format!("running for {elapsed:.0} s")
        } else {
            line
        };
        let _ = tx.send(
            ProgressNotificationParam::new(token.clone(), elapsed)
                .with_total(total)
                .with_message(message),
        );
    }))
}

/// A failure the agent should read: `isError` with a message saying what to do.
pub fn error_result(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

#[tool_router]
impl ReplboxServer {
    /// A handler for a connection of the local principal (stdio).
    pub fn new(app: Arc<App>) -> Self {
        Self::for_caller(app, Caller::local())
    }

    /// A handler whose sessions belong to `caller`.
    pub fn for_caller(app: Arc<App>, caller: Caller) -> Self {
        Self::build(app, CallerSource::Fixed(caller))
    }

    /// A handler for the HTTP transport: every request names its caller (see
    /// [`request_caller`]); a request that does not is refused.
    pub fn per_request(app: Arc<App>) -> Self {
        Self::build(app, CallerSource::PerRequest)
    }

    fn build(app: Arc<App>, caller: CallerSource) -> Self {
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
        // session_start names the session languages installed on this host.
        let sessions = session_languages(&app);
        if let Some(route) = tool_router.map.get_mut("session_start") {
            route.attr.description = Some(
                format!(
                    "Start a persistent interpreter session in a fresh private directory (or \
`cwd`). Session languages installed here (id and aliases): {sessions}. {SESSION_START_REST}"
                )
                .into(),
            );
            let mut schema = (*route.attr.input_schema).clone();
            if let Some(Value::Object(props)) = schema.get_mut("properties")
                && let Some(Value::Object(lang)) = props.get_mut("language")
            {
                lang.insert(
                    "description".into(),
                    Value::from(format!(
                        "Session language, by id or alias. Installed here: {sessions}."
                    )),
                );
            }
            route.attr.input_schema = Arc::new(schema);
        }
        let instructions = Arc::new(instructions(&app));
        Self {
            app,
            caller,
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
        let timeout = self.app.config.timeout(p.timeout_ms);
        let req = RunRequest {
            code: p.code,
            stdin: p.stdin,
            args: p.args,
            env: p.env,
            timeout,
        };
        let progress = progress_reporter(&ctx, timeout);
        let report = self
            .app
            .runner
            .run(&lang, req, &ctx.ct, progress.as_deref())
            .await;
        result(report.text(), &report, !report.success())
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
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = match self.caller(&ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
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
        match self.app.sessions.start(&caller, req).await {
            Ok(r) => {
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
                result(text, &r, false)
            }
            Err(e) => error_result(e),
        }
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
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = match self.caller(&ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let timeout = self.app.config.timeout(p.timeout_ms);
        let progress = progress_reporter(&ctx, timeout);
        match self
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
            .await
        {
            Ok(r) => eval_result(&r),
            Err(e) => error_result(e),
        }
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
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = match self.caller(&ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let timeout = self.app.config.timeout(p.timeout_ms);
        let progress = progress_reporter(&ctx, timeout);
        match self
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
            .await
        {
            Ok(r) => eval_result(&r),
            Err(e) => error_result(e),
        }
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
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = match self.caller(&ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
        match self.app.sessions.interrupt(&caller, &p.session_id).await {
            Ok(r) => {
                if let Some(res) = &r.result {
                    // The paused evaluation's own result, images included.
                    let mut out = eval_result(res);
                    out.structured_content = serde_json::to_value(&r).ok();
                    out.is_error = Some(false);
                    return out;
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
                result(text, &r, false)
            }
            Err(e) => error_result(e),
        }
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
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = match self.caller(&ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
        match self.app.sessions.close(&caller, &p.session_id).await {
            Ok(r) => result(format!("session {} closed", r.session_id), &r, false),
            Err(e) => error_result(e),
        }
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
    async fn session_list(&self, ctx: RequestContext<RoleServer>) -> CallToolResult {
        let caller = match self.caller(&ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
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

impl ReplboxServer {
    /// The principal this request comes from.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Caller, CallToolResult> {
        match &self.caller {
            CallerSource::Fixed(c) => Ok(c.clone()),
            CallerSource::PerRequest => request_caller(ctx).ok_or_else(|| {
                tracing::error!("an HTTP request reached a tool without an authenticated caller");
                error_result("this request carries no authenticated caller; it was refused")
            }),
        }
    }

    /// The caller of a request that is not a tool call.
    fn caller_or_refuse(&self, ctx: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        self.caller(ctx).map_err(|_| {
            ErrorData::invalid_request("this request carries no authenticated caller", None)
        })
    }

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

/// What session_start's description says after the languages.
const SESSION_START_REST: &str = "Variables, imports, functions and loaded data stay alive across \
session_eval calls, so load data once and explore it step by step. Close it with session_close when \
done; idle sessions are closed after idle_timeout_s.";

/// The session languages installed here, each with its aliases:
/// `python (py, python3), shellscript (bash, sh, shell)`.
fn session_languages(app: &App) -> String {
    let list: Vec<String> = app
        .registry
        .all()
        .iter()
        .filter(|l| l.session_available())
        .map(|l| match l.spec.aliases.as_slice() {
            [] => l.id().to_string(),
            aliases => format!("{} ({})", l.id(), aliases.join(", ")),
        })
        .collect();
    if list.is_empty() {
        "none: no session language is installed on this host".into()
    } else {
        list.join(", ")
    }
}

fn instructions(app: &App) -> String {
    let installed = app.registry.installed_ids().join(", ");
    let sessions = match app.registry.session_ids() {
        ids if ids.is_empty() => "no session language is installed here".to_string(),
        ids => ids.join(", "),
    };
    format!(
        "replbox runs code for you.\n\
- run-code: run a snippet once (fresh process, private directory, nothing kept). Use it for one-off checks. \
Languages installed here: {installed}.\n\
- session_start / session_eval / session_close / session_list: a persistent interpreter ({sessions}). Use a \
session when the work takes several steps that build on each other (load data once, then explore it), or when \
starting the interpreter each time would be slow. If code waits for input, session_eval says awaiting_input: \
answer with session_input or stop it with session_interrupt. Idle sessions are closed after {} s.\n\
Limits: default timeout {} ms (ask for up to {} ms with timeout_ms); output keeps the first and last {} KiB \
of each stream.\n\
{}",
        app.config.idle_timeout_s,
        app.config.default_timeout_ms,
        app.config.max_timeout_ms,
        app.config.output_cap / 1024,
        app.sandbox.describe(),
    )
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ReplboxServer {
    /// Every tool call, counted while it runs (shutdown drains them; /healthz shows them).
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let _running = self.app.calls.enter();
        let tcc = ToolCallContext::new(self, request, context);
        self.tool_router.call(tcc).await
    }

    /// The files of the caller's sessions, one page at a time.
    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        const PAGE: usize = 500;
        let caller = self.caller_or_refuse(&context)?;
        let start: usize = match request.and_then(|r| r.cursor) {
            Some(c) => c
                .parse()
                .map_err(|_| ErrorData::invalid_params(format!("bad cursor {c:?}"), None))?,
            None => 0,
        };
        let all = self.app.sessions.list_files(&caller).await;
        let resources: Vec<Resource> = all
            .iter()
            .skip(start)
            .take(PAGE)
            .map(|(id, path, size)| {
                let mut r = Resource::new(file_uri(id, path), path.clone())
                    .with_description(format!("file of session {id}"))
                    .with_size(*size);
                if let Some(m) = crate::session::files::mime_for(path) {
                    r = r.with_mime_type(m);
                }
                r
            })
            .collect();
        let mut page = ListResourcesResult::with_all_items(resources);
        if start + PAGE < all.len() {
            page.next_cursor = Some((start + PAGE).to_string());
        }
        Ok(page)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new(URI_TEMPLATE, "session file").with_description(
                "A file in a session's directory, by path relative to it (segments percent-encoded). Text files come back as text, others as base64 blobs.",
            ),
        ]))
    }

    /// A file of one of the caller's sessions: text when it is UTF-8, a blob otherwise.
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let caller = self.caller_or_refuse(&context)?;
        let uri = request.uri;
        let (id, path) = parse_uri(&uri).map_err(|e| ErrorData::invalid_params(e, None))?;
        let data = self
            .app
            .sessions
            .read_file(&caller, &id, &path)
            .await
            .map_err(|e| match e {
                FileError::NotFound(m) => ErrorData::resource_not_found(m, None),
                FileError::Invalid(m) | FileError::TooLarge(m) => {
                    ErrorData::invalid_params(m, None)
                }
            })?;
        // Text when it reads as text (UTF-8 without NUL bytes), whatever the name says.
        let text = if data.bytes.contains(&0) {
            Err(data.bytes)
        } else {
            String::from_utf8(data.bytes).map_err(|e| e.into_bytes())
        };
        let contents = match text {
            Ok(t) => {
                ResourceContents::text(t, uri).with_mime_type(data.mime.unwrap_or("text/plain"))
            }
            Err(bytes) => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(&bytes),
                uri,
            )
            .with_mime_type(data.mime.unwrap_or("application/octet-stream")),
        };
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("replbox", env!("CARGO_PKG_VERSION")))
        .with_instructions(self.instructions.as_str())
    }
}
