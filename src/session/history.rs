//! What a session ran: its cells in order (code, status, error, timing) and what each one
//! showed, split the way a notebook shows it (printed text, the displayed value, the
//! traceback, figures). `session_history` lists the cells; `session_export` writes them as a
//! notebook or a script. Bounded: the newest cells are kept, and the history says how many
//! older ones were dropped.

use std::collections::VecDeque;

use schemars::JsonSchema;
use serde::Serialize;

use super::report::{ErrorInfo, EvalReport, EvalStatus, OutputSplit, RichContent};

/// One evaluation as the history keeps it.
#[derive(Debug, Clone)]
pub struct Cell {
    pub eval_id: u64,
    pub code: String,
    pub status: EvalStatus,
    pub error: Option<ErrorInfo>,
    pub duration_ms: u64,
    /// Unix time (seconds) the evaluation started.
    pub started_at: u64,
    pub outputs: Outputs,
    /// The outputs come from replaying the cell after a restore.
    pub replayed: bool,
    /// Code mode: the tool calls it made, without their results.
    pub tool_calls: Vec<crate::upstream::CallRecord>,
    /// What `session_input` typed into it, as the terminal got it (each answer, and a
    /// newline for each typed with Enter): an export carries it for the cell to read again.
    pub typed: String,
}

impl Cell {
    /// A journaled cell in the history as the journal has it, without running it again (it
    /// did not succeed, the interpreter is gone, or the session is only exported): no
    /// outputs, which the journal does not keep.
    pub fn not_replayed(c: &super::journal::CellEntry) -> Cell {
        Cell {
            eval_id: c.eval_id,
            code: c.code.clone(),
            status: c.status,
            error: c.error.clone(),
            duration_ms: c.duration_ms,
            started_at: c.started_at,
            outputs: Outputs::default(),
            replayed: false,
            tool_calls: c.tool_calls.iter().map(|t| t.without_result()).collect(),
            typed: typed(&c.inputs, &c.no_enter),
        }
    }
}

/// The answers of `session_input` as the terminal got them: each one, with a newline
/// unless it was typed without Enter (its index in `no_enter`).
pub fn typed(inputs: &[String], no_enter: &[usize]) -> String {
    let mut s = String::new();
    for (i, a) in inputs.iter().enumerate() {
        s.push_str(a);
        if !no_enter.contains(&i) {
            s.push('\n');
        }
    }
    s
}

/// What a cell showed, as a notebook shows it.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    /// Printed text (stdout and stderr: the terminal merges them).
    pub stream: String,
    /// How the value of the trailing expression was shown, when the bootstrap said which
    /// lines of the output show it.
    pub value: Option<String>,
    /// The error's traceback lines, when the bootstrap said which lines they are.
    pub traceback: Vec<String>,
    /// PNG figures, in order.
    pub images: Vec<Shown>,
    /// The parts of rich displays (images, HTML, JSON, …), in order.
    pub displays: Vec<Shown>,
    /// The whole printed output, when it was longer than the result could hold: kept
    /// apart, within the session's own bound for these (the newest kept).
    pub whole: Option<Shown>,
}

/// A figure or a display's part, kept with its cell to be read again at its URI.
#[derive(Debug, Clone)]
pub struct Shown {
    pub uri: String,
    pub mime_type: String,
    pub data: Vec<u8>,
    /// Only linked from its result (an R plot's SVG beside its PNG): a notebook export
    /// leaves it out, the figure is already there.
    pub linked: bool,
}

impl Outputs {
    /// The outputs of a finished evaluation: its output split by what the end marker said,
    /// and its images. `before` is what earlier parts of the same evaluation showed (an
    /// evaluation paused for input).
    pub fn of(report: &EvalReport, before: &str) -> Self {
        let mut text = String::with_capacity(before.len() + report.output.len());
        text.push_str(before);
        text.push_str(&report.output);
        let (stream, value, traceback) = split(&text, report.split, report.status);
        Outputs {
            stream,
            value,
            traceback,
            images: report
                .attachments
                .iter()
                .map(|a| Shown {
                    uri: a.uri.clone(),
                    mime_type: a.mime_type.clone(),
                    data: a.data.clone(),
                    linked: false,
                })
                .collect(),
            displays: report
                .rich
                .iter()
                .map(|b| Shown {
                    uri: b.uri.clone(),
                    mime_type: b.mime_type.clone(),
                    data: b.content.bytes().to_vec(),
                    linked: matches!(b.content, RichContent::Link(_)),
                })
                .collect(),
            whole: report.whole.as_ref().map(|(uri, text)| Shown {
                uri: uri.clone(),
                mime_type: "text/plain".into(),
                data: text.as_bytes().to_vec(),
                linked: false,
            }),
        }
    }

    /// What the outputs of earlier parts of the same evaluation (paused for input) showed
    /// goes first.
    pub fn after(mut self, before: Outputs) -> Self {
        self.images.splice(0..0, before.images);
        self.displays.splice(0..0, before.displays);
        self
    }

    /// The figures and display parts, to be read again.
    pub fn shown(&self) -> impl Iterator<Item = &Shown> {
        self.images.iter().chain(&self.displays)
    }

    /// The figures, display parts and whole output, for `resources/list`.
    pub fn listed(&self) -> impl Iterator<Item = &Shown> {
        self.shown().chain(&self.whole)
    }

    /// Without the whole output (counted apart from the history's bytes).
    fn bytes(&self) -> usize {
        self.stream.len()
            + self.value.as_ref().map_or(0, String::len)
            + self.traceback.iter().map(String::len).sum::<usize>()
            + self
                .shown()
                .map(|s| s.data.len() + s.uri.len())
                .sum::<usize>()
    }
}

/// Split an evaluation's output into printed text and, from its end, the displayed value
/// (status ok) or the traceback (status error), when the counts fit the output.
fn split(
    text: &str,
    split: OutputSplit,
    status: EvalStatus,
) -> (String, Option<String>, Vec<String>) {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let tail = |k: usize| (k > 0 && k <= lines.len()).then(|| lines.len() - k);
    match status {
        EvalStatus::Ok => {
            if let Some(at) = tail(split.value_lines) {
                let value: String = lines[at..].concat();
                let value = value.strip_suffix('\n').unwrap_or(&value).to_string();
                return (lines[..at].concat(), Some(value), Vec::new());
            }
        }
        EvalStatus::Error => {
            if let Some(at) = tail(split.traceback_lines) {
                let tb = lines[at..]
                    .iter()
                    .map(|l| l.strip_suffix('\n').unwrap_or(l).to_string())
                    .collect();
                return (lines[..at].concat(), None, tb);
            }
        }
        _ => {}
    }
    (text.to_string(), None, Vec::new())
}

impl Cell {
    fn whole_bytes(&self) -> usize {
        self.outputs.whole.as_ref().map_or(0, |w| w.data.len())
    }

    fn bytes(&self) -> usize {
        self.code.len()
            + self.outputs.bytes()
            + self.tool_calls.iter().map(|c| c.bytes()).sum::<usize>()
            + 128
    }
}

/// The cells of one session, newest kept within a count and a size.
#[derive(Debug)]
pub struct History {
    cells: VecDeque<Cell>,
    /// Bytes of whole outputs the cells hold, within `max_whole` (the newest kept).
    whole_bytes: usize,
    max_whole: usize,
    /// Older cells dropped to stay within the bounds.
    dropped: u64,
    bytes: usize,
    max_cells: usize,
    max_bytes: usize,
}

impl History {
    pub fn new(max_cells: usize, max_bytes: usize) -> Self {
        Self {
            cells: VecDeque::new(),
            dropped: 0,
            bytes: 0,
            max_cells: max_cells.max(1),
            max_bytes,
            whole_bytes: 0,
            max_whole: 0,
        }
    }

    /// Add a cell; the oldest go while the count or the size is over its bound (the newest
    /// cell always stays).
    pub fn push(&mut self, mut cell: Cell) {
        if cell.outputs.whole.as_ref().map_or(0, |w| w.data.len()) > self.max_whole {
            cell.outputs.whole = None;
        }
        self.bytes += cell.bytes();
        self.whole_bytes += cell.whole_bytes();
        self.cells.push_back(cell);
        while self.cells.len() > 1
            && (self.cells.len() > self.max_cells || self.bytes > self.max_bytes)
        {
            if let Some(old) = self.cells.pop_front() {
                self.bytes -= old.bytes();
                self.whole_bytes -= old.whole_bytes();
                self.dropped += 1;
            }
        }
        // Whole outputs go oldest first, their cells stay.
        for c in self.cells.iter_mut() {
            if self.whole_bytes <= self.max_whole {
                break;
            }
            self.whole_bytes -= c.whole_bytes();
            c.outputs.whole = None;
        }
    }

    /// The bound of whole outputs, in bytes (0 keeps none).
    pub fn with_whole(mut self, max_whole: usize) -> Self {
        self.max_whole = max_whole;
        self
    }

    pub fn cells(&self) -> impl Iterator<Item = &Cell> {
        self.cells.iter()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.cells.len()
    }

    /// What the bounds cost, for the notes of a listing or an export.
    pub fn dropped_note(&self) -> Option<String> {
        (self.dropped > 0).then(|| {
            format!(
                "{} earlier cell(s) are not in the history: it keeps the newest {} cells within \
{} MiB (--history-cells, --history-mb)",
                self.dropped,
                self.max_cells,
                self.max_bytes / (1024 * 1024)
            )
        })
    }
}

/// A session's history and the evaluation it has in flight.
#[derive(Debug)]
pub(super) struct Record {
    pub history: History,
    pub pending: Option<Pending>,
}

impl Record {
    /// An empty record within (cells, bytes, bytes of whole outputs).
    pub fn new((max_cells, max_bytes, max_whole): (usize, usize, usize)) -> Self {
        Self {
            history: History::new(max_cells, max_bytes).with_whole(max_whole),
            pending: None,
        }
    }
}

/// An evaluation not finished yet: paused waiting for input, or running.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub eval_id: u64,
    pub code: String,
    pub started_at: u64,
    pub started: std::time::Instant,
    pub timeout_ms: u64,
    /// What its earlier parts showed.
    pub output: String,
    /// The figures and displays of its earlier parts.
    pub shown: Outputs,
    /// The answers typed with `session_input`, in order (replayed after a restore).
    pub inputs: Vec<String>,
    /// Which of `inputs` were typed as given, without Enter (`enter: false`).
    pub no_enter: Vec<usize>,
}

/// One cell as `session_history` lists it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CellInfo {
    pub eval_id: u64,
    pub code: String,
    pub status: EvalStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    pub duration_ms: u64,
    /// Unix time (seconds) the evaluation started.
    pub started_at: u64,
    /// The cell ran again when the session was restored.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// Code mode: the tool calls it made (server, tool, arguments, status, the result's
    /// SHA-256 and size).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::upstream::CallSummary>,
}

impl From<&Cell> for CellInfo {
    fn from(c: &Cell) -> Self {
        CellInfo {
            eval_id: c.eval_id,
            code: c.code.clone(),
            status: c.status,
            error: c.error.clone(),
            duration_ms: c.duration_ms,
            started_at: c.started_at,
            replayed: c.replayed,
            tool_calls: c.tool_calls.iter().map(|t| t.summary()).collect(),
        }
    }
}

/// What `session_history` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HistoryReport {
    pub session_id: String,
    pub language: String,
    /// `open`, `ended` (its record is kept for a while) or `suspended` (restorable).
    pub state: String,
    pub cells: Vec<CellInfo>,
    /// Older cells no longer kept.
    pub dropped: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(n: u64, code: &str) -> Cell {
        Cell {
            eval_id: n,
            code: code.into(),
            status: EvalStatus::Ok,
            error: None,
            duration_ms: 1,
            started_at: 0,
            outputs: Outputs::default(),
            replayed: false,
            tool_calls: Vec::new(),
            typed: String::new(),
        }
    }

    #[test]
    fn splits_the_value_and_the_traceback_from_printed_text() {
        let ok = OutputSplit {
            value_lines: 2,
            traceback_lines: 0,
        };
        let (s, v, tb) = split("hi\n[1,\n 2]\n", ok, EvalStatus::Ok);
        assert_eq!(
            (s.as_str(), v.as_deref(), tb.len()),
            ("hi\n", Some("[1,\n 2]"), 0)
        );
        let err = OutputSplit {
            value_lines: 0,
            traceback_lines: 2,
        };
        let (s, v, tb) = split("x\nTraceback:\nE: m\n", err, EvalStatus::Error);
        assert_eq!(s, "x\n");
        assert_eq!(v, None);
        assert_eq!(tb, vec!["Traceback:", "E: m"]);
        // Counts that do not fit leave everything printed text.
        let (s, v, _) = split("a\n", ok, EvalStatus::Ok);
        assert_eq!((s.as_str(), v), ("a\n", None));
        let (s, v, _) = split("a\nb\n", ok, EvalStatus::Error);
        assert_eq!((s.as_str(), v), ("a\nb\n", None));
    }

    /// Whole outputs have their own bound: the oldest go, their cells stay; one larger
    /// than the bound is not kept.
    #[test]
    fn whole_outputs_keep_the_newest_within_their_bound() {
        let whole = |n: u64, len: usize| {
            let mut c = cell(n, "x");
            c.outputs.whole = Some(Shown {
                uri: format!("u{n}"),
                mime_type: "text/plain".into(),
                data: vec![b'a'; len],
                linked: false,
            });
            c
        };
        let mut h = History::new(100, 1000).with_whole(250);
        for n in 1..=3 {
            h.push(whole(n, 100));
        }
        h.push(whole(4, 300));
        let kept: Vec<(u64, bool)> = h
            .cells()
            .map(|c| (c.eval_id, c.outputs.whole.is_some()))
            .collect();
        assert_eq!(kept, [(1, false), (2, true), (3, true), (4, false)]);
        assert_eq!(
            h.dropped(),
            0,
            "whole outputs do not count in the history's bytes"
        );
        assert_eq!(h.whole_bytes, 200);
    }

    #[test]
    fn keeps_the_newest_cells_within_count_and_size() {
        let mut h = History::new(3, 1 << 20);
        for n in 1..=5 {
            h.push(cell(n, "x"));
        }
        let ids: Vec<u64> = h.cells().map(|c| c.eval_id).collect();
        assert_eq!(ids, vec![3, 4, 5]);
        assert_eq!(h.dropped(), 2);
        assert!(h.dropped_note().unwrap().contains("2 earlier"));
        let mut h = History::new(100, 1000);
        h.push(cell(1, &"a".repeat(600)));
        h.push(cell(2, &"b".repeat(600)));
        assert_eq!(h.cells().map(|c| c.eval_id).collect::<Vec<_>>(), vec![2]);
        // The newest stays even when it alone is over the size.
        h.push(cell(3, &"c".repeat(5000)));
        assert_eq!(h.len(), 1);
    }
}
