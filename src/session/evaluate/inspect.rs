//! `session_inspect`: one name of a session looked at within a byte budget, printing
//! nothing in it: a table's shape, columns (dtype, nulls, distinct values) and first and
//! last rows; an array's shape, dtype and statistics; a function's or class's signature,
//! docstring and source; anything else's type and a bounded repr. The language's
//! `session.inspect` code runs as an internal evaluation and answers in the end marker's
//! payload (`inspect`), which is the session's to forge: it is checked and cut to the budget
//! here again.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::Evaluator;
use crate::error::{ErrorKind, ToolError};
use crate::session::live::Session;
use crate::session::report::payload_json;
use crate::session::table::Table;

/// The budget when none is asked for, and its bounds (an end marker carries at most
/// `scan::MAX_MARKER` bytes of base64).
pub const DEFAULT_BUDGET: usize = 2000;
pub const MIN_BUDGET: usize = 200;
pub const MAX_BUDGET: usize = 8000;
/// Longest name taken.
const MAX_NAME: usize = 200;
/// Fields kept of what the bootstrap sends.
const MAX_FIELDS: usize = 32;

/// What `session_inspect` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InspectReport {
    pub session_id: String,
    pub name: String,
    /// Its type, as the language names it.
    #[serde(rename = "type")]
    pub kind: String,
    /// What the language tells of it (shape, columns, head, tail, stats, signature, doc,
    /// source, repr, …), within the budget.
    pub details: Map<String, Value>,
    /// Something was cut or left out to stay within the budget.
    pub truncated: bool,
}

/// A text without terminal controls (newlines and tabs kept).
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// Why a name cannot be inspected: refused as given, or the session's answer says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InspectError {
    #[error(
        "name must be a variable name or a dotted path of attributes, at most {MAX_NAME} bytes \
         (df, model.coef_); to look at an expression, assign it to a name with session_eval \
         first"
    )]
    Name,
    #[error("the session gave no answer")]
    NoAnswer,
    /// The session's own error (printable, its first 500 characters).
    #[error("{0}")]
    Session(String),
}

/// A name the bootstrap is given: a variable, or a dotted path of attributes (`df`,
/// `model.coef_`), of identifier characters only.
pub fn check_name(name: &str) -> Result<(), InspectError> {
    let ident = |s: &str| {
        let mut cs = s.chars();
        cs.next()
            .is_some_and(|c| c.is_alphabetic() || c == '_' || c == '$')
            && cs.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
    };
    if name.is_empty() || name.len() > MAX_NAME || !name.split('.').all(ident) {
        return Err(InspectError::Name);
    }
    Ok(())
}

/// The hex of a name: what the code is given, so no name can change it.
fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The `inspect` of a payload, checked and cut to `budget` bytes of JSON.
fn from_payload(
    payload: &Value,
    budget: usize,
) -> Result<(String, Map<String, Value>, bool), InspectError> {
    let Some(obj) = payload["inspect"].as_object() else {
        return Err(InspectError::NoAnswer);
    };
    if let Some(e) = obj.get("error").and_then(Value::as_str) {
        return Err(InspectError::Session(printable(
            &e.chars().take(500).collect::<String>(),
        )));
    }
    let kind = obj
        .get("type")
        .and_then(Value::as_str)
        .map(|s| printable(&s.chars().take(200).collect::<String>()))
        .unwrap_or_else(|| "unknown".into());
    let mut truncated = obj.get("truncated").and_then(Value::as_bool) == Some(true);
    let mut details = Map::new();
    for (k, v) in obj.iter().take(MAX_FIELDS) {
        if k != "type" && k != "truncated" && k.len() <= 40 {
            details.insert(k.clone(), v.clone());
        }
    }
    truncated |= obj.len() > MAX_FIELDS;
    // The largest field goes first until the whole fits.
    while Value::Object(details.clone()).to_string().len() > budget {
        let Some(largest) = details
            .iter()
            .max_by_key(|(_, v)| v.to_string().len())
            .map(|(k, _)| k.clone())
        else {
            break;
        };
        details.remove(&largest);
        truncated = true;
    }
    Ok((kind, details, truncated))
}

impl Evaluator {
    /// Look at `name` in `session` within `budget` bytes.
    pub(in crate::session) async fn inspect(
        &self,
        table: &Table,
        session: &Session,
        name: &str,
        budget: usize,
        timeout: Duration,
    ) -> Result<InspectReport, ToolError> {
        let id = &session.id;
        check_name(name).map_err(|e| ToolError::invalid(e.to_string()).session(id))?;
        let Some(code) = session
            .lang
            .spec
            .session
            .as_ref()
            .and_then(|s| s.inspect.clone())
        else {
            return Err(ToolError::new(
                ErrorKind::UnsupportedLanguage,
                format!(
                    "{} sessions cannot inspect a name (its language folder has no \
session.inspect); session_vars lists the names with a summary, or evaluate code that prints \
what you need",
                    session.lang.id()
                ),
            )
            .session(id));
        };
        let code = code
            .replace("{name}", &hex(name))
            .replace("{budget}", &budget.to_string());
        let doing = format!("inspecting {name:?} in");
        let (marker, _) = self
            .internal_call(table, session, &code, timeout, &doing)
            .await?;
        let payload = payload_json(&marker.payload);
        let (kind, details, truncated) = from_payload(&payload, budget).map_err(|m| {
            ToolError::invalid(format!("session {id} cannot inspect {name:?}: {m}")).session(id)
        })?;
        Ok(InspectReport {
            session_id: id.to_string(),
            name: name.to_string(),
            kind,
            details,
            truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_identifiers_and_go_as_hex() {
        for ok in ["df", "model.coef_", "données", "$x", "_"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "x)",
            "x;import os",
            "a..b",
            "x[0]",
            "1x",
            "a.",
            &"a".repeat(201),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(hex("df\""), "646622");
    }

    #[test]
    fn a_payload_is_cut_to_the_budget() {
        let p = json!({"inspect": {"type": "pandas.DataFrame", "shape": [3, 2],
            "columns": [{"name": "a"}], "head": ["x".repeat(500)], "\u{1b}": 1}});
        let (kind, d, cut) = from_payload(&p, 100).expect("ok");
        assert_eq!(kind, "pandas.DataFrame");
        assert!(cut);
        assert!(Value::Object(d.clone()).to_string().len() <= 100, "{d:?}");
        assert_eq!(d["shape"], json!([3, 2]));
        let e = |p: &Value| from_payload(p, 100).unwrap_err().to_string();
        assert_eq!(
            e(&json!({"inspect": {"error": "NameError: x"}})),
            "NameError: x"
        );
        assert_eq!(e(&json!(null)), "the session gave no answer");
        assert_eq!(
            check_name("df[0]").unwrap_err().to_string(),
            "name must be a variable name or a dotted path of attributes, at most 200 bytes (df, \
             model.coef_); to look at an expression, assign it to a name with session_eval first"
        );
    }
}
