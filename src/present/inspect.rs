//! What `session_vars` and `session_inspect` show: the names a session defined, and one
//! of them in detail.

use serde_json::Value;

use crate::session::evaluate::{InspectReport, VarsReport, printable};

impl VarsReport {
    /// The user's data first, then what they defined, then what was imported.
    pub fn text(&self) -> String {
        let mut t = if self.vars.is_empty() {
            format!("session {}: no names defined\n", self.session_id)
        } else {
            String::new()
        };
        // The user's data first, then what they defined to work on it.
        let data = self.vars.iter().filter(|v| v.category == "data");
        let defined = self.vars.iter().filter(|v| v.category != "data");
        for v in data.chain(defined) {
            t.push_str(&format!("{}: {}", v.name, v.kind));
            if !v.summary.is_empty() {
                t.push_str(&format!(" = {}", v.summary));
            }
            if let Some(s) = v.size {
                t.push_str(&format!(" ({})", crate::session::files::human_size(s)));
            }
            t.push('\n');
        }
        if !self.imported.is_empty() {
            t.push_str(&format!("imported: {}\n", self.imported.join(", ")));
        }
        if self.omitted > 0 {
            t.push_str(&format!("[{} more not listed]\n", self.omitted));
        }
        t
    }
}

impl InspectReport {
    /// The name and its type, then its details: short facts, samples, long texts.
    pub fn text(&self) -> String {
        let mut t = format!("{}: {}\n", self.name, self.kind);
        // The short facts first, then the samples, then the long texts.
        let rank = |k: &str| ORDER.iter().position(|o| *o == k).unwrap_or(ORDER.len());
        let mut fields: Vec<(&String, &Value)> = self.details.iter().collect();
        fields.sort_by_key(|(k, _)| rank(k));
        for (k, v) in fields {
            match v {
                // Code and prose read as they are, in their own lines.
                Value::String(s) if s.contains('\n') => {
                    t.push_str(&format!("{k}:\n{}\n", printable(s).trim_end()));
                }
                Value::String(s) => t.push_str(&format!("{k}: {}\n", printable(s))),
                v => t.push_str(&format!("{k}: {v}\n")),
            }
        }
        if self.truncated {
            t.push_str("[cut to the budget: ask for a larger budget_bytes to see more]\n");
        }
        t
    }
}

/// The order fields are shown in; others come last.
const ORDER: &[&str] = &[
    "summary",
    "kind",
    "shape",
    "dtype",
    "len",
    "size",
    "nulls",
    "signature",
    "stats",
    "columns",
    "head",
    "tail",
    "members",
    "doc",
    "source",
    "repr",
];
