//! A session's history as a document: `session_history` (the cells), and `session_export`
//! as a Jupyter notebook (nbformat 4.5: one code cell per evaluation with its outputs, the
//! language's kernelspec and language_info) or as a script with cell separators (`# %%`).
//! Open, ended (while kept) and suspended sessions alike; a suspended one has no outputs.

use std::sync::Arc;

use base64::Engine;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::ToolError;
use crate::identity::Caller;
use crate::lang::{Language, NotebookSpec, protocol};
use crate::session::files::export_uri;
use crate::session::history::{Cell, CellInfo, HistoryReport, Record, Shown};
use crate::session::live::lock;
use crate::session::manager::SessionManager;
use crate::session::report::EvalStatus;
use crate::session::table::Entry;

/// What to export a session as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Ipynb,
    Script,
}

/// The cells of a session and what they are written with.
pub(super) struct Source {
    pub id: String,
    pub language: String,
    pub lang: Option<Arc<Language>>,
    pub state: &'static str,
    pub cells: Vec<Cell>,
    pub dropped: u64,
    pub notes: Vec<String>,
}

/// What `session_export` returns besides the document itself.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ExportReport {
    pub session_id: String,
    /// `ipynb` or `script`.
    pub format: String,
    /// The resource the document is also readable as.
    pub uri: String,
    pub mime_type: String,
    pub cells: usize,
    pub bytes: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The document (sent as an embedded resource, not in the structured result).
    #[serde(skip)]
    #[schemars(skip)]
    pub document: String,
}

impl SessionManager {
    /// The caller's session `id` as a history source: open, ended while its record is
    /// kept, or suspended (from its journal).
    pub(super) async fn source(&self, caller: &Caller, id: &str) -> Result<Source, ToolError> {
        self.cluster_gate(caller, id).await?;
        let from = |record: &std::sync::Mutex<Record>| {
            let r = lock(record);
            let mut notes = Vec::new();
            notes.extend(r.history.dropped_note());
            (
                r.history.cells().cloned().collect::<Vec<_>>(),
                r.history.dropped(),
                notes,
            )
        };
        // An open session's record, or an ended one's while it is kept.
        let record = self.table.read(|st| {
            let e = st.get(id).filter(|e| e.owner() == caller)?;
            match e {
                Entry::Open(s) => Some((s.record.clone(), s.lang.clone(), "open")),
                _ => e
                    .kept()
                    .map(|k| (k.record.clone(), k.lang.clone(), "ended")),
            }
        });
        if let Some((record, lang, state)) = record {
            let (cells, dropped, notes) = from(&record);
            return Ok(Source {
                id: id.into(),
                language: lang.id().into(),
                lang: Some(lang),
                state,
                cells,
                dropped,
                notes,
            });
        }
        if let Some(s) = self.table.suspended(caller, id) {
            let j = self.journals.read(&s).await?;
            let lang = self.registry.get(&j.request.language).ok();
            let cells = j
                .cells
                .into_iter()
                .map(|c| Cell::not_replayed(&c))
                .collect();
            return Ok(Source {
                id: id.into(),
                language: lang
                    .as_ref()
                    .map_or(j.request.language.clone(), |l| l.id().to_string()),
                lang,
                state: "suspended",
                cells,
                dropped: 0,
                notes: vec![
                    "the session is suspended: its journal has the code and status of its \
cells, not their outputs (restore it to run them again)"
                        .into(),
                ],
            });
        }
        // Unknown, or ended and no longer kept: the lookup says which.
        Err(self
            .lookup(caller, id)
            .err()
            .unwrap_or_else(|| ToolError::internal("the session vanished")))
    }

    /// `session_history`.
    pub async fn history(&self, caller: &Caller, id: &str) -> Result<HistoryReport, ToolError> {
        let s = self.source(caller, id).await?;
        Ok(HistoryReport {
            session_id: s.id,
            language: s.language,
            state: s.state.into(),
            cells: s.cells.iter().map(CellInfo::from).collect(),
            dropped: s.dropped,
            notes: s.notes,
        })
    }

    /// `session_export`.
    pub async fn export(
        &self,
        caller: &Caller,
        id: &str,
        format: Format,
    ) -> Result<ExportReport, ToolError> {
        let s = self.source(caller, id).await?;
        let facts = s.lang.as_ref().and_then(|l| l.spec.notebook.clone());
        let version = s
            .lang
            .as_ref()
            .and_then(|l| l.detected().map(|d| d.version.clone()));
        let mut notes = s.notes.clone();
        let (document, uri, mime, name) = match format {
            Format::Ipynb => {
                if facts.is_none() {
                    notes.push(format!(
                        "{} has no [notebook] facts in its language folder: the notebook names \
no kernel",
                        s.language
                    ));
                }
                let nb = notebook(&s, facts.as_ref(), version.as_deref());
                let text = serde_json::to_string_pretty(&nb)
                    .map_err(|e| ToolError::internal(format!("cannot write the notebook: {e}")))?;
                (
                    text,
                    export_uri(id, "ipynb"),
                    "application/x-ipynb+json".to_string(),
                    "ipynb",
                )
            }
            Format::Script => {
                let (comment, ext) = facts.as_ref().map_or(("#", "txt"), |f| {
                    (f.comment.as_str(), &f.file_extension[1..])
                });
                let setup = facts.as_ref().and_then(|f| setup_code(f, &s.cells, false));
                let mime = facts
                    .as_ref()
                    .and_then(|f| f.mimetype.clone())
                    .unwrap_or_else(|| "text/plain".into());
                (
                    script(&s, comment, version.as_deref(), setup.as_deref()),
                    export_uri(id, ext),
                    mime,
                    "script",
                )
            }
        };
        Ok(ExportReport {
            session_id: s.id,
            format: name.into(),
            uri,
            mime_type: mime,
            cells: s.cells.len(),
            bytes: document.len(),
            notes,
            document,
        })
    }

    /// The export a resource URI names: `export.ipynb`, or `export.<ext>` with the script
    /// extension of the session's language.
    pub async fn export_resource(
        &self,
        caller: &Caller,
        id: &str,
        ext: &str,
    ) -> Result<ExportReport, ToolError> {
        if ext == "ipynb" {
            return self.export(caller, id, Format::Ipynb).await;
        }
        let r = self.export(caller, id, Format::Script).await?;
        if !r.uri.ends_with(&format!("/export.{ext}")) {
            return Err(ToolError::invalid(format!(
                "session {id} exports as export.ipynb or {}",
                r.uri.rsplit('/').next().unwrap_or("")
            )));
        }
        Ok(r)
    }
}

/// Text as nbformat's multi-line strings: a list of lines, each with its newline.
fn lines(text: &str) -> Value {
    Value::from(
        text.split_inclusive('\n')
            .map(str::to_string)
            .collect::<Vec<_>>(),
    )
}

fn status_word(s: EvalStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The notebook of a session (nbformat 4.5).
pub(super) fn notebook(s: &Source, facts: Option<&NotebookSpec>, version: Option<&str>) -> Value {
    let mut cells = Vec::new();
    if s.dropped > 0 {
        cells.push(json!({
            "cell_type": "markdown",
            "id": "replbox-dropped",
            "metadata": {},
            "source": lines(&format!(
                "*{} earlier evaluation(s) of this session were no longer kept and are not in \
        this notebook.*",
                s.dropped
            )),
        }));
    }
    if let Some(code) = facts.and_then(|f| setup_code(f, &s.cells, true)) {
        cells.push(json!({
            "cell_type": "code",
            "id": "replbox-setup",
            "execution_count": null,
            "metadata": {"tags": ["replbox-setup"], "replbox": {"setup": true}},
            "source": lines(&code),
            "outputs": [],
        }));
    }
    for c in &s.cells {
        cells.push(code_cell(c));
    }
    let mut metadata = serde_json::Map::new();
    if let Some(f) = facts {
        metadata.insert(
            "kernelspec".into(),
            json!({"name": f.kernel, "display_name": f.display_name, "language": f.language}),
        );
        let mut info = serde_json::Map::new();
        info.insert("name".into(), Value::from(f.language.clone()));
        if let Some(v) = version {
            info.insert("version".into(), Value::from(v));
        }
        info.insert(
            "file_extension".into(),
            Value::from(f.file_extension.clone()),
        );
        for (k, v) in [
            ("mimetype", &f.mimetype),
            ("pygments_lexer", &f.pygments_lexer),
            ("codemirror_mode", &f.codemirror_mode),
        ] {
            if let Some(v) = v {
                info.insert(k.into(), Value::from(v.clone()));
            }
        }
        metadata.insert("language_info".into(), Value::Object(info));
    }
    metadata.insert(
        "replbox".into(),
        json!({"session_id": s.id, "language": s.language, "state": s.state,
               "dropped_cells": s.dropped}),
    );
    json!({
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": metadata,
        "cells": cells,
    })
}

/// One evaluation as a code cell: its source, then what it printed (`stream`), the value
/// shown (`execute_result`), its figures (`display_data`), its error (`error`). A cell that
/// raised is tagged `raises-exception` and one that never finished (timeout, exit, input)
/// `skip-execution`, so that re-running the notebook top to bottom (nbclient honours both)
/// goes the way the session went.
fn code_cell(c: &Cell) -> Value {
    let n = c.eval_id;
    let o = &c.outputs;
    let mut outputs = Vec::new();
    if !o.stream.is_empty() {
        outputs.push(json!({"output_type": "stream", "name": "stdout", "text": lines(&o.stream)}));
    }
    if let Some(v) = &o.value {
        outputs.push(json!({
            "output_type": "execute_result",
            "execution_count": n,
            "data": {"text/plain": lines(v)},
            "metadata": {},
        }));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    for png in &o.images {
        outputs.push(json!({
            "output_type": "display_data",
            "data": {"image/png": b64.encode(&png.data), "text/plain": ["<Figure>"]},
            "metadata": {},
        }));
    }
    outputs.extend(o.displays.iter().filter(|d| !d.linked).map(display_data));
    let tags = outcome(c, &mut outputs);
    json!({
        "cell_type": "code",
        "id": format!("cell-{n}"),
        "execution_count": n,
        "metadata": cell_metadata(c, tags),
        "source": lines(&c.code),
        "outputs": outputs,
    })
}

/// Each part of a rich display as display_data with its MIME type: text forms as lines,
/// JSON forms as JSON, images as base64 (as nbformat's mimebundle has them).
fn display_data(d: &Shown) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    let m = d.mime_type.as_str();
    let value = if m.starts_with("image/") && m != "image/svg+xml" {
        Value::from(b64.encode(&d.data))
    } else if m == "application/json" || (m.starts_with("application/") && m.ends_with("+json")) {
        // nbformat takes JSON only for these types; others (`….v6.json`) are strings.
        serde_json::from_slice(&d.data)
            .unwrap_or_else(|_| Value::from(String::from_utf8_lossy(&d.data).into_owned()))
    } else {
        lines(&String::from_utf8_lossy(&d.data))
    };
    json!({
        "output_type": "display_data",
        "data": {m: value},
        "metadata": {},
    })
}

/// How the cell ended, for nbclient: its tags, and its error appended to `outputs`.
fn outcome(c: &Cell, outputs: &mut Vec<Value>) -> Vec<&'static str> {
    let mut tags = Vec::new();
    match c.status {
        EvalStatus::Ok => {}
        EvalStatus::Error => {
            tags.push("raises-exception");
            let (ename, evalue) = c
                .error
                .as_ref()
                .map_or(("Error".to_string(), String::new()), |e| {
                    (e.kind.clone(), e.message.clone())
                });
            outputs.push(json!({
                "output_type": "error",
                "ename": ename,
                "evalue": evalue,
                "traceback": c.outputs.traceback,
            }));
        }
        EvalStatus::Timeout | EvalStatus::Exited | EvalStatus::AwaitingInput => {
            tags.push("skip-execution");
        }
    }
    tags
}

/// The cell's metadata: its `tags`, and the session's own record of the evaluation.
fn cell_metadata(c: &Cell, tags: Vec<&'static str>) -> serde_json::Map<String, Value> {
    let n = c.eval_id;
    let mut meta = serde_json::Map::new();
    if !tags.is_empty() {
        meta.insert("tags".into(), Value::from(tags));
    }
    let mut ours = json!({"eval_id": n, "status": status_word(c.status), "duration_ms": c.duration_ms,
               "started_at": c.started_at, "replayed": c.replayed});
    if !c.tool_calls.is_empty() {
        // Where the cell's data came from (code mode): each call, without its result.
        let calls: Vec<_> = c.tool_calls.iter().map(|t| t.summary()).collect();
        ours["tool_calls"] = serde_json::to_value(calls).unwrap_or_default();
    }
    meta.insert("replbox".into(), ours);
    meta
}

/// Every line terminator of a language a script may be read as: Python ends a comment at a
/// lone `\r`, JavaScript at U+2028. Text that goes into a comment is split at each of them,
/// so nothing of it runs when the script is run.
const LINE_BREAKS: &[char] = &[
    '\n', '\r', '\u{b}', '\u{c}', '\u{85}', '\u{2028}', '\u{2029}',
];

/// `text` as the lines of a comment (a final terminator ends the last line).
fn comment_lines(text: &str) -> Vec<&str> {
    let mut v: Vec<&str> = text
        .split("\r\n")
        .flat_map(|l| l.split(LINE_BREAKS))
        .collect();
    if v.last() == Some(&"") {
        v.pop();
    }
    v
}

/// The language's setup code for an export (see [`NotebookSpec::setup`]): the answers
/// typed into the cells that run again (in a notebook those that raised too; in a script
/// only those that succeeded), as a string literal of the language (`{answers:json}`,
/// `{answers:r}`, …: data, whatever the answers hold).
fn setup_code(facts: &NotebookSpec, cells: &[Cell], in_notebook: bool) -> Option<String> {
    let setup = facts.setup.as_ref()?;
    let answers: String = cells
        .iter()
        .filter(|c| c.status == EvalStatus::Ok || (in_notebook && c.status == EvalStatus::Error))
        .map(|c| c.typed.as_str())
        .collect();
    Some(protocol::expand_source(
        &setup.text,
        &[(protocol::SETUP_VARS[0].0, protocol::Value::Text(&answers))],
    ))
}

/// The session as a script: `# %%` before each cell (the language's line comment), cells
/// that did not succeed commented out; the language's setup code first.
pub(super) fn script(
    s: &Source,
    comment: &str,
    version: Option<&str>,
    setup: Option<&str>,
) -> String {
    let mut out = format!(
        "{comment} replbox session {} ({}{}), {} cell(s)\n",
        s.id,
        s.language,
        version.map(|v| format!(" {v}")).unwrap_or_default(),
        s.cells.len()
    );
    if s.dropped > 0 {
        out.push_str(&format!(
            "{comment} {} earlier cell(s) were no longer kept\n",
            s.dropped
        ));
    }
    if let Some(code) = setup {
        out.push_str(&format!("\n{comment} %% [setup]\n"));
        out.push_str(code);
        if !code.ends_with('\n') {
            out.push('\n');
        }
    }
    for c in &s.cells {
        out.push('\n');
        let failed = c.status != EvalStatus::Ok;
        let why = match (&c.status, &c.error) {
            (EvalStatus::Ok, _) => String::new(),
            (_, Some(e)) => format!(
                " {}: {}: {}",
                status_word(c.status),
                e.kind,
                comment_lines(&e.message).first().unwrap_or(&"")
            ),
            (st, None) => format!(" {}", status_word(*st)),
        };
        // The kind and message are the code's own words: one line of them.
        let why = comment_lines(&why).first().copied().unwrap_or_default();
        out.push_str(&format!("{comment} %% [{}]{why}\n", c.eval_id));
        for t in &c.tool_calls {
            // One comment line per call: where the cell's data came from.
            let args = t
                .arguments
                .as_ref()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let args: String = args.chars().take(200).collect();
            let line = format!(
                "tool call: {}.{}({args}) -> {}, {} bytes{}",
                t.server,
                t.tool,
                t.status.word(),
                t.result_bytes,
                t.result_sha256
                    .as_deref()
                    .map(|h| format!(", sha256 {}", &h[..16.min(h.len())]))
                    .unwrap_or_default()
            );
            let line = comment_lines(&line).first().copied().unwrap_or_default();
            out.push_str(&format!("{comment} {line}\n"));
        }
        if failed {
            for line in comment_lines(&c.code) {
                out.push_str(&format!("{comment} {line}\n"));
            }
        } else {
            for line in c.code.lines() {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::history::Outputs;
    use crate::session::report::ErrorInfo;

    fn source() -> Source {
        let cell = |n, code: &str, status, error: Option<(&str, &str)>, outputs| Cell {
            eval_id: n,
            code: code.into(),
            status,
            error: error.map(|(k, m)| ErrorInfo {
                kind: k.into(),
                message: m.into(),
            }),
            duration_ms: 3,
            started_at: 1_700_000_000,
            outputs,
            replayed: false,
            tool_calls: Vec::new(),
            typed: String::new(),
        };
        Source {
            id: "s1".into(),
            language: "python".into(),
            lang: None,
            state: "open",
            cells: vec![
                cell(
                    1,
                    "print('hi')\n6 * 7",
                    EvalStatus::Ok,
                    None,
                    Outputs {
                        stream: "hi\n".into(),
                        value: Some("42".into()),
                        traceback: vec![],
                        images: vec![crate::session::history::Shown {
                            uri: "replbox://sessions/s/figures/1-1.png".into(),
                            mime_type: "image/png".into(),
                            data: b"\x89PNG".to_vec(),
                            linked: false,
                        }],
                        displays: vec![
                            crate::session::history::Shown {
                                uri: "replbox://sessions/s/displays/1-2.html".into(),
                                mime_type: "text/html".into(),
                                data: b"<b>x</b>\n<i>y</i>".to_vec(),
                                linked: false,
                            },
                            crate::session::history::Shown {
                                uri: "replbox://sessions/s/displays/1-3.json".into(),
                                mime_type: "application/vnd.plotly.v1+json".into(),
                                data: br#"{"data": []}"#.to_vec(),
                                linked: false,
                            },
                        ],
                        whole: None,
                    },
                ),
                cell(
                    2,
                    "1/0",
                    EvalStatus::Error,
                    Some(("ZeroDivisionError", "division by zero")),
                    Outputs {
                        traceback: vec!["Traceback (most recent call last):".into()],
                        ..Outputs::default()
                    },
                ),
                cell(3, "input()", EvalStatus::Timeout, None, Outputs::default()),
            ],
            dropped: 2,
            notes: vec![],
        }
    }

    #[test]
    fn a_notebook_has_a_cell_per_evaluation_with_its_outputs() {
        let facts = NotebookSpec {
            kernel: "python3".into(),
            display_name: "Python 3 (ipykernel)".into(),
            language: "python".into(),
            file_extension: ".py".into(),
            mimetype: Some("text/x-python".into()),
            pygments_lexer: None,
            codemirror_mode: None,
            comment: "#".into(),
            setup: None,
        };
        let nb = notebook(&source(), Some(&facts), Some("3.11.7"));
        assert_eq!(nb["nbformat"], 4);
        assert_eq!(nb["metadata"]["kernelspec"]["name"], "python3");
        assert_eq!(nb["metadata"]["language_info"]["version"], "3.11.7");
        let cells = nb["cells"].as_array().unwrap();
        assert_eq!(cells[0]["cell_type"], "markdown");
        let c1 = &cells[1];
        assert_eq!(c1["source"], json!(["print('hi')\n", "6 * 7"]));
        let kinds: Vec<&str> = c1["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["output_type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "stream",
                "execute_result",
                "display_data",
                "display_data",
                "display_data"
            ]
        );
        assert_eq!(c1["outputs"][1]["data"]["text/plain"], json!(["42"]));
        assert_eq!(c1["outputs"][2]["data"]["image/png"], "iVBORw==");
        assert_eq!(
            c1["outputs"][3]["data"]["text/html"],
            json!(["<b>x</b>\n", "<i>y</i>"])
        );
        assert_eq!(
            c1["outputs"][4]["data"]["application/vnd.plotly.v1+json"],
            json!({"data": []})
        );
        let c2 = &cells[2];
        assert_eq!(c2["metadata"]["tags"], json!(["raises-exception"]));
        assert_eq!(c2["outputs"][0]["ename"], "ZeroDivisionError");
        assert_eq!(cells[3]["metadata"]["tags"], json!(["skip-execution"]));
    }

    #[test]
    fn a_script_comments_out_what_failed() {
        let s = script(&source(), "#", Some("3.11.7"), None);
        assert!(s.starts_with("# replbox session s1 (python 3.11.7), 3 cell(s)\n"));
        assert!(s.contains("\n# %% [1]\nprint('hi')\n6 * 7\n"), "{s}");
        assert!(
            s.contains("\n# %% [2] error: ZeroDivisionError: division by zero\n# 1/0\n"),
            "{s}"
        );
        assert!(s.contains("\n# %% [3] timeout\n# input()\n"), "{s}");
        let js = script(&source(), "//", None, None);
        assert!(js.contains("// %% [1]\n"));
    }

    #[test]
    fn nothing_of_a_failed_cell_runs_when_the_script_runs() {
        let mut src = source();
        let evil = "x\rprint('INJECTED')\u{2028}alert(1)\u{b}y\r\nz";
        src.cells.retain(|c| c.status != EvalStatus::Ok);
        assert!(!src.cells.is_empty());
        for c in &mut src.cells {
            c.code = format!("{evil}\n");
            if let Some(e) = c.error.as_mut() {
                e.message = evil.to_string();
                e.kind = format!("Kind{evil}");
            }
        }
        for comment in ["#", "//"] {
            let s = script(&src, comment, None, None);
            for line in s.split(LINE_BREAKS) {
                assert!(
                    line.is_empty() || line.starts_with(comment),
                    "{line:?} would run:\n{s}"
                );
            }
        }
    }

    /// Answers that try to end their literal (quotes, triple quotes, newlines, `\\n`,
    /// NUL, `$(…)`, backquotes, `#{…}`, R's `\\U{…}`) reach every language's setup as one
    /// literal on its own line, with no NUL: data, never code.
    #[test]
    fn answers_reach_every_setup_as_one_literal() {
        let reg = crate::lang::Registry::load(None).expect("built-in languages");
        let nasty =
            "a'b\"c\n\"\"\"d\\ne\0f$(g)`h`#{i}#$j\\U{0}\r\u{2028}\u{85}é✓\x1b%s{answers:json}";
        let mut cell = source().cells[0].clone();
        cell.typed = nasty.into();
        let mut with_setup = 0;
        for lang in reg.all() {
            let Some(facts) = lang.spec.notebook.as_ref() else {
                continue;
            };
            let Some(setup) = facts.setup.as_ref() else {
                continue;
            };
            with_setup += 1;
            let code = setup_code(facts, std::slice::from_ref(&cell), false).expect("setup");
            assert_eq!(
                code.split('\n').count(),
                setup.text.split('\n').count(),
                "{}: the answers stay on their line:\n{code}",
                lang.id()
            );
            assert!(!code.contains('\0'), "{}: {code}", lang.id());
            // The answers' own `{answers:json}` is not expanded again.
            assert!(code.contains("{answers:json}"), "{}: {code}", lang.id());
        }
        assert_eq!(with_setup, 5, "python, javascript, ruby, shellscript, r");
    }
}
