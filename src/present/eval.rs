//! What `session_eval` and `session_input` (and a paused evaluation's interrupt) show: the
//! text of an evaluation and its content blocks.

use base64::Engine;
use rmcp::model::{ContentBlock, ResourceContents};

use crate::session::EvalReport;
use crate::session::files::{Change, FileChange, human_size};
use crate::session::report::{EvalStatus, RichContent};

impl EvalReport {
    /// The text content: the output, then a line saying how it ended when not `ok`.
    pub fn text(&self) -> String {
        let mut t = match &self.background_output {
            Some(bg) => {
                let nl = if bg.ends_with('\n') { "" } else { "\n" };
                format!(
                    "[background output of earlier cells]\n{bg}{nl}[this cell]\n{}",
                    self.output
                )
            }
            None => self.output.clone(),
        };
        let trailer = match self.status {
            EvalStatus::Ok => None,
            EvalStatus::Error => Some(match &self.error {
                Some(e) if e.message.is_empty() => format!("[error: {}]", e.kind),
                Some(e) => format!("[error: {}: {}]", e.kind, first_line(&e.message)),
                None => "[error]".to_string(),
            }),
            EvalStatus::Timeout => Some(if self.restarted == Some(true) {
                format!(
                    "[timed out after {} ms; the interpreter did not stop and was restarted: state lost]",
                    self.duration_ms
                )
            } else {
                format!(
                    "[timed out after {} ms; interrupted, the session keeps its state]",
                    self.duration_ms
                )
            }),
            EvalStatus::Exited => Some(format!(
                "[the interpreter exited ({}); start a new session with session_start]",
                match (&self.exit_code, &self.signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("killed by {s}"),
                    _ => "status unknown".into(),
                }
            )),
            EvalStatus::AwaitingInput => {
                Some("[waiting for input: answer with session_input, or interrupt]".to_string())
            }
        };
        let mut lines: Vec<String> = trailer.into_iter().collect();
        if !self.images.is_empty() {
            let list: Vec<String> = self
                .images
                .iter()
                .map(|i| format!("{} ({}x{})", i.name, i.width, i.height))
                .collect();
            lines.push(format!("[images attached: {}]", list.join(", ")));
        }
        for d in &self.displays {
            let mut what = d.mime_types.join(", ");
            if let Some(shape) = d.frame.as_ref().and_then(|f| f.get("shape")) {
                if !what.is_empty() {
                    what.push_str("; ");
                }
                what.push_str(&format!("a table of shape {shape} in structuredContent"));
            }
            lines.push(format!("[display: {what}]"));
        }
        if !self.files.is_empty() {
            lines.push(files_line(&self.files, self.files_omitted));
        }
        lines.extend(self.notes.iter().map(|n| format!("[{n}]")));
        for line in lines {
            if !t.is_empty() && !t.ends_with('\n') {
                t.push('\n');
            }
            t.push_str(&line);
        }
        t
    }

    /// An evaluation's content: its text, then the whole output's link, each figure (an image
    /// and its link), the files it changed (links) and its displays.
    pub fn content(&self) -> Vec<ContentBlock> {
        let mut out = vec![ContentBlock::text(self.text())];
        let b64 = base64::engine::general_purpose::STANDARD;
        // The whole output, when the text holds only its head and tail.
        if let Some((uri, text)) = &self.whole {
            let name = uri.rsplit('/').next().unwrap_or_default();
            out.push(shown_link(uri, name, "text/plain", text.len()));
        }
        // Each figure, then a link that reads it again later.
        for (a, info) in self.attachments.iter().zip(&self.images) {
            out.push(ContentBlock::image(
                b64.encode(&a.data),
                a.mime_type.clone(),
            ));
            out.push(shown_link(&a.uri, &info.name, &a.mime_type, a.data.len()));
        }
        // Files the evaluation created or changed, as links the client can read (`resources/read`)
        // instead of copies; at most the ten the text names.
        for f in self.files.iter().take(10) {
            if let Some(uri) = &f.uri {
                let mut link =
                    rmcp::model::Resource::new(uri.clone(), f.path.clone()).with_size(f.size);
                if let Some(m) = crate::session::files::mime_for(&f.path) {
                    link = link.with_mime_type(m);
                }
                out.push(ContentBlock::resource_link(link));
            }
        }
        // A display's images are followed by their links; its text parts carry their URI; its
        // linked parts are links only.
        for block in &self.rich {
            match &block.content {
                RichContent::Image(data) => {
                    out.push(ContentBlock::image(
                        b64.encode(data),
                        block.mime_type.clone(),
                    ));
                    let name = block.uri.rsplit('/').next().unwrap_or_default();
                    out.push(shown_link(&block.uri, name, &block.mime_type, data.len()));
                }
                RichContent::Link(data) => {
                    let name = block.uri.rsplit('/').next().unwrap_or_default();
                    out.push(shown_link(&block.uri, name, &block.mime_type, data.len()));
                }
                RichContent::Text(text) => out.push(ContentBlock::resource(
                    ResourceContents::text(text.clone(), block.uri.clone())
                        .with_mime_type(&block.mime_type),
                )),
            }
        }
        out
    }
}

/// `[files: created out.csv (1.2 KiB); modified a.txt (3 B); deleted old.txt]`, at most
/// ten named.
fn files_line(files: &[FileChange], omitted: u64) -> String {
    const SHOWN: usize = 10;
    let mut parts: Vec<String> = files
        .iter()
        .take(SHOWN)
        .map(|f| match f.change {
            Change::Created => format!("created {} ({})", f.path, human_size(f.size)),
            Change::Modified => format!("modified {} ({})", f.path, human_size(f.size)),
            Change::Deleted => format!("deleted {}", f.path),
        })
        .collect();
    let more = files.len().saturating_sub(SHOWN) as u64 + omitted;
    if more > 0 {
        parts.push(format!("and {more} more"));
    }
    format!("[files: {}]", parts.join("; "))
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// A `resource_link` to a figure or display part the session keeps.
fn shown_link(uri: &str, name: &str, mime: &str, size: usize) -> ContentBlock {
    ContentBlock::resource_link(
        rmcp::model::Resource::new(uri.to_string(), name.to_string())
            .with_mime_type(mime.to_string())
            .with_size(size as u64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::report::ImageInfo;

    #[test]
    fn text_lists_images_files_and_notes_after_the_output() {
        let mut r = EvalReport::empty("s", 1);
        r.output = "hi\n".into();
        assert_eq!(r.text(), "hi\n");
        r.images.push(ImageInfo {
            name: "figure-1.png".into(),
            mime_type: "image/png".into(),
            bytes: 10,
            width: 640,
            height: 480,
            uri: String::new(),
        });
        r.files.push(FileChange {
            path: "out.csv".into(),
            size: 1229,
            change: Change::Created,
            uri: None,
        });
        r.notes.push("2 figures left out".into());
        assert_eq!(
            r.text(),
            "hi\n[images attached: figure-1.png (640x480)]\n[files: created out.csv (1.2 KiB)]\n[2 figures left out]"
        );
    }
}
