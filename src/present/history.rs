//! What `session_history` shows: a session's cells, one line each.

use crate::session::history::HistoryReport;
use crate::session::report::EvalStatus;

impl HistoryReport {
    /// The session, then one line per cell: its status and its code's first line.
    pub fn text(&self) -> String {
        let mut t = format!(
            "session {} ({}, {}): {} cell(s)",
            self.session_id,
            self.language,
            self.state,
            self.cells.len()
        );
        if self.dropped > 0 {
            t.push_str(&format!(", {} older dropped", self.dropped));
        }
        t.push('\n');
        for c in &self.cells {
            let status = match (&c.status, &c.error) {
                (EvalStatus::Error, Some(e)) => format!("error {}: {}", e.kind, e.message),
                (s, _) => serde_json::to_value(s)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
            };
            let first = c.code.lines().next().unwrap_or("");
            let more = if c.code.lines().nth(1).is_some() {
                " …"
            } else {
                ""
            };
            t.push_str(&format!(
                "[{}] {} ({} ms): {}{}\n",
                c.eval_id,
                status.lines().next().unwrap_or(""),
                c.duration_ms,
                first.chars().take(120).collect::<String>(),
                more
            ));
        }
        for n in &self.notes {
            t.push_str(&format!("[{n}]\n"));
        }
        t
    }
}
