//! What the session tools other than evaluation show: a session started, interrupted,
//! closed, listed, exported or restored.

use rmcp::model::{ContentBlock, ResourceContents};

use crate::error::ToolError;
use crate::session::present::export::ExportReport;
use crate::session::report::RestoreReport;
use crate::session::{CloseReport, InterruptReport, ListReport, StartReport};

impl StartReport {
    /// The session, its interpreter and sandbox, then what came with it (files, packages,
    /// MCP servers) and its notes.
    pub fn text(&self) -> String {
        let mut text = format!(
            "session {} started{}: {} {} (pid {}) in {} (sandbox: {})\ninterpreter: {}",
            self.session_id,
            if self.warm { " warm" } else { "" },
            self.language,
            self.version,
            self.pid,
            self.cwd,
            self.sandbox,
            self.interpreter.line()
        );
        if !self.files.is_empty() {
            text.push_str(&format!("\nfiles brought in: {}", self.files.join(", ")));
        }
        if let Some(p) = &self.packages {
            text.push('\n');
            text.push_str(&p.line());
        }
        for s in &self.mcp_servers {
            text.push_str(&format!(
                "\nMCP server {} (tools.{}): {}",
                s.name,
                s.name,
                s.tools.join(", ")
            ));
        }
        for n in &self.notes {
            text.push_str(&format!("\n[{n}]"));
        }
        text
    }
}

impl InterruptReport {
    /// What was interrupted (an evaluation paused for input shows its own result instead).
    pub fn text(&self) -> String {
        if self.interrupted {
            format!(
                "interrupted evaluation {} of session {}",
                self.eval_id.unwrap_or_default(),
                self.session_id
            )
        } else {
            format!("session {} has nothing to interrupt", self.session_id)
        }
    }
}

impl CloseReport {
    pub fn text(&self) -> String {
        format!("session {} closed", self.session_id)
    }
}

/// `session_close` of a session that had ended: how it ended (the first sentence of the
/// error a call to it gets).
pub fn already_closed(ended: &ToolError) -> String {
    let how = ended.message.split(". ").next().unwrap_or_default();
    format!("already closed: {how}")
}

impl ExportReport {
    pub fn text(&self) -> String {
        let mut text = format!(
            "session {} exported as {} ({} cells, {} bytes): {}",
            self.session_id, self.format, self.cells, self.bytes, self.uri
        );
        for n in &self.notes {
            text.push_str(&format!("\n[{n}]"));
        }
        text
    }

    /// The text, then the document as an embedded resource.
    pub fn content(&self) -> Vec<ContentBlock> {
        vec![
            ContentBlock::text(self.text()),
            ContentBlock::resource(
                ResourceContents::text(self.document.clone(), self.uri.clone())
                    .with_mime_type(&self.mime_type),
            ),
        ]
    }
}

impl ListReport {
    /// One line per open session, then one per ended or suspended one.
    pub fn text(&self) -> String {
        let mut text = String::new();
        if self.sessions.is_empty() {
            text.push_str("no open sessions\n");
        }
        for s in &self.sessions {
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
        for e in &self.ended {
            text.push_str(&format!(
                "{} {} {} ({})",
                e.session_id, e.language, e.state, e.reason
            ));
            if let Some(until) = e.files_kept_until {
                text.push_str(&format!(", files kept until {until} (unix time)"));
            }
            if e.restorable {
                text.push_str(", restorable with session_restore");
            }
            text.push('\n');
        }
        text
    }
}

impl RestoreReport {
    /// The session restored, what was replayed, and each cell that failed on replay.
    pub fn text(&self) -> String {
        let mut t = format!(
            "session {} restored: {} {} (pid {}) in {}; {} cell(s) replayed",
            self.session_id, self.language, self.version, self.pid, self.cwd, self.replayed
        );
        if self.skipped > 0 {
            t.push_str(&format!(", {} that had failed skipped", self.skipped));
        }
        t.push_str(&format!(" ({} ms)", self.duration_ms));
        for f in &self.failed {
            t.push_str(&format!(
                "\n[cell {} failed on replay: {}]",
                f.eval_id,
                f.error
                    .as_ref()
                    .map(|e| format!("{}: {}", e.kind, e.message))
                    .unwrap_or_else(|| format!("{:?}", f.status).to_lowercase())
            ));
        }
        for n in &self.notes {
            t.push_str(&format!("\n[{n}]"));
        }
        t
    }
}
