//! The MCP surface: parameter and result types and the tool router. It only translates;
//! the work happens in `run`, `session` and `lang`.

mod args;
mod audit;
pub mod client_log;
mod params;
mod reply;
mod schema;
mod tasks;
mod tools;

use std::sync::Arc;

use base64::Engine;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{IntoCallToolResult, ToolCallContext};
#[allow(deprecated)] // MCP logging (SEP-2577) is still what clients use.
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, GetTaskParams,
    GetTaskResult, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
    UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool_handler};
use serde_json::Value;

use crate::app::App;
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;
use crate::lang::{LookupError, did_you_mean};
use crate::session::FileError;
use crate::session::files::{
    EXPORT_TEMPLATES, OUTPUT_TEMPLATE, SHOWN_TEMPLATES, URI_TEMPLATE, file_uri, parse_export_uri,
    parse_output_uri, parse_shown_uri, parse_uri,
};

/// One MCP connection's handler. Cheap to clone; all state lives in [`App`].
#[derive(Clone)]
pub struct ReplboxServer {
    pub(super) app: Arc<App>,
    /// Who the calls come from (sessions belong to them).
    caller: CallerSource,
    /// Built once per server and shared by every MCP session's handler (see
    /// [`ReplboxServer::for_session`]): its schemas are most of a handler's size.
    tool_router: Arc<ToolRouter<Self>>,
    instructions: Arc<String>,
    /// The level of log notifications this connection asked for (`logging/setLevel`).
    log_level: client_log::ClientLevel,
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
fn request_caller(ctx: &RequestContext<RoleServer>) -> Option<Caller> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
}

impl ReplboxServer {
    /// A handler for a connection of the local principal (stdio).
    pub fn new(app: Arc<App>) -> Self {
        Self::build(app, CallerSource::Fixed(Caller::local()))
    }

    /// A handler for the HTTP transport: every request names its caller (see
    /// [`request_caller`]); a request that does not is refused.
    pub(crate) fn per_request(app: Arc<App>) -> Self {
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
                    "Start a persistent interpreter session ({sessions}) in a fresh private \
directory or `cwd`. {SESSION_START_REST}"
                )
                .into(),
            );
        }
        let instructions = Arc::new(instructions(&app));
        Self {
            app,
            caller,
            tool_router: Arc::new(tool_router),
            instructions,
            log_level: client_log::ClientLevel::new(),
        }
    }
}

impl ReplboxServer {
    /// A handler for one more MCP session: the same tools and instructions (shared, not
    /// rebuilt), and a log level of its own.
    pub(crate) fn for_session(&self) -> Self {
        Self {
            app: self.app.clone(),
            caller: self.caller.clone(),
            tool_router: self.tool_router.clone(),
            instructions: self.instructions.clone(),
            log_level: client_log::ClientLevel::new(),
        }
    }

    /// The principal this request comes from.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Option<Caller> {
        match &self.caller {
            CallerSource::Fixed(c) => Some(c.clone()),
            CallerSource::PerRequest => request_caller(ctx),
        }
    }

    /// The caller of a request that is not a tool call.
    fn caller_or_refuse(&self, ctx: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        self.caller(ctx).ok_or_else(|| {
            ErrorData::invalid_request("this request carries no authenticated caller", None)
        })
    }

    pub(super) fn lookup_error(&self, e: &LookupError) -> ToolError {
        let available = self.app.registry.available_names().join(", ");
        match e {
            LookupError::Unknown(name) => ToolError::new(
                ErrorKind::UnsupportedLanguage,
                format!(
                    "unknown language {name:?}.{} Available language ids on this host: {available}",
                    did_you_mean(self.app.registry.suggest(name, false).as_deref())
                ),
            ),
            LookupError::NotInstalled { id, reason } => ToolError::new(
                ErrorKind::NotInstalled,
                format!(
                    "language {id:?} is not installed on this host ({reason}). Available language ids: {available}"
                ),
            ),
        }
    }
}

/// What session_start's description says after the languages.
const SESSION_START_REST: &str = "Variables, imports and data persist across session_eval calls. \
Close with session_close; idle ones close after idle_timeout_s.";

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
    /// The caller is resolved here, once, and handed to the tools as `Extension<Caller>`.
    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let _running = self.app.calls.enter();
        let Some(caller) = self.caller(&context) else {
            tracing::error!("an HTTP request reached a tool without an authenticated caller");
            return ToolError::internal(
                "this request carries no authenticated caller; it was refused",
            )
            .into_call_tool_result();
        };
        let long = tasks::TASK_TOOLS.contains(&request.name.as_ref());
        let as_task = long && tasks::client_speaks_tasks(&context);
        let keyed = long
            && request
                .arguments
                .as_ref()
                .is_some_and(|a| a.contains_key("idempotency_key"));
        let route = self.tool_router.map.get(request.name.as_ref());
        let audit = audit::Call::begin(&self.app, &caller, &request, route.is_some());
        let peer = context.peer.clone();
        let call = async {
            let tool = request.name.clone();
            let response = match route {
                Some(route) => {
                    let schema = &route.attr.input_schema;
                    match args::unalias(&tool, request.arguments.as_mut(), schema)
                        .and_then(|()| args::check(&tool, request.arguments.as_ref(), schema))
                    {
                        Err(e) => e.into_call_tool_result(),
                        Ok(()) if as_task || keyed => {
                            self.call_tracked(caller, request, context, as_task).await
                        }
                        Ok(()) => {
                            context.extensions.insert(caller);
                            let tcc = ToolCallContext::new(self, request, context);
                            let r = self.tool_router.call(tcc).await;
                            explain_bad_arguments(&tool, r, &route.attr.input_schema)
                        }
                    }
                }
                None => {
                    tracing::debug!("call of an unknown tool");
                    let tcc = ToolCallContext::new(self, request, context);
                    self.tool_router.call(tcc).await
                }
            };
            audit.end(&self.app, &response);
            response
        };
        client_log::forward(&self.log_level, &peer, call).await
    }

    /// `logging/setLevel`: from now on this connection's own tool calls send their log
    /// events at `level` and above as notifications.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.caller_or_refuse(&context)?;
        self.log_level.set(request.level);
        Ok(())
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
            Some(c) => c.parse().map_err(|_| {
                tracing::debug!("resources/list with a bad cursor");
                ErrorData::invalid_params(format!("bad cursor {c:?}"), None)
            })?,
            None => 0,
        };
        let files = self.app.sessions.list_files(&caller).await;
        let shown = self.app.sessions.list_shown(&caller);
        let total = files.len() + shown.len();
        let files = files.iter().map(|(id, path, size)| {
            let mut r = Resource::new(file_uri(id, path), path.clone())
                .with_description(format!("file of session {id}"))
                .with_size(*size);
            if let Some(m) = crate::session::files::mime_for(path) {
                r = r.with_mime_type(m);
            }
            r
        });
        // What cells showed, after the files: each figure or display part by its URI.
        let shown = shown.into_iter().map(|(uri, mime, size)| {
            let name = uri.rsplit('/').next().unwrap_or_default().to_string();
            Resource::new(uri, name)
                .with_mime_type(mime)
                .with_size(size)
        });
        let resources: Vec<Resource> = files.chain(shown).skip(start).take(PAGE).collect();
        let mut page = ListResourcesResult::with_all_items(resources);
        if start + PAGE < total {
            page.next_cursor = Some((start + PAGE).to_string());
        }
        Ok(page)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let [ipynb, script] = EXPORT_TEMPLATES;
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new(URI_TEMPLATE, "session file").with_description(
                "A file in a session's directory, by path relative to it (segments percent-encoded). Text files come back as text, others as base64 blobs. An ended session's files stay readable (read-only) for a while.",
            ),
            ResourceTemplate::new(SHOWN_TEMPLATES[0], "figure").with_description(
                "A figure a cell returned (PNG), by the URI its result gave; kept with the session's history.",
            ),
            ResourceTemplate::new(SHOWN_TEMPLATES[1], "display").with_description(
                "A part of a rich display a cell returned (image, HTML, JSON, …), by the URI its result gave; kept with the session's history.",
            ),
            ResourceTemplate::new(OUTPUT_TEMPLATE, "whole output").with_description(
                "An evaluation's whole output when its result showed only the head and tail; ?page=N (from 1) reads 64 KiB of it.",
            ).with_mime_type("text/plain"),
            ResourceTemplate::new(ipynb, "session notebook")
                .with_description("A session's cells as a Jupyter notebook (nbformat 4), as session_export writes it.")
                .with_mime_type("application/x-ipynb+json"),
            ResourceTemplate::new(script, "session script").with_description(
                "A session's cells as a source file of its language (ext: py, js, rb, hs, sh, r), cells separated by `# %%`.",
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
        if let Some((id, ext)) = parse_export_uri(&uri) {
            let r = self
                .app
                .sessions
                .export_resource(&caller, &id, &ext)
                .await
                .map_err(|e| match e.kind {
                    ErrorKind::InvalidArgument => ErrorData::invalid_params(e.message, None),
                    _ => ErrorData::resource_not_found(e.message, None),
                })?;
            let contents = ResourceContents::text(r.document, uri).with_mime_type(r.mime_type);
            return Ok(ReadResourceResult::new(vec![contents]).into());
        }
        if let Some((id, base, page)) = parse_output_uri(&uri) {
            let text = self
                .app
                .sessions
                .read_output(&caller, &id, &base, page)
                .map_err(file_error)?;
            let contents = ResourceContents::text(text, uri).with_mime_type("text/plain");
            return Ok(ReadResourceResult::new(vec![contents]).into());
        }
        if let Some(id) = parse_shown_uri(&uri) {
            let shown = self
                .app
                .sessions
                .read_shown(&caller, &id, &uri)
                .map_err(file_error)?;
            let contents = shown_contents(shown.mime_type, &shown.data, uri);
            return Ok(ReadResourceResult::new(vec![contents]).into());
        }
        let (id, path) = parse_uri(&uri).map_err(|e| {
            tracing::debug!(principal = %caller.principal, "resources/read of a malformed URI");
            ErrorData::invalid_params(e.to_string(), None)
        })?;
        let data = self
            .app
            .sessions
            .read_file(&caller, &id, &path)
            .await
            .inspect_err(|_| {
                // A client's mistake (a missing file, a bad path): not the operator's concern.
                tracing::debug!(principal = %caller.principal, "resources/read refused");
            })
            .map_err(file_error)?;
        let contents = file_contents(data.bytes, data.mime, uri);
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    /// `tasks/get`: one of the caller's tasks, from whichever connection started it.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let caller = self.caller_or_refuse(&context)?;
        self.task_get(&caller, &request.task_id)
    }

    /// `tasks/update`: the answer to a task's question (a cell waiting for input).
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = self.caller_or_refuse(&context)?;
        self.app
            .tasks
            .update(&caller, &request.task_id, request.input_responses)
            .map_err(tasks::task_error)
    }

    /// `tasks/cancel`: interrupt the task's work (a session keeps its state).
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = self.caller_or_refuse(&context)?;
        self.app
            .tasks
            .cancel(&caller, &request.task_id)
            .map_err(tasks::task_error)
    }

    #[allow(deprecated)] // enable_logging: see set_level
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_logging()
                .enable_tools()
                .enable_resources()
                .enable_resources_list_changed()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("replbox", env!("CARGO_PKG_VERSION")))
        .with_instructions(self.instructions.as_str())
    }
}

/// A session file, output page or shown part that cannot be read: not found, or a bad
/// request.
fn file_error(e: FileError) -> ErrorData {
    match e {
        FileError::NotFound(m) => ErrorData::resource_not_found(m, None),
        FileError::Invalid(m) | FileError::TooLarge(m) => ErrorData::invalid_params(m, None),
    }
}

/// What an evaluation showed, read again: an image (SVG aside) as a blob, the rest as
/// text.
fn shown_contents(mime_type: String, data: &[u8], uri: String) -> ResourceContents {
    let contents = if mime_type.starts_with("image/") && mime_type != "image/svg+xml" {
        ResourceContents::blob(base64::engine::general_purpose::STANDARD.encode(data), uri)
    } else {
        ResourceContents::text(String::from_utf8_lossy(data).into_owned(), uri)
    };
    contents.with_mime_type(mime_type)
}

/// A session file: text when it reads as text (UTF-8 without NUL bytes), whatever the name
/// says (`mime`), else a blob.
fn file_contents(bytes: Vec<u8>, mime: Option<&'static str>, uri: String) -> ResourceContents {
    let text = if bytes.contains(&0) {
        Err(bytes)
    } else {
        String::from_utf8(bytes).map_err(|e| e.into_bytes())
    };
    match text {
        Ok(t) => ResourceContents::text(t, uri).with_mime_type(mime.unwrap_or("text/plain")),
        Err(bytes) => ResourceContents::blob(
            base64::engine::general_purpose::STANDARD.encode(&bytes),
            uri,
        )
        .with_mime_type(mime.unwrap_or("application/octet-stream")),
    }
}

/// rmcp's own answer to arguments it could not deserialize ("failed to deserialize
/// parameters: …") as an `invalid_argument` error that says what the tool expects.
fn explain_bad_arguments(
    tool: &str,
    response: Result<CallToolResponse, ErrorData>,
    schema: &rmcp::model::JsonObject,
) -> Result<CallToolResponse, ErrorData> {
    const PREFIX: &str = "failed to deserialize parameters:";
    let problem = match &response {
        Ok(CallToolResponse::Complete(CallToolResult {
            is_error: Some(true),
            structured_content: None,
            content,
            ..
        })) => content
            .first()
            .and_then(|c| c.as_text())
            .and_then(|t| t.text.strip_prefix(PREFIX))
            .map(|p| p.trim().to_string()),
        _ => None,
    };
    match problem {
        Some(p) => args::invalid(tool, &p, schema).into_call_tool_result(),
        None => response,
    }
}
