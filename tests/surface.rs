//! The MCP surface as clients see it: schemas every client accepts, the messages a
//! mistaken call gets, logging/setLevel and the log notifications of a client's own calls,
//! and the audit line each call leaves on stderr.

mod common;

use common::*;
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
    let s = TestServer::start().await;
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
