//! `session_vars`: the names the user defined in a session, each with its type and a short
//! summary, so an agent that lost its context sees what it has without printing it all.
//! The language's `session.vars` code runs as an internal evaluation; its bootstrap answers
//! in the end marker's payload (`vars`), or prints the REPL's own listing, which
//! `session.vars_pattern` reads (ghci's `:show bindings`).

use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::{Evaluator, busy_error};
use crate::error::{ErrorKind, ToolError};
use crate::session::interp::Ending;
use crate::session::live::{End, Phase, Session};
use crate::session::report::payload_json;
use crate::session::scan::EndMarker;
use crate::session::table::Table;

/// Names listed at most, whatever the bootstrap sends.
const MAX_VARS: usize = 500;
/// Longest field kept.
const MAX_FIELD: usize = 300;

/// One name the user defined.
#[derive(Debug, Clone, Serialize, JsonSchema, PartialEq, Eq)]
pub struct VarInfo {
    pub name: String,
    /// Its type, as the language names it.
    #[serde(rename = "type")]
    pub kind: String,
    /// What it is: `data`, or a `function` or `class` the user defined (imported ones are
    /// in the report's `imported`).
    #[serde(rename = "kind")]
    pub category: String,
    /// A short summary: length, shape and dtypes, a value cut short.
    pub summary: String,
    /// Bytes in memory, where the language can tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// What `session_vars` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct VarsReport {
    pub session_id: String,
    pub language: String,
    pub vars: Vec<VarInfo>,
    /// Functions and classes imported from elsewhere (`from math import sqrt`): not the
    /// user's, so named here rather than listed among `vars` (Python).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub imported: Vec<String>,
    /// Names left out to keep the answer short.
    pub omitted: u64,
}

fn cut(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_FIELD)
        .collect();
    s.trim().to_string()
}

/// `data`, `function` or `class`: as the bootstrap says, else from the type's name.
fn category(said: Option<&str>, type_name: &str) -> String {
    match said {
        Some(c @ ("data" | "function" | "class")) => c.into(),
        _ if type_name == "function" || type_name.contains("->") => "function".into(),
        _ if type_name == "class" => "class".into(),
        _ => "data".into(),
    }
}

/// The `imported` names of a payload, bounded like the rest.
fn imported_of(payload: &Value) -> Vec<String> {
    payload["imported"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str())
                .take(MAX_VARS)
                .map(cut)
                .collect()
        })
        .unwrap_or_default()
}

/// The `vars` of a payload, checked field by field (it comes from the session's process).
fn from_payload(payload: &Value) -> (Vec<VarInfo>, u64) {
    let list = payload["vars"].as_array().cloned().unwrap_or_default();
    let mut omitted = payload["vars_omitted"].as_u64().unwrap_or(0);
    let mut vars = Vec::new();
    for v in list {
        let (Some(name), Some(kind)) = (v["name"].as_str(), v["type"].as_str()) else {
            continue;
        };
        if vars.len() >= MAX_VARS {
            omitted += 1;
            continue;
        }
        vars.push(VarInfo {
            name: cut(name),
            kind: cut(kind),
            category: category(v["kind"].as_str(), kind),
            summary: cut(v["summary"].as_str().unwrap_or("")),
            size: v["size"].as_u64(),
        });
    }
    (vars, omitted)
}

/// The names in the output of a REPL's own listing, one match of `re` each.
fn from_output(output: &str, re: &regex::Regex) -> (Vec<VarInfo>, u64) {
    let mut vars: Vec<VarInfo> = Vec::new();
    let mut omitted = 0;
    for c in re.captures_iter(output) {
        let (Some(name), Some(kind)) = (c.name("name"), c.name("type")) else {
            continue;
        };
        if vars.len() >= MAX_VARS {
            omitted += 1;
            continue;
        }
        vars.push(VarInfo {
            name: cut(name.as_str()),
            kind: cut(kind.as_str()),
            category: category(None, kind.as_str()),
            summary: c.name("value").map_or(String::new(), |m| cut(m.as_str())),
            size: c.name("size").and_then(|m| m.as_str().trim().parse().ok()),
        });
    }
    (vars, omitted)
}

impl Evaluator {
    /// List the names the user defined in `session`.
    pub(in crate::session) async fn vars(
        &self,
        table: &Table,
        session: &Session,
        timeout: Duration,
    ) -> Result<VarsReport, ToolError> {
        let id = &session.id;
        let Some(code) = session
            .lang
            .spec
            .session
            .as_ref()
            .and_then(|s| s.vars.clone())
        else {
            return Err(ToolError::new(
                ErrorKind::UnsupportedLanguage,
                format!(
                    "{} sessions cannot list their names (its language folder has no \
session.vars); evaluate code that prints them instead",
                    session.lang.id()
                ),
            )
            .session(id));
        };
        let (marker, output) = self
            .internal_call(table, session, &code, timeout, "listing the names of")
            .await?;
        let (vars, omitted, imported) = match session.lang.vars_pattern() {
            Some(re) => {
                let (v, o) = from_output(&output, re);
                (v, o, Vec::new())
            }
            None => {
                let payload = payload_json(&marker.payload);
                let (v, o) = from_payload(&payload);
                (v, o, imported_of(&payload))
            }
        };
        Ok(VarsReport {
            session_id: id.to_string(),
            language: session.lang.id().to_string(),
            vars,
            imported,
            omitted,
        })
    }
}

impl Evaluator {
    /// Run `code` as an internal evaluation of an idle session (what `session_vars` and
    /// `session_inspect` ask): its end marker and output, or why it could not run or end.
    pub(super) async fn internal_call(
        &self,
        table: &Table,
        session: &Session,
        code: &str,
        timeout: Duration,
        doing: &str,
    ) -> Result<(EndMarker, String), ToolError> {
        let id = &session.id;
        if let Phase::AwaitingInput { eval, .. } = session.phase() {
            return Err(ToolError::new(
                ErrorKind::AwaitingInput,
                format!(
                    "session {id} is waiting for input to evaluation {eval}: answer it with \
session_input, or stop it with session_interrupt, first"
                ),
            )
            .session(id)
            .eval(Some(eval)));
        }
        let Ok(mut guard) = session.interp.try_lock() else {
            return Err(busy_error(session));
        };
        let Some(interp) = guard.as_mut() else {
            return Err(session.ended_error());
        };
        session.touch();
        let deadline = tokio::time::Instant::now() + timeout;
        let outcome = interp.internal(code, deadline).await;
        session.touch();
        match outcome.ending {
            Ending::Done(m) => Ok((m, outcome.output.text)),
            Ending::Exited(_) => {
                *guard = None;
                drop(guard);
                let how = End::Exited {
                    code: None,
                    signal: None,
                    replaced_by: None,
                };
                table.mark_ended(session, how);
                Err(session.ended_error())
            }
            ending => Err(unfinished(id, timeout, &ending, doing)),
        }
    }
}

/// The error for an internal evaluation that did not finish in time.
fn unfinished(id: &str, timeout: Duration, ending: &Ending, doing: &str) -> ToolError {
    let what = if matches!(ending, Ending::Restarted { .. }) {
        "the interpreter had to be restarted: its state is lost"
    } else {
        "it was interrupted and the session keeps its state (try a longer timeout_ms)"
    };
    ToolError::internal(format!(
        "{doing} session {id} did not finish in {} ms; {what}",
        timeout.as_millis()
    ))
    .session(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_checked_and_bounded() {
        let p = serde_json::json!({"vars": [
            {"name": "df", "type": "pandas.DataFrame", "summary": "shape (3, 2)", "size": 180},
            {"name": "x\u{1b}[31m", "type": "int", "summary": "1"},
            {"type": "nameless"},
            {"name": "f", "type": "function", "size": -1},
        ], "vars_omitted": 2});
        let (vars, omitted) = from_payload(&p);
        assert_eq!(omitted, 2);
        assert_eq!(vars.len(), 3);
        assert_eq!(vars[0].size, Some(180));
        assert_eq!(vars[1].name, "x [31m");
        assert_eq!(vars[2].size, None);
        let many = serde_json::json!({"vars": (0..600).map(|i| serde_json::json!({"name": format!("v{i}"), "type": "int"})).collect::<Vec<_>>()});
        let (vars, omitted) = from_payload(&many);
        assert_eq!((vars.len(), omitted), (MAX_VARS, 100));
    }

    #[test]
    fn a_listing_is_read_with_the_pattern() {
        let re =
            regex::Regex::new(r"(?m)^(?P<name>[^\s:]+) :: (?P<type>.+?)(?: = (?P<value>.*))?$")
                .unwrap();
        let (vars, _) = from_output("x :: Integer = 42\nf :: Int -> Int = _\n", &re);
        assert_eq!(vars[0].name, "x");
        assert_eq!(vars[0].kind, "Integer");
        assert_eq!(vars[0].summary, "42");
        assert_eq!(vars[1].kind, "Int -> Int");
    }
}
