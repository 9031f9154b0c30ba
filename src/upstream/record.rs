//! What is kept of one tool call: in the session's history and journal, the run's report,
//! the export. The result itself is kept (bounded) for the journal only, so a restored
//! session's replay answers the same call with it instead of calling again.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Arguments larger than this (as JSON) are kept as their hash only.
pub const KEPT_ARGUMENTS: usize = 16 * 1024;

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// The tool answered.
    Ok,
    /// The tool answered with an error (`isError`).
    ToolError,
    /// The upstream failed (a protocol error, a transport failure, it could not start).
    Failed,
    /// Past the call's time (or the evaluation's deadline).
    Timeout,
    /// The evaluation was interrupted, or ended, while it was in flight.
    Cancelled,
    /// Refused before reaching the upstream: not granted, no such tool, over a bound.
    Refused,
    /// The result was larger than `--mcp-max-result-bytes`.
    TooLarge,
}

impl CallStatus {
    pub fn word(self) -> &'static str {
        match self {
            CallStatus::Ok => "ok",
            CallStatus::ToolError => "tool_error",
            CallStatus::Failed => "failed",
            CallStatus::Timeout => "timeout",
            CallStatus::Cancelled => "cancelled",
            CallStatus::Refused => "refused",
            CallStatus::TooLarge => "too_large",
        }
    }
}

/// One call, as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRecord {
    pub server: String,
    pub tool: String,
    /// The arguments, when at most [`KEPT_ARGUMENTS`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// SHA-256 of the arguments' canonical JSON (keys sorted): what a replay matches on.
    pub arguments_sha256: String,
    pub status: CallStatus,
    pub duration_ms: u64,
    /// SHA-256 and size of the result as handed to the code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_sha256: Option<String>,
    #[serde(default)]
    pub result_bytes: u64,
    /// The result itself (ok and tool_error calls), when the cell's budget for results in
    /// the journal allowed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why it failed, in the server's words (or the start of the tool's error text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Answered from the journal's record on replay, not by the upstream.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
}

/// One tool call (no result body).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CallSummary {
    pub server: String,
    pub tool: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    pub status: CallStatus,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_sha256: Option<String>,
    pub result_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Answered from the journal on a restore, not by the server.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
}

impl CallRecord {
    pub fn summary(&self) -> CallSummary {
        CallSummary {
            server: self.server.clone(),
            tool: self.tool.clone(),
            arguments: self.arguments.clone(),
            status: self.status,
            duration_ms: self.duration_ms,
            result_sha256: self.result_sha256.clone(),
            result_bytes: self.result_bytes,
            error: self.error.clone(),
            replayed: self.replayed,
        }
    }

    /// The record without its result body (for the history, which does not replay).
    pub fn without_result(&self) -> Self {
        Self {
            result: None,
            ..self.clone()
        }
    }

    /// Bytes it takes in memory, roughly (history bounds).
    pub fn bytes(&self) -> usize {
        let v = |x: &Option<Value>| x.as_ref().map_or(0, |v| v.to_string().len());
        self.server.len() + self.tool.len() + v(&self.arguments) + v(&self.result) + 160
    }
}

/// Hex SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `v` as JSON with every object's keys sorted, so equal arguments hash alike.
pub fn canonical(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&m[k], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a = json!({"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": null}});
        let b: Value =
            serde_json::from_str(r#"{"a": {"x": null, "y": [1, {"c": 3, "d": 2}]}, "b": 1}"#)
                .unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(
            canonical(&a),
            r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#
        );
        assert_eq!(sha256(b"abc").len(), 64);
    }

    #[test]
    fn records_round_trip_and_refuse_unknown_fields() {
        let r = CallRecord {
            server: "s".into(),
            tool: "t".into(),
            arguments: Some(json!({"a": 1})),
            arguments_sha256: sha256(b"{}"),
            status: CallStatus::Ok,
            duration_ms: 3,
            result_sha256: Some(sha256(b"x")),
            result_bytes: 1,
            result: Some(json!({"structuredContent": {"sum": 3}})),
            error: None,
            replayed: false,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<CallRecord>(&text).unwrap(), r);
        assert!(
            serde_json::from_str::<CallRecord>(&text.replace("\"server\"", "\"x\":1,\"server\""))
                .is_err()
        );
    }
}
