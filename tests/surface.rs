//! The MCP surface as clients see it: schemas every client accepts, the messages a
//! mistaken call gets, logging/setLevel and the log notifications of a client's own calls,
//! and the audit line each call leaves on stderr.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams};
use serde_json::{Value, json};

/// Where a schema says something some clients warn about or reject: a `format` of a
/// number width (`uint64`, `int32`, …) or a type that allows null.
fn non_portable(v: &Value, path: &str, found: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if let Some(f) = o.get("format").and_then(Value::as_str)
                && (f.starts_with("int") || f.starts_with("uint") || f == "double" || f == "float")
            {
                found.push(format!("{path}: format {f}"));
            }
            match o.get("type") {
                Some(Value::Array(t)) => found.push(format!("{path}: type {t:?}")),
                Some(Value::String(t)) if t == "null" => found.push(format!("{path}: type null")),
                _ => {}
            }
            for (k, x) in o {
                non_portable(x, &format!("{path}/{k}"), found);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                non_portable(x, &format!("{path}/{i}"), found);
            }
        }
        _ => {}
    }
}

/// Paths of `null` values in a structured result.
fn nulls(v: &Value, path: &str, found: &mut Vec<String>) {
    match v {
        Value::Null => found.push(path.to_string()),
        Value::Object(o) => o
            .iter()
            .for_each(|(k, x)| nulls(x, &format!("{path}/{k}"), found)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| nulls(x, &format!("{path}/{i}"), found)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_tool_schema_is_portable_and_results_carry_no_nulls() {
    let s = Server::stdio().start().await;
    let tools = s.client.list_all_tools().await.expect("tools/list");
    assert!(tools.len() >= 7, "{} tools", tools.len());
    let mut found = Vec::new();
    for t in &tools {
        let input = Value::Object((*t.input_schema).clone());
        non_portable(&input, &format!("{} input", t.name), &mut found);
        let output = t
            .output_schema
            .as_ref()
            .unwrap_or_else(|| panic!("{} declares no output schema", t.name));
        non_portable(
            &Value::Object((**output).clone()),
            &format!("{} output", t.name),
            &mut found,
        );
    }
    assert!(found.is_empty(), "non-portable schema parts: {found:#?}");
    // session_start says whether the session was started ahead of time.
    let start = tools
        .iter()
        .find(|t| t.name == "session_start")
        .and_then(|t| t.output_schema.clone())
        .expect("session_start's output schema");
    assert_eq!(start["properties"]["warm"]["type"], "boolean", "{start:?}");

    // Optional fields are absent rather than null: a run that exited has no `signal`, and
    // an evaluation that did not end its interpreter has no `exit_code`.
    let run = s.run("shellscript", "exit 3").await;
    assert!(run.is_error);
    assert_eq!(run.structured["exit_code"], 3, "{}", run.structured);
    assert!(run.structured.get("signal").is_none(), "{}", run.structured);
    let id = s.start_session("shellscript").await;
    let ev = s.eval(&id, "echo hi").await;
    assert_eq!(output(&ev).trim(), "hi");
    let closed = s.call("session_close", json!({"session_id": id})).await;
    let list = s.call("session_list", json!({})).await;
    for (what, v) in [
        ("run", &run.structured),
        ("eval", &ev.structured),
        ("close", &closed.structured),
        ("list", &list.structured),
    ] {
        let mut found = Vec::new();
        nulls(v, what, &mut found);
        assert!(found.is_empty(), "null fields in {what}: {found:?} in {v}");
    }
    s.stop().await;
}

/// The most bytes the tools `tools/list` had when it was cut may take: every connection
/// pays for it (under a third of the 40 kB it once was).
const TOOLS_LIST_MAX: usize = 12_000;
/// Tools added since, each within this much.
const NEW_TOOL_MAX: usize = 700;
const NEW_TOOLS: [&str; 1] = ["session_inspect"];

/// `tools/list` is small, and no tool lost a parameter or its structured result: each one
/// still declares its input fields and an output schema with its result's fields.
#[tokio::test(flavor = "multi_thread")]
async fn the_tool_list_is_lean_and_complete() {
    let s = TestServer::start().await;
    let list = s.client.list_tools(None).await.expect("tools/list");
    let bytes = serde_json::to_vec(&list).expect("serialize").len();
    let mut old = list.clone();
    old.tools.retain(|t| !NEW_TOOLS.contains(&t.name.as_ref()));
    let old_bytes = serde_json::to_vec(&old).expect("serialize").len();
    eprintln!(
        "tools/list: {bytes} bytes for {} tools ({old_bytes} for the first {})",
        list.tools.len(),
        old.tools.len()
    );
    assert!(
        old_bytes <= TOOLS_LIST_MAX,
        "tools/list is {old_bytes} bytes without {NEW_TOOLS:?}, more than {TOOLS_LIST_MAX}"
    );
    for t in list
        .tools
        .iter()
        .filter(|t| NEW_TOOLS.contains(&t.name.as_ref()))
    {
        let n = serde_json::to_vec(t).expect("serialize").len();
        assert!(
            n <= NEW_TOOL_MAX,
            "{} is {n} bytes, more than {NEW_TOOL_MAX}",
            t.name
        );
    }
    let fields = |schema: &rmcp::model::JsonObject| -> Vec<String> {
        schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    };
    let tool = |name: &str| {
        list.tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} is listed"))
    };
    for (name, inputs, outputs) in [
        (
            "run-code",
            &[
                "code",
                "languageId",
                "timeout_ms",
                "stdin",
                "args",
                "env",
                "venv",
                "allow_domains",
            ][..],
            &[
                "stdout",
                "stderr",
                "exit_code",
                "signal",
                "timed_out",
                "duration_ms",
                "truncated",
            ][..],
        ),
        (
            "session_start",
            &[
                "language",
                "cwd",
                "venv",
                "env",
                "idle_timeout_s",
                "files",
                "allow_domains",
            ],
            &[
                "session_id",
                "language",
                "version",
                "pid",
                "cwd",
                "idle_timeout_s",
                "warm",
            ],
        ),
        (
            "session_eval",
            &["session_id", "code", "timeout_ms"],
            &[
                "session_id",
                "eval_id",
                "status",
                "output",
                "truncated",
                "duration_ms",
                "error",
            ],
        ),
        (
            "session_input",
            &["session_id", "text", "enter", "timeout_ms"],
            &["status", "output", "discarded_input"],
        ),
        (
            "session_interrupt",
            &["session_id"],
            &["interrupted", "result"],
        ),
        (
            "session_close",
            &["session_id"],
            &["session_id", "closed", "exit_code"],
        ),
        ("session_list", &[], &["sessions", "ended"]),
        (
            "session_export",
            &["session_id", "format"],
            &["uri", "cells"],
        ),
        ("session_vars", &["session_id", "timeout_ms"], &["vars"]),
        (
            "session_inspect",
            &["session_id", "name", "budget_bytes"],
            &["name", "type", "details", "truncated"],
        ),
    ] {
        let t = tool(name);
        let have = fields(&t.input_schema);
        for f in inputs {
            assert!(have.iter().any(|h| h == f), "{name} takes {f}: {have:?}");
        }
        let out = t.output_schema.as_ref().expect("an output schema");
        let have = fields(out);
        for f in outputs {
            assert!(have.iter().any(|h| h == f), "{name} returns {f}: {have:?}");
        }
    }
    // The statuses an evaluation can end with are listed.
    let eval = tool("session_eval").output_schema.clone().expect("output");
    assert_eq!(
        eval["properties"]["status"]["enum"],
        json!(["ok", "error", "timeout", "exited", "awaiting_input"])
    );
    s.stop().await;
}

/// `run-code` takes `language` for `languageId`, as the session tools name it; both at once
/// is a mistake the call is told about.
#[tokio::test(flavor = "multi_thread")]
async fn run_code_takes_language_for_language_id() {
    if !require("shellscript", "bash") {
        return;
    }
    let s = TestServer::start().await;
    let o = s
        .call(
            "run-code",
            json!({"language": "bash", "code": "echo aliased"}),
        )
        .await;
    assert!(!o.is_error, "{o:?}");
    assert_eq!(o.text, "aliased\n");
    assert_eq!(o.structured["language"], "shellscript", "{}", o.structured);
    let o = s
        .call(
            "run-code",
            json!({"language": "bash", "languageId": "python", "code": "echo x"}),
        )
        .await;
    let t = invalid(&o);
    assert!(t.contains("`language` and `languageId`"), "{t}");
    s.stop().await;
}

/// Closing is idempotent, as the tool's `idempotentHint` says: a second close of the same
/// session succeeds and says it was closed already; a session that was never there is
/// still unknown.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_close_succeeds_as_already_closed() {
    if !require("shellscript", "bash") {
        return;
    }
    let s = TestServer::start().await;
    let close = s.client.list_all_tools().await.expect("tools/list");
    let close = close
        .iter()
        .find(|t| t.name == "session_close")
        .expect("listed");
    assert_eq!(
        close.annotations.as_ref().and_then(|a| a.idempotent_hint),
        Some(true)
    );
    let id = s.start_session("shellscript").await;
    let first = s.call("session_close", json!({"session_id": id})).await;
    assert!(!first.is_error, "{first:?}");
    assert_eq!(first.text, format!("session {id} closed"));
    assert!(
        first.structured.get("already_closed").is_none(),
        "{}",
        first.structured
    );
    let second = s.call("session_close", json!({"session_id": id})).await;
    assert!(!second.is_error, "{second:?}");
    assert!(
        second
            .text
            .starts_with(&format!("already closed: session {id} was closed")),
        "{}",
        second.text
    );
    assert_eq!(second.structured["closed"], true, "{}", second.structured);
    assert_eq!(
        second.structured["already_closed"], true,
        "{}",
        second.structured
    );
    assert_eq!(second.structured["session_id"], json!(id));
    // An evaluation after the close still says the session ended.
    let ev = s.eval(&id, "echo hi").await;
    assert_eq!(ev.error_kind(), "ended_session", "{ev:?}");
    let never = s.call("session_close", json!({"session_id": "nope"})).await;
    assert_eq!(never.error_kind(), "unknown_session", "{never:?}");
    s.stop().await;
}

/// A stdio server whose stderr the test reads (the audit lines), with the server's own log
/// settings (REPLBOX_LOG and REPLBOX_LOG_FORMAT unset).
struct Logged(TestServer);

impl std::ops::Deref for Logged {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.0
    }
}

impl Logged {
    async fn start(args: &[&str]) -> Self {
        Self(
            Server::stdio()
                .args(args)
                .env_remove("REPLBOX_LOG")
                .env_remove("REPLBOX_LOG_FORMAT")
                .start()
                .await,
        )
    }

    /// Wait (bounded) until the log has `n` lines containing `needle`; those lines.
    async fn lines_with(&self, needle: &str, n: usize) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let found: Vec<String> = self
                .log()
                .lines()
                .filter(|l| l.contains(needle))
                .map(str::to_string)
                .collect();
            if found.len() >= n || tokio::time::Instant::now() > deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn call(&self, tool: &str, args: Value) -> rmcp::model::CallToolResult {
        let obj = args.as_object().cloned().expect("object");
        self.client
            .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj))
            .await
            .unwrap_or_else(|e| panic!("{tool}: {e}"))
    }

    /// Wait (bounded) until `n` log notifications have arrived; all of them.
    async fn logs(&self, n: usize) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let logs = self.recorder.logs();
            if logs.len() >= n || tokio::time::Instant::now() > deadline {
                return logs;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The mistakes of an ordinary client, which the operator need not be warned about.
async fn make_mistakes(s: &Logged) {
    let r = s
        .call(
            "session_eval",
            json!({"session_id": "no-such-session", "code": "1"}),
        )
        .await;
    assert_eq!(r.is_error, Some(true));
    let read = s
        .client
        .read_resource(ReadResourceRequestParams::new(
            "replbox://sessions/no-such-session/files/data.csv",
        ))
        .await;
    assert!(read.is_err(), "reading a file of no session fails");
    let unknown = s
        .client
        .call_tool(CallToolRequestParams::new("no-such-tool"))
        .await;
    assert!(unknown.is_err(), "an unknown tool is a protocol error");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_audit_line_per_call_in_text_and_json_and_never_the_code() {
    if !require("shellscript", "bash") {
        return;
    }
    for format in ["text", "json"] {
        let s = Logged::start(&["--log-format", format]).await;
        // Start-up says which sandbox level and limits are in force.
        let start = s.lines_with("sandbox and limits", 1).await;
        assert_eq!(start.len(), 1, "{format}: {}", s.log());
        assert!(
            start[0].contains("sandbox") && start[0].contains("memory_mb"),
            "{}",
            start[0]
        );
        let served_at = s.lines_with("serving MCP on stdio", 1).await;
        assert_eq!(served_at.len(), 1, "{}", s.log());
        let before = s.log().len();

        let code_canary = token();
        let env_canary = token();
        let out_canary = token();
        let r = s
            .call(
                "run-code",
                json!({"languageId": "bash",
                       "code": format!("# {code_canary}\necho {out_canary}; exit 3"),
                       "env": {"CANARY": env_canary}}),
            )
            .await;
        assert_eq!(r.is_error, Some(true));
        make_mistakes(&s).await;
        // Three tool calls (reading a resource is not one).
        let audit = s.lines_with("tool call", 3).await;
        assert_eq!(audit.len(), 3, "{format}: {}", s.log());
        match format {
            "text" => {
                let run = &audit[0];
                for part in [
                    "INFO replbox::audit",
                    "principal=local",
                    "tool=run-code",
                    "language=shellscript",
                    "status=error",
                    "exit_code=3",
                    "duration_ms=",
                ] {
                    assert!(run.contains(part), "{part:?} not in {run}");
                }
                let bytes: u64 = run
                    .split("bytes=")
                    .nth(1)
                    .and_then(|b| b.split_whitespace().next())
                    .and_then(|b| b.parse().ok())
                    .unwrap_or_else(|| panic!("no bytes in {run}"));
                assert!(bytes > out_canary.len() as u64, "{run}");
                assert!(
                    audit[1].contains("tool=session_eval")
                        && audit[1].contains("status=unknown_session")
                        && audit[1].contains("session=no-such-session"),
                    "{}",
                    audit[1]
                );
                assert!(audit[2].contains("tool=unknown") && audit[2].contains("protocol_error"));
            }
            _ => {
                let events: Vec<Value> = s
                    .log()
                    .lines()
                    .map(|l| {
                        serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
                    })
                    .collect();
                let audit: Vec<&Value> = events
                    .iter()
                    .filter(|e| e["target"] == "replbox::audit")
                    .collect();
                assert_eq!(audit.len(), 3, "{events:#?}");
                let run = &audit[0]["fields"];
                assert_eq!(audit[0]["level"], "INFO");
                assert_eq!(run["message"], "tool call");
                assert_eq!(run["principal"], "local");
                assert_eq!(run["tool"], "run-code");
                assert_eq!(run["language"], "shellscript");
                assert_eq!(run["status"], "error");
                assert_eq!(run["exit_code"], 3);
                assert!(run["duration_ms"].is_u64(), "{run}");
                assert!(
                    run["bytes"].as_u64().unwrap_or(0) > out_canary.len() as u64,
                    "{run}"
                );
                let eval = &audit[1]["fields"];
                assert_eq!(eval["status"], "unknown_session");
                assert_eq!(eval["session"], "no-such-session");
            }
        }
        let log = s.log();
        for canary in [&code_canary, &env_canary, &out_canary] {
            assert!(
                !log.contains(canary.as_str()),
                "{canary} reached the log:\n{log}"
            );
        }
        // A client's mistakes are not the operator's warnings.
        let after = &log[before..];
        assert!(
            !after.contains("WARN") && !after.contains("ERROR"),
            "client mistakes logged as warnings:\n{after}"
        );
        s.0.stop().await;
    }
}

/// `logging/setLevel`: nothing before it; then the client's own calls' events at that
/// level and above, in order before the call's result.
#[tokio::test(flavor = "multi_thread")]
#[allow(deprecated)] // MCP logging (SEP-2577)
async fn logging_set_level_sends_the_clients_own_events_at_its_level() {
    use rmcp::model::{LoggingLevel, SetLevelRequestParams};
    if !require("shellscript", "bash") {
        return;
    }
    let s = Logged::start(&[]).await;
    let caps = s
        .client
        .peer_info()
        .map(|i| i.capabilities.clone())
        .expect("server info");
    assert!(caps.logging.is_some(), "the logging capability is declared");

    let run = |canary: String| json!({"languageId": "bash", "code": format!("echo {canary}")});
    s.call("run-code", run(token())).await;
    // Before setLevel: nothing (the sentinel below proves the absence).
    s.client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Info))
        .await
        .expect("logging/setLevel answers {}");
    let canary = token();
    s.call("run-code", run(canary.clone())).await;
    let logs = s.logs(1).await;
    assert_eq!(
        logs.len(),
        1,
        "one audit event, nothing from before: {logs:#?}"
    );
    let audit = &logs[0];
    assert_eq!(audit["level"], "info");
    assert_eq!(audit["logger"], "replbox::audit");
    assert_eq!(audit["data"]["tool"], "run-code");
    assert_eq!(audit["data"]["status"], "ok");
    assert_eq!(audit["data"]["principal"], "local");
    assert!(!audit.to_string().contains(&canary), "{audit}");

    // Above info: the audit event is not sent.
    s.client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Warning))
        .await
        .expect("setLevel");
    s.call("run-code", run(token())).await;
    s.client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
        .await
        .expect("setLevel");
    s.call("session_list", json!({})).await;
    let logs = s.logs(2).await;
    assert_eq!(logs.len(), 2, "{logs:#?}");
    assert_eq!(
        logs[1]["data"]["tool"], "session_list",
        "the warning-level call sent nothing: {logs:#?}"
    );
    s.0.stop().await;
}

/// The text of a refused call, checked to be an `invalid_argument` error.
fn invalid(o: &Out) -> &str {
    assert_eq!(o.error_kind(), "invalid_argument", "{o:?}");
    &o.text
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mistaken_call_is_told_which_field_what_it_expects_and_an_example() {
    let s = Server::stdio().start().await;
    let o = s.call("session_eval", json!({"session_id": "abc"})).await;
    let t = invalid(&o);
    assert!(t.contains("missing field `code` (a string"), "{t}");
    assert!(
        t.contains(r#"Example: {"session_id": "<id from session_start>", "code": "x = 1"}"#),
        "{t}"
    );
    assert!(!t.contains("failed to deserialize"), "{t}");

    let o = s.call("run-code", json!({"code": "1"})).await;
    let t = invalid(&o);
    assert!(t.contains("missing field `languageId`"), "{t}");
    assert!(t.contains(r#""languageId": "python""#), "{t}");

    let o = s
        .call(
            "run-code",
            json!({"languageId": "python", "code": "1", "timeout": 5}),
        )
        .await;
    let t = invalid(&o);
    assert!(
        t.contains("unknown field `timeout`. Did you mean \"timeout_ms\"?"),
        "{t}"
    );

    let o = s
        .call(
            "run-code",
            json!({"languageId": "python", "code": "1", "timeout_ms": "5"}),
        )
        .await;
    let t = invalid(&o);
    assert!(
        t.contains("`timeout_ms` must be a whole number, 0 or more, not a string"),
        "{t}"
    );

    let o = s
        .call(
            "run-code",
            json!({"languageId": "python", "code": "1", "args": "-v"}),
        )
        .await;
    assert!(invalid(&o).contains("`args` must be an array of strings, not a string"));

    let o = s
        .call(
            "run-code",
            json!({"languageId": "python", "code": "1", "env": {"A": 1}}),
        )
        .await;
    assert!(invalid(&o).contains("`env.A` must be a string, not a whole number"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn files_errors_name_name_path_and_content() {
    if !require("shellscript", "bash") {
        return;
    }
    let s = Server::stdio().start().await;
    let start = |files: Value| json!({"language": "bash", "files": files});
    let o = s
        .call(
            "session_start",
            start(json!([{"nme": "a.txt", "content": "x"}])),
        )
        .await;
    let t = invalid(&o);
    assert!(
        t.contains("unknown field `files[0].nme`. Did you mean \"name\"?"),
        "{t}"
    );
    assert!(t.contains("`content`, `name`, `path`"), "{t}");

    let o = s.call("session_start", start(json!(["data.csv"]))).await;
    let t = invalid(&o);
    assert!(
        t.contains("`files[0]` must be an object with `content`, `name`, `path`, not a string"),
        "{t}"
    );
    let o = s
        .call("session_start", start(json!([{"content": "x"}])))
        .await;
    let t = invalid(&o);
    assert!(
        t.contains("files[0]") && t.contains("name is required with content"),
        "{t}"
    );
    let o = s
        .call(
            "session_start",
            start(json!([{"name": "a", "path": "/etc/hostname", "content": "x"}])),
        )
        .await;
    let t = invalid(&o);
    assert!(
        t.contains("path") && t.contains("content") && t.contains("not both"),
        "{t}"
    );
    let o = s
        .call("session_start", start(json!([{"name": 3, "content": "x"}])))
        .await;
    assert!(invalid(&o).contains("`files[0].name` must be a string, not a whole number"));
    let twice = json!([{"name": "a.txt", "content": "x"}, {"name": "a.txt", "content": "y"}]);
    let o = s.call("session_start", start(twice)).await;
    let t = invalid(&o);
    assert!(
        t.contains("files[1]: name: \"a.txt\" is given twice"),
        "{t}"
    );
    let missing = json!([{"path": "/nonexistent/replbox-test.csv"}]);
    let o = s.call("session_start", start(missing)).await;
    let t = invalid(&o);
    assert!(
        t.contains("files[0]: path: cannot read /nonexistent/replbox-test.csv"),
        "{t}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_languages_suggest_the_closest_name() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let o = s.run("pyhton", "print(1)").await;
    assert_eq!(o.error_kind(), "unsupported_language", "{o:?}");
    assert!(o.text.contains("Did you mean \"python\"?"), "{}", o.text);
    let o = s.call("session_start", json!({"language": "Pyton3"})).await;
    assert_eq!(o.error_kind(), "unsupported_language", "{o:?}");
    assert!(o.text.contains("Did you mean \"python3\"?"), "{}", o.text);
    let o = s.run("cobol", "x").await;
    assert_eq!(o.error_kind(), "unsupported_language");
    assert!(!o.text.contains("Did you mean"), "{}", o.text);
    s.stop().await;

    // The command line too.
    let out = std::process::Command::new(BIN)
        .args(["run", "pyhton", "print(1)"])
        .output()
        .expect("replbox run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Did you mean \"python\"?"), "{err}");
    // And clap's own suggestion for flags.
    let out = std::process::Command::new(BIN)
        .args(["serve", "--max-sesions", "3"])
        .output()
        .expect("replbox serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-sessions"), "{err}");
}

/// A session closed by its client ends cleanly: not reported as killed (143).
#[tokio::test(flavor = "multi_thread")]
async fn a_normal_close_reports_a_clean_end() {
    let mut langs = Vec::new();
    for (lang, program) in [
        ("python", "python3"),
        ("javascript", "node"),
        ("bash", "bash"),
    ] {
        if require(lang, program) {
            langs.push(lang);
        }
    }
    let s = Server::stdio().start().await;
    for lang in langs {
        let id = s.start_session(lang).await;
        let o = s.call("session_close", json!({"session_id": id})).await;
        assert!(!o.is_error, "{lang}: {o:?}");
        assert_eq!(o.structured["closed"], true, "{lang}: {}", o.structured);
        let code = &o.structured["exit_code"];
        assert!(code.is_null() || *code == 0, "{lang}: exit code {code}");
        assert_eq!(o.text, format!("session {id} closed"), "{lang}");
    }
    s.stop().await;
}

/// A run's traceback names the program as it was started (`main.py`), not the directory
/// the server keeps runs in.
#[tokio::test(flavor = "multi_thread")]
async fn tracebacks_name_the_program_not_a_host_path() {
    let cases = [
        (
            "python",
            "python3",
            "def f():\n    raise ValueError('boom')\nf()\n",
            "File \"main.py\", line 2",
        ),
        (
            "javascript",
            "node",
            "function f() { throw new Error('boom') }\nf()\n",
            "(main.js:1:",
        ),
        (
            "ruby",
            "ruby",
            "def f\n  raise 'boom'\nend\nf\n",
            "main.rb:2:in",
        ),
    ];
    // With a warm pool, so both the pooled and the cold python runs are seen.
    let s = TestServer::start_with(&[], &[("REPLBOX_POOL", "1")]).await;
    for (lang, program, code, expect) in cases {
        if !require(lang, program) {
            continue;
        }
        for _ in 0..2 {
            let o = s.run(lang, code).await;
            assert!(o.is_error, "{lang}: {o:?}");
            let stderr = o.s("stderr");
            assert!(
                stderr.contains(expect),
                "{lang}: {expect:?} not in\n{stderr}"
            );
            assert!(
                !stderr.contains("/runs/"),
                "{lang}: a host path in\n{stderr}"
            );
        }
    }
    s.stop().await;
}

/// `serve` on a terminal says what it waits for and how to stop; on a pipe (an MCP
/// client) it says nothing.
#[test]
fn serve_on_a_terminal_prints_a_hint() {
    use std::io::Read;
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let mut child = std::process::Command::new(BIN)
        .arg("serve")
        .env("REPLBOX_POOL", "0")
        .env("REPLBOX_SESSION_POOL", "0")
        .env("REPLBOX_LOG", "error")
        .stdin(Stdio::from(pty.slave))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stderr = child.stderr.take().expect("stderr");
    let mut first = Vec::new();
    let mut byte = [0u8; 1];
    while !first.ends_with(b"\n") && first.len() < 4096 {
        match stderr.read(&mut byte) {
            Ok(1) => first.push(byte[0]),
            _ => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(pty.master);
    let line = String::from_utf8_lossy(&first);
    assert!(line.contains("waiting for an MCP client"), "{line:?}");
    assert!(line.contains("Ctrl-C"), "{line:?}");
    assert_eq!(line.trim_end().lines().count(), 1, "one line: {line:?}");

    let out = std::process::Command::new(BIN)
        .arg("serve")
        .env("REPLBOX_POOL", "0")
        .env("REPLBOX_SESSION_POOL", "0")
        .env("REPLBOX_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("serve on /dev/null");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("waiting for an MCP client"), "{err}");
}

/// The rows of the Markdown table that follows `header` in `text`, as cells.
fn table_after(text: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no table {header:?}");
    lines
        .skip(1) // | --- |
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// `--flag` -> its `[default: …]` in `serve --help` (None: no default shown).
fn help_defaults() -> std::collections::BTreeMap<String, Option<String>> {
    let out = std::process::Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .expect("serve --help");
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    let flag = regex::Regex::new(r"^\s+(?:-\w, )?(--[a-z0-9-]+)").unwrap();
    let mut found = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        if let Some(c) = flag.captures(line) {
            current = Some(c[1].to_string());
            found.insert(c[1].to_string(), None);
        } else if let (Some(f), Some(d)) = (&current, line.trim().strip_prefix("[default: ")) {
            found.insert(f.clone(), Some(d.trim_end_matches(']').to_string()));
        }
    }
    found
}

/// What a default cell of docs/configuration.md says, as `--help` would print it: a number (with MiB
/// expanded), a `word`, or nothing ("off", blank, a description).
fn readme_default(cell: &str) -> Option<String> {
    let cell = cell.trim();
    if let Some(word) = cell.strip_prefix('`').and_then(|c| c.strip_suffix('`'))
        && !word.contains('`')
    {
        return Some(word.to_string());
    }
    let mut parts = cell.split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    Some(match parts.next() {
        Some("MiB") => (n * 1024 * 1024).to_string(),
        _ => n.to_string(),
    })
}

/// The documents of features with flags of their own, beside docs/configuration.md.
const FEATURE_DOCS: [&str; 5] = [
    "http.md",
    "code-mode.md",
    "packages.md",
    "tasks.md",
    "cluster.md",
];

/// The documentation's tables say what the program does: the configuration defaults
/// (docs/configuration.md) are those of `serve --help`, every flag is documented there or
/// in the document of its feature (`FEATURE_DOCS`), and the session languages' aliases
/// (docs/session-languages.md) are the registry's.
#[test]
fn readme_matches_help_and_the_registry() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme =
        std::fs::read_to_string(format!("{root}/docs/configuration.md")).expect("configuration");
    let languages_doc = std::fs::read_to_string(format!("{root}/docs/session-languages.md"))
        .expect("session-languages.md");
    let feature_docs: Vec<String> = FEATURE_DOCS
        .iter()
        .map(|d| std::fs::read_to_string(format!("{root}/docs/{d}")).expect(d))
        .collect();
    let help = help_defaults();
    assert!(
        help.contains_key("--cpu-s") && help.contains_key("--log-format"),
        "{help:?}"
    );
    for row in table_after(&readme, "| flag | variable | default | what |") {
        let flags: Vec<&str> = row[0]
            .split('`')
            .filter(|f| f.starts_with("--"))
            .map(|f| f.split_whitespace().next().unwrap_or(f))
            .collect();
        let defaults: Vec<&str> = row[2].split(", ").collect();
        assert!(!flags.is_empty(), "{row:?}");
        for (i, f) in flags.iter().enumerate() {
            let shown = help.get(*f).unwrap_or_else(|| {
                panic!("docs/configuration.md lists {f}, which serve --help does not")
            });
            let cell = if defaults.len() == flags.len() {
                defaults[i]
            } else {
                &row[2]
            };
            assert_eq!(
                &readme_default(cell),
                shown,
                "docs/configuration.md's default of {f} ({cell:?}) is not --help's"
            );
        }
    }
    for f in help
        .keys()
        .filter(|f| !["--help", "--version"].contains(&f.as_str()))
    {
        let mark = format!("`{f}");
        assert!(
            readme.contains(&mark) || feature_docs.iter().any(|d| d.contains(&mark)),
            "{f} is documented in none of docs/configuration.md, {FEATURE_DOCS:?} (under docs/)"
        );
    }

    let registry = replbox::api::Registry::load(None).expect("built-in languages");
    let rows = table_after(&languages_doc, "| `language` | aliases |");
    let session_langs: Vec<_> = registry.all().iter().filter(|l| l.has_session()).collect();
    assert_eq!(rows.len(), session_langs.len(), "{rows:?}");
    for lang in session_langs {
        let row = rows
            .iter()
            .find(|r| r[0] == format!("`{}`", lang.id()))
            .unwrap_or_else(|| {
                panic!(
                    "{} is missing from docs/session-languages.md's table",
                    lang.id()
                )
            });
        let mut listed: Vec<&str> = row[1].split(", ").collect();
        let mut aliases: Vec<&str> = lang.spec.aliases.iter().map(String::as_str).collect();
        listed.sort();
        aliases.sort();
        assert_eq!(listed, aliases, "aliases of {}", lang.id());
    }
}
