//! The journal of a session (`--state-dir`): its start request and the code of its cells with
//! their status, so that a session outlives the server: after a restart it is listed as
//! suspended and a restore replays it.
//!
//! One file per session, `<state dir>/<session id>.journal`, append-only, mode 0600, in a
//! directory of the server's own (0700, checked at start like the uid lock directory, and
//! locked so that two servers never share it). Each line is `HASH JSON`: HASH is the first
//! 16 hex digits of the SHA-256 of JSON, so a line that was changed or cut is recognised.
//! Every append is written with one `write` and made durable (`fsync`) before the call that
//! made it returns. A journal is bounded (`--journal-max-mb`): once full, a last line says
//! so and later cells are not journaled.
//!
//! A journal is read as hostile data: a line is at most the journal's bound, unknown fields
//! are refused, the session id must be the file's, and whatever it asks for goes through
//! every check of a new session again when it is restored. A last line without its newline
//! is an append a crash cut short (the call that made it never returned): it is dropped
//! with a warning. Anything else that does not read is a corrupt journal: reported, renamed
//! to `.corrupt` and skipped.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::report::{ErrorInfo, EvalStatus};
pub use super::state_dir::StateDir;
use crate::bounded_read;
use crate::identity::Caller;

/// The format of the lines written here.
const VERSION: u32 = 1;

/// What `session_start` was asked, as the journal keeps it (to start the session again).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StartEntry {
    pub language: String,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub venv: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub idle_timeout_s: Option<u64>,
    #[serde(default)]
    pub files: Vec<FileEntry>,
    /// Domains asked for (checked again against the server's policy on restore).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_domains: Vec<String>,
    /// Code mode: the MCP servers asked for (granted again on restore).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<String>,
    /// Packages asked for at the start (installed again on restore).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub content: Option<String>,
}

/// Most packages one `packages` line names.
pub const PACKAGES_MAX: usize = 4096;

/// One evaluation as the journal keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CellEntry {
    pub eval_id: u64,
    pub code: String,
    pub status: EvalStatus,
    #[serde(default)]
    pub error: Option<ErrorInfo>,
    pub duration_ms: u64,
    pub started_at: u64,
    pub timeout_ms: u64,
    /// The answers given with `session_input`, in order.
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Which of `inputs` were typed as given, without Enter (`enter: false`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_enter: Vec<usize>,
    /// Code mode: the tool calls it made, with their results (bounded) for the replay.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::upstream::CallRecord>,
    /// The claim it was written under (cluster; see [`Entry::Claimed`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: i64,
}

fn is_zero(g: &i64) -> bool {
    *g == 0
}

/// One line of a journal.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Entry {
    Start {
        version: u32,
        session_id: String,
        /// The principal the session belongs to.
        owner: String,
        created_at: u64,
        request: StartEntry,
    },
    Cell(CellEntry),
    /// The session ended without session_close (`reaped`, `evicted`, `exited`): its journal
    /// is kept, restorable.
    End {
        how: String,
        at: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        generation: i64,
    },
    /// The session was started again from this journal.
    Restored {
        at: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        generation: i64,
    },
    /// The journal reached its bound: cells from `eval_id` on are not in it.
    Full {
        eval_id: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        generation: i64,
    },
    /// A cell began (its `cell` line follows when it ends): a started cell without one was
    /// running when the server stopped, and a restore does not run it again.
    Started {
        eval_id: u64,
        at: u64,
        /// The beginning of its code, for the restore's report.
        code: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        generation: i64,
    },
    /// A cell's install lines (`%pip install`, `replbox.install`) put these packages into
    /// the session's layer: the exact versions the installer reported (`name==version`,
    /// npm's `name@version`), installed again, from the cache, before the cell is replayed.
    /// Written before the cell's `started` line.
    Packages {
        eval_id: u64,
        installed: Vec<String>,
        #[serde(default, skip_serializing_if = "is_zero")]
        generation: i64,
    },
    /// Cluster: `node` claimed the session in the registry under `lease`; `generation` is
    /// the claim's revision, larger at every claim. The lines that follow carry the
    /// generation they were written under: one older than the last claim before it is a
    /// former owner's, written after it lost the session, and is ignored.
    Claimed {
        node: String,
        generation: i64,
        lease: i64,
        at: u64,
    },
}

impl Entry {
    /// The generation a line was written under (0: outside a cluster; a claim's line is
    /// not written under one).
    fn generation(&self) -> i64 {
        match self {
            Entry::Cell(c) => c.generation,
            Entry::End { generation, .. }
            | Entry::Restored { generation, .. }
            | Entry::Full { generation, .. }
            | Entry::Started { generation, .. }
            | Entry::Packages { generation, .. } => *generation,
            Entry::Start { .. } | Entry::Claimed { .. } => 0,
        }
    }

    /// The same line, written under `g`.
    fn under(&self, g: i64) -> Entry {
        let mut e = self.clone();
        match &mut e {
            Entry::Cell(c) => c.generation = g,
            Entry::End { generation, .. }
            | Entry::Restored { generation, .. }
            | Entry::Full { generation, .. }
            | Entry::Started { generation, .. }
            | Entry::Packages { generation, .. } => *generation = g,
            Entry::Start { .. } | Entry::Claimed { .. } => {}
        }
        e
    }
}

/// The claim a journal is written under (cluster): appends are refused once `holds` says
/// this node may have lost it.
pub struct Claim {
    pub generation: i64,
    pub holds: Box<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Claim({})", self.generation)
    }
}

/// A cell the server stopped in: it started and never ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    pub eval_id: u64,
    pub started_at: u64,
    /// The beginning of its code.
    pub code: String,
}

/// The most of a cell's code a `started` line keeps.
pub const STARTED_CODE: usize = 200;

/// The `started` line of cell `eval_id` running `code`.
pub fn started(eval_id: u64, at: u64, code: &str) -> Entry {
    let end = code
        .char_indices()
        .nth(STARTED_CODE)
        .map_or(code.len(), |(i, _)| i);
    Entry::Started {
        eval_id,
        at,
        code: code[..end].to_string(),
        generation: 0,
    }
}

fn line_of(entry: &Entry) -> io::Result<Vec<u8>> {
    let json = serde_json::to_string(entry).map_err(io::Error::other)?;
    let mut line = format!("{} {json}\n", hash(json.as_bytes())).into_bytes();
    line.shrink_to_fit();
    Ok(line)
}

fn hash(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// A journal being written. Appends are blocking (run them off the async workers).
#[derive(Debug)]
pub struct Writer {
    path: PathBuf,
    file: Mutex<Option<File>>,
    written: AtomicU64,
    max: u64,
    full: AtomicBool,
    /// Sealed: nothing more is written (set under `file`'s lock).
    sealed: AtomicBool,
    /// An append was refused because the journal was sealed or its claim lost.
    refused: AtomicBool,
    /// Cluster: the claim appends are made under, checked before each.
    claim: Mutex<Option<Claim>>,
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    Written,
    /// The journal was full already, or is now (the line saying so was written instead).
    Full,
    /// The journal was removed (the session was closed).
    Removed,
    /// The journal was sealed, or its claim lost: its session may be another node's now.
    Sealed,
}

impl Writer {
    /// Create the journal of a new session with its first line.
    pub fn create(path: &Path, start: &Entry, max: u64) -> io::Result<Self> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_APPEND | libc::O_CLOEXEC)
            .open(path)?;
        let line = line_of(start)?;
        file.write_all(&line)?;
        file.sync_all()?;
        // The new name must be durable too.
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(Some(file)),
            written: AtomicU64::new(line.len() as u64),
            max,
            full: AtomicBool::new(false),
            sealed: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            claim: Mutex::new(None),
        })
    }

    /// Go on writing an existing journal (a restored session).
    pub fn reopen(path: &Path, max: u64, full: bool) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let written = file.metadata()?.len();
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(Some(file)),
            written: AtomicU64::new(written),
            max,
            full: AtomicBool::new(full),
            sealed: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            claim: Mutex::new(None),
        })
    }

    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Append one line and make it durable. A cell that would take the journal past its
    /// bound is replaced by a `full` line (once).
    pub fn append(&self, entry: &Entry) -> io::Result<Appended> {
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let Some(file) = guard.as_mut() else {
            if self.sealed.load(Ordering::Relaxed) {
                self.refused.store(true, Ordering::Relaxed);
                return Ok(Appended::Sealed);
            }
            return Ok(Appended::Removed);
        };
        let stamped;
        let entry = match &*self.claim.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(c) if !(c.holds)() => {
                self.refused.store(true, Ordering::Relaxed);
                return Ok(Appended::Sealed);
            }
            Some(c) => {
                stamped = entry.under(c.generation);
                &stamped
            }
            None => entry,
        };
        let mut line = line_of(entry)?;
        if let Entry::Started { .. } | Entry::Packages { .. } = entry {
            // Not durable by itself (the next fsync of the file covers it): it only has to
            // outlive the server's process, whose death leaves the page cache as it was.
            if self.full.load(Ordering::Relaxed)
                || self.written.load(Ordering::Relaxed) + line.len() as u64 + 512 > self.max
            {
                return Ok(Appended::Full);
            }
            file.write_all(&line)?;
            self.written.fetch_add(line.len() as u64, Ordering::Relaxed);
            return Ok(Appended::Written);
        }
        if let Entry::Cell(c) = entry {
            if self.full.load(Ordering::Relaxed) {
                return Ok(Appended::Full);
            }
            // Room is kept for the lines that end or restore the session.
            if self.written.load(Ordering::Relaxed) + line.len() as u64 + 512 > self.max {
                self.full.store(true, Ordering::Relaxed);
                line = line_of(&Entry::Full {
                    eval_id: c.eval_id,
                    generation: c.generation,
                })?;
                file.write_all(&line)?;
                file.sync_data()?;
                self.written.fetch_add(line.len() as u64, Ordering::Relaxed);
                return Ok(Appended::Full);
            }
        }
        file.write_all(&line)?;
        file.sync_data()?;
        self.written.fetch_add(line.len() as u64, Ordering::Relaxed);
        Ok(Appended::Written)
    }

    /// From now on, write under `claim` (cluster): its line first, then every append
    /// stamped with its generation and refused once the claim may be lost.
    pub fn claim(&self, node: &str, lease: i64, claim: Claim) -> io::Result<()> {
        let line = Entry::Claimed {
            node: node.to_string(),
            generation: claim.generation,
            lease,
            at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        *self.claim.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.append(&line)?;
        *self.claim.lock().unwrap_or_else(|p| p.into_inner()) = Some(claim);
        Ok(())
    }

    /// Go on writing under `claim`, whose line the journal has already.
    pub fn resume_claim(&self, claim: Claim) {
        *self.claim.lock().unwrap_or_else(|p| p.into_inner()) = Some(claim);
    }

    /// Write nothing more, leaving the file as it is (its session may be adopted by another
    /// node now): an append in progress finishes first, later ones are refused.
    pub fn seal(&self) {
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        self.sealed.store(true, Ordering::Relaxed);
        guard.take();
    }

    /// Whether an append was refused because the journal was sealed.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// Delete the journal (the session was closed); later appends do nothing.
    pub fn remove(&self) {
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if guard.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
            if let Some(dir) = self.path.parent()
                && let Ok(d) = File::open(dir)
            {
                let _ = d.sync_all();
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A journal read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Journal {
    pub session_id: String,
    pub owner: String,
    pub created_at: u64,
    pub request: StartEntry,
    /// In order, by increasing `eval_id`.
    pub cells: Vec<CellEntry>,
    /// How it ended, when it ended without session_close; None: the server stopped.
    pub ended: Option<(String, u64)>,
    /// Cells from this one on were not journaled.
    pub full_at: Option<u64>,
    /// Cells that started and never ended (the server stopped while they ran), in order.
    pub unfinished: Vec<Unfinished>,
    /// What cells' install lines installed (see [`Entry::Packages`]), by `eval_id`.
    pub packages: BTreeMap<u64, Vec<String>>,
    /// A last line cut short by a crash was dropped.
    pub torn: bool,
    /// Cluster: the last claim, (node, generation, lease).
    pub claim: Option<(String, i64, i64)>,
    /// Lines a former owner wrote after it lost the session, ignored.
    pub stale: usize,
    /// Unix time of the last change of the file.
    pub modified: u64,
}

impl Journal {
    /// The number of its last cell, finished or not.
    pub fn last_eval(&self) -> u64 {
        let cells = self.cells.last().map_or(0, |c| c.eval_id);
        let unfinished = self.unfinished.last().map_or(0, |u| u.eval_id);
        cells.max(unfinished)
    }
}

/// What lists need of a session's journal (the journal itself is read again when it is
/// restored or exported, so memory does not grow with journals).
#[derive(Debug, Clone)]
pub(super) struct Journaled {
    pub id: String,
    pub owner: Caller,
    pub language: String,
    pub ended: Option<(String, u64)>,
    pub modified: u64,
    /// The number of its last cell.
    pub evals: u64,
    /// Cells that succeeded (what a restore replays).
    pub ok_cells: usize,
    pub path: PathBuf,
}

impl Journaled {
    pub(super) fn of(j: &Journal, path: PathBuf) -> Self {
        Self {
            id: j.session_id.clone(),
            owner: Caller {
                principal: j.owner.clone(),
            },
            language: j.request.language.clone(),
            ended: j.ended.clone(),
            modified: j.modified,
            evals: j.last_eval(),
            ok_cells: j
                .cells
                .iter()
                .filter(|c| c.status == EvalStatus::Ok)
                .count(),
            path,
        }
    }

    /// How it stopped: how it ended, or `server_stopped`.
    pub fn reason(&self) -> &str {
        self.ended
            .as_ref()
            .map_or("server_stopped", |(how, _)| how.as_str())
    }

    /// Whether the first session_eval restores it by itself (not after its code exited).
    pub(super) fn restores_by_itself(&self) -> bool {
        self.reason() != "exited"
    }

    /// When it ended, or its journal was last written.
    pub(super) fn since(&self) -> u64 {
        self.ended.as_ref().map_or(self.modified, |(_, at)| *at)
    }
}

/// Why a journal does not read: it is corrupt (or gone). Lines are counted from 1.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// It cannot be opened or read, is not a regular file, or is over its bound.
    #[error(transparent)]
    File(#[from] bounded_read::ReadError),
    #[error("line {0}: not UTF-8")]
    NotUtf8(usize),
    #[error("line {0}: no checksum")]
    NoChecksum(usize),
    #[error("line {0}: checksum mismatch")]
    Checksum(usize),
    #[error("line {line}: {error}")]
    Entry {
        line: usize,
        error: serde_json::Error,
    },
    #[error("truncated before its first line ended")]
    TornStart,
    #[error("it does not begin with the session's start")]
    NoStart,
    #[error("version {0}, this server reads {VERSION}")]
    Version(u32),
    #[error("it names session {found:?}, not {id:?}")]
    OtherSession { found: String, id: String },
    #[error("a second start line")]
    SecondStart,
    #[error("a cell after the journal was full")]
    CellAfterFull,
    #[error("cell {0} out of order")]
    CellOrder(u64),
    #[error("cell {0} started out of order")]
    StartedOrder(u64),
    #[error("cell {0}: a started line too long")]
    StartedTooLong(u64),
    #[error("cell {0}: packages out of order")]
    PackagesOrder(u64),
    #[error("cell {0}: a packages line too long")]
    PackagesTooLong(u64),
}

/// Read the journal of session `id` at `path`; `Err` says why it is corrupt.
pub fn read(path: &Path, id: &str, max: u64) -> Result<Journal, JournalError> {
    // A journal is at most its bound plus the lines that end it; allow some slack for a
    // bound that was larger when it was written.
    let limit = max.saturating_mul(2).saturating_add(1 << 20);
    let (bytes, meta) = bounded_read::read(path, limit)?;
    let modified = meta.mtime().max(0) as u64;
    parse(&bytes, id, modified)
}

/// Parse a journal's bytes (see [`read`]).
pub fn parse(bytes: &[u8], id: &str, modified: u64) -> Result<Journal, JournalError> {
    let (entries, torn) = entries(bytes)?;
    let mut it = entries.into_iter();
    let mut j = started_by(it.next(), torn, id, modified)?;
    let mut current = 0;
    for e in it {
        j.apply(e, &mut current)?;
    }
    Ok(j)
}

/// The journal's lines, each checked against its checksum and decoded; and whether a last
/// line cut short (by a crash) was dropped.
fn entries(bytes: &[u8]) -> Result<(Vec<Entry>, bool), JournalError> {
    let mut lines: Vec<&[u8]> = bytes.split_inclusive(|b| *b == b'\n').collect();
    let mut torn = false;
    if lines.last().is_some_and(|l| !l.ends_with(b"\n")) {
        lines.pop();
        torn = true;
    }
    let mut entries = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let (line, n) = (&line[..line.len() - 1], i + 1);
        let text = std::str::from_utf8(line).map_err(|_| JournalError::NotUtf8(n))?;
        let (h, json) = text.split_once(' ').ok_or(JournalError::NoChecksum(n))?;
        if h != hash(json.as_bytes()) {
            return Err(JournalError::Checksum(n));
        }
        let entry: Entry =
            serde_json::from_str(json).map_err(|error| JournalError::Entry { line: n, error })?;
        entries.push(entry);
    }
    Ok((entries, torn))
}

/// The journal its first line starts: session `id`'s, at this server's version.
fn started_by(
    first: Option<Entry>,
    torn: bool,
    id: &str,
    modified: u64,
) -> Result<Journal, JournalError> {
    let Some(Entry::Start {
        version,
        session_id,
        owner,
        created_at,
        request,
    }) = first
    else {
        return Err(if torn {
            JournalError::TornStart
        } else {
            JournalError::NoStart
        });
    };
    if version != VERSION {
        return Err(JournalError::Version(version));
    }
    if session_id != id {
        return Err(JournalError::OtherSession {
            found: session_id,
            id: id.into(),
        });
    }
    Ok(Journal {
        session_id,
        owner,
        created_at,
        request,
        cells: Vec::new(),
        ended: None,
        full_at: None,
        unfinished: Vec::new(),
        packages: BTreeMap::new(),
        torn,
        modified,
        claim: None,
        stale: 0,
    })
}

impl Journal {
    /// Apply a line after the start; `current` is the generation of the last claim, which
    /// a claim's line updates.
    fn apply(&mut self, e: Entry, current: &mut i64) -> Result<(), JournalError> {
        // A claim's line is checked below, against the claims before it.
        if !matches!(e, Entry::Claimed { .. }) && e.generation() < *current {
            self.stale += 1;
            return Ok(());
        }
        match e {
            Entry::Start { .. } => return Err(JournalError::SecondStart),
            Entry::Cell(c) => {
                if self.full_at.is_some() {
                    return Err(JournalError::CellAfterFull);
                }
                if self.cells.last().is_some_and(|l| l.eval_id >= c.eval_id) || c.eval_id == 0 {
                    return Err(JournalError::CellOrder(c.eval_id));
                }
                self.unfinished.retain(|u| u.eval_id != c.eval_id);
                self.cells.push(c);
            }
            Entry::Started {
                eval_id, at, code, ..
            } => {
                let last = self.cells.last().map_or(0, |c| c.eval_id);
                if eval_id <= last || self.unfinished.last().is_some_and(|u| u.eval_id >= eval_id) {
                    return Err(JournalError::StartedOrder(eval_id));
                }
                if code.len() > STARTED_CODE * 4 {
                    return Err(JournalError::StartedTooLong(eval_id));
                }
                self.unfinished.push(Unfinished {
                    eval_id,
                    started_at: at,
                    code,
                });
            }
            Entry::Packages {
                eval_id, installed, ..
            } => {
                if eval_id <= self.cells.last().map_or(0, |c| c.eval_id) {
                    return Err(JournalError::PackagesOrder(eval_id));
                }
                if installed.len() > PACKAGES_MAX || installed.iter().any(|p| p.len() > 300) {
                    return Err(JournalError::PackagesTooLong(eval_id));
                }
                self.packages.insert(eval_id, installed);
            }
            Entry::End { how, at, .. } => self.ended = Some((how, at)),
            Entry::Restored { .. } => self.ended = None,
            Entry::Full { eval_id, .. } => self.full_at = Some(eval_id),
            Entry::Claimed {
                node,
                generation,
                lease,
                ..
            } => {
                if generation < *current {
                    self.stale += 1;
                    return Ok(());
                }
                *current = generation;
                self.claim = Some((node, generation, lease));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const ID: &str = "3f2b8c4e-1d2a-4b6c-8e9f-0a1b2c3d4e5f";

    fn start() -> Entry {
        Entry::Start {
            version: VERSION,
            session_id: ID.into(),
            owner: "local".into(),
            created_at: 1,
            request: StartEntry {
                language: "python".into(),
                cwd: None,
                venv: None,
                env: BTreeMap::new(),
                idle_timeout_s: None,
                files: Vec::new(),
                allow_domains: Vec::new(),
                mcp_servers: Vec::new(),
                packages: Vec::new(),
            },
        }
    }

    fn cell(n: u64, code: &str) -> Entry {
        Entry::Cell(CellEntry {
            eval_id: n,
            code: code.into(),
            status: EvalStatus::Ok,
            error: None,
            duration_ms: 1,
            started_at: 2,
            timeout_ms: 30_000,
            inputs: vec![],
            no_enter: vec![],
            tool_calls: vec![],
            generation: 0,
        })
    }

    #[test]
    fn writes_read_back_and_bounds() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(format!("{ID}.journal"));
        let w = Writer::create(&path, &start(), 1200).unwrap();
        assert_eq!(w.append(&cell(1, "x = 41")).unwrap(), Appended::Written);
        assert_eq!(
            w.append(&cell(2, &"y".repeat(1000))).unwrap(),
            Appended::Full
        );
        assert_eq!(w.append(&cell(3, "z")).unwrap(), Appended::Full);
        w.append(&Entry::End {
            how: "reaped".into(),
            at: 5,
            generation: 0,
        })
        .unwrap();
        let j = read(&path, ID, 1200).unwrap();
        assert_eq!(j.cells.len(), 1);
        assert_eq!(j.cells[0].code, "x = 41");
        assert_eq!(j.full_at, Some(2));
        assert_eq!(j.ended, Some(("reaped".into(), 5)));
        assert!(!j.torn);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        w.remove();
        assert!(!path.exists());
        assert_eq!(w.append(&cell(4, "a")).unwrap(), Appended::Removed);
    }

    #[test]
    fn a_former_owners_lines_after_a_newer_claim_are_ignored() {
        use std::sync::Arc;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(format!("{ID}.journal"));
        let claim = |generation, holds: Arc<AtomicBool>| Claim {
            generation,
            holds: Box::new(move || holds.load(Ordering::SeqCst)),
        };
        let a_holds = Arc::new(AtomicBool::new(true));
        let a = Writer::create(&path, &start(), 1 << 20).unwrap();
        a.claim("a", 7, claim(10, a_holds.clone())).unwrap();
        assert_eq!(a.append(&cell(1, "x = 1")).unwrap(), Appended::Written);
        // Node b adopts it: a newer claim, then its own cell 2.
        let b = Writer::reopen(&path, 1 << 20, false).unwrap();
        b.claim("b", 8, claim(20, Arc::new(AtomicBool::new(true))))
            .unwrap();
        b.append(&cell(2, "x = 2")).unwrap();
        // a, frozen after it checked its claim, appends its cell 2 anyway: ignored on
        // reading (it would otherwise make the journal unreadable: cell 2 twice).
        assert_eq!(a.append(&cell(2, "stale")).unwrap(), Appended::Written);
        b.append(&cell(3, "x = 3")).unwrap();
        let j = read(&path, ID, 1 << 20).unwrap();
        let codes: Vec<&str> = j.cells.iter().map(|c| c.code.as_str()).collect();
        assert_eq!(codes, ["x = 1", "x = 2", "x = 3"]);
        assert_eq!(j.stale, 1);
        assert_eq!(j.claim, Some(("b".into(), 20, 8)));
        // Once a knows its claim may be lost, it writes nothing more.
        a_holds.store(false, Ordering::SeqCst);
        assert_eq!(a.append(&cell(4, "later")).unwrap(), Appended::Sealed);
        assert!(a.refused());
        assert_eq!(read(&path, ID, 1 << 20).unwrap().cells.len(), 3);
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_damage_is_refused() {
        let mut bytes = line_of(&start()).unwrap();
        bytes.extend(line_of(&cell(1, "x = 41")).unwrap());
        let good = parse(&bytes, ID, 0).unwrap();
        let mut torn = bytes.clone();
        torn.extend(&line_of(&cell(2, "x += 1")).unwrap()[..20]);
        let j = parse(&torn, ID, 0).unwrap();
        assert!(j.torn);
        assert_eq!(j.cells, good.cells);
        // A changed byte, a reordered cell, another session's id, garbage: corrupt.
        let changed = String::from_utf8(bytes.clone())
            .unwrap()
            .replace("x = 41", "x = 42");
        let e = |bytes: &[u8], id: &str| parse(bytes, id, 0).unwrap_err().to_string();
        assert_eq!(e(changed.as_bytes(), ID), "line 2: checksum mismatch");
        let mut twice = bytes.clone();
        twice.extend(line_of(&cell(1, "again")).unwrap());
        assert_eq!(e(&twice, ID), "cell 1 out of order");
        assert_eq!(
            e(&bytes, "other"),
            format!("it names session \"{ID}\", not \"other\"")
        );
        assert_eq!(e(b"\x00\xffgarbage\n", ID), "line 1: not UTF-8");
        assert_eq!(e(b"", ID), "it does not begin with the session's start");
        assert_eq!(e(b"{}", ID), "truncated before its first line ended");
        assert_eq!(e(b"abc\n", ID), "line 1: no checksum");
        // A field the server never writes is refused, checksum or not.
        let json = r#"{"type":"cell","eval_id":2,"code":"1","status":"ok","duration_ms":1,"started_at":1,"timeout_ms":1,"shell":"rm -rf /"}"#;
        let mut extra = bytes.clone();
        extra.extend(format!("{} {json}\n", hash(json.as_bytes())).as_bytes());
        assert!(e(&extra, ID).starts_with("line 3: "));
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            read(d.path(), ID, 1 << 20).unwrap_err().to_string(),
            "not a regular file"
        );
        let e = read(&d.path().join("absent"), ID, 1 << 20).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot open it: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_cells_packages_are_read_back_by_its_eval_id() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(format!("{ID}.journal"));
        let w = Writer::create(&path, &start(), 1 << 20).unwrap();
        let pk = |n: u64, p: &[&str]| Entry::Packages {
            eval_id: n,
            installed: p.iter().map(|s| s.to_string()).collect(),
            generation: 0,
        };
        w.append(&pk(1, &["six==1.17.0"])).unwrap();
        w.append(&started(1, 5, "%pip install six")).unwrap();
        w.append(&cell(1, "%pip install six")).unwrap();
        let j = read(&path, ID, 1 << 20).unwrap();
        assert_eq!(j.packages.get(&1), Some(&vec!["six==1.17.0".to_string()]));
        // For a cell already ended, or past its bound, the journal is corrupt.
        let mut bytes = line_of(&start()).unwrap();
        bytes.extend(line_of(&cell(2, "a")).unwrap());
        bytes.extend(line_of(&pk(2, &["six==1"])).unwrap());
        let e = |bytes: &[u8]| parse(bytes, ID, 0).unwrap_err().to_string();
        assert_eq!(e(&bytes), "cell 2: packages out of order");
        let mut bytes = line_of(&start()).unwrap();
        let many: Vec<&str> = vec!["x==1"; PACKAGES_MAX + 1];
        bytes.extend(line_of(&pk(1, &many)).unwrap());
        assert_eq!(e(&bytes), "cell 1: a packages line too long");
    }

    #[test]
    fn a_cell_started_and_never_ended_is_unfinished() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(format!("{ID}.journal"));
        let w = Writer::create(&path, &start(), 1 << 20).unwrap();
        w.append(&started(1, 5, "x = 41")).unwrap();
        w.append(&cell(1, "x = 41")).unwrap();
        let long = "é".repeat(STARTED_CODE + 50);
        w.append(&started(2, 6, &long)).unwrap();
        let j = read(&path, ID, 1 << 20).unwrap();
        assert_eq!(j.cells.len(), 1);
        assert_eq!(
            j.unfinished,
            vec![Unfinished {
                eval_id: 2,
                started_at: 6,
                code: "é".repeat(STARTED_CODE),
            }]
        );
        assert_eq!(j.last_eval(), 2);
        // Restored, the next cell is 3; cell 2 stays unfinished.
        w.append(&Entry::Restored {
            at: 7,
            generation: 0,
        })
        .unwrap();
        w.append(&started(3, 8, "y")).unwrap();
        w.append(&cell(3, "y")).unwrap();
        let j = read(&path, ID, 1 << 20).unwrap();
        assert_eq!(j.unfinished.len(), 1);
        assert_eq!(j.unfinished[0].eval_id, 2);
        assert_eq!(j.last_eval(), 3);
        // Out of order, or a started line past its bound, is corrupt.
        let mut bytes = line_of(&start()).unwrap();
        bytes.extend(line_of(&cell(2, "a")).unwrap());
        bytes.extend(line_of(&started(2, 1, "a")).unwrap());
        let e = |bytes: &[u8]| parse(bytes, ID, 0).unwrap_err().to_string();
        assert_eq!(e(&bytes), "cell 2 started out of order");
        let mut bytes = line_of(&start()).unwrap();
        let huge = Entry::Started {
            eval_id: 1,
            at: 1,
            code: "z".repeat(STARTED_CODE * 5),
            generation: 0,
        };
        bytes.extend(line_of(&huge).unwrap());
        assert_eq!(e(&bytes), "cell 1: a started line too long");
    }
}
