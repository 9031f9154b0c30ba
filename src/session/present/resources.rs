//! A session's files as MCP resources: listed and read as the session's uid, beneath its
//! directory, through no link; an ended session's while they are kept (read-only). And the
//! figures and displays its cells returned, kept with its history (in the server's memory,
//! within the history's bounds) and found by their whole URI, never by a path.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::SystemTime;

use crate::hostfs;
use crate::identity::Caller;
use crate::session::files;
use crate::session::history::Record;
use crate::session::history::Shown;
use crate::session::live::lock;
use crate::session::manager::SessionManager;
use crate::session::table::Entry;

impl SessionManager {
    /// The files of the caller's sessions (session id, path, size), for `resources/list`;
    /// each session's walk is bounded like change tracking's.
    pub async fn list_files(&self, caller: &Caller) -> Vec<(String, String, u64)> {
        // Open sessions, and ended ones whose files are kept, read-only.
        let mut mine: Vec<(SystemTime, String, Arc<OwnedFd>, Option<u32>)> =
            self.table.read(|st| {
                st.entries()
                    .filter(|(_, e)| e.owner() == caller)
                    .filter_map(|(id, e)| match e {
                        Entry::Open(s) => Some((s.created_at, id.clone(), s.cwd_fd.clone(), s.uid)),
                        _ => e
                            .kept()
                            .filter(|k| k.has_files())
                            .map(|k| (k.created_at, id.clone(), k.cwd_fd.clone(), k.uid)),
                    })
                    .collect()
            });
        mine.sort_by_key(|m| m.0);
        let max = self.config.max_tracked_files.max(1);
        let mut out = Vec::new();
        // Each session's directory as its own uid.
        for (_, id, cwd, uid) in mine {
            let skip = self.skip_dirs();
            let snap = hostfs::as_uid(uid, move || files::snapshot(cwd.as_fd(), max, &skip))
                .await
                .unwrap_or_default();
            for (path, stamp) in snap.files {
                out.push((id.clone(), path, stamp.size));
            }
        }
        out
    }

    /// Read a file of one of the caller's sessions, by path relative to its directory,
    /// following no symbolic link, within the resource size cap.
    pub async fn read_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
    ) -> Result<FileData, FileError> {
        let parts: Vec<String> = crate::workspace::check_relative(path)
            .map_err(|e| FileError::Invalid(e.to_string()))?
            .into_iter()
            .map(str::to_string)
            .collect();
        // In a cluster, a session no live node holds is adopted here first and restored:
        // its files are on the node that died, its replay writes them again.
        if self.cluster.get().is_some() {
            let gone = |e: crate::error::ToolError| FileError::NotFound(e.message);
            self.cluster_gate(caller, id).await.map_err(gone)?;
            if self.journals.restores_on_eval(&self.table, caller, id) {
                self.restore(caller, id).await.map_err(gone)?;
            }
        }
        // An open session, or an ended one whose files are kept (read-only: nothing of it
        // runs any more, and its uid is still its own).
        let (cwd, uid) = match self.lookup(caller, id) {
            Ok(s) => (s.cwd_fd.clone(), s.uid),
            Err(e) => match self.table.kept_files(caller, id) {
                Some(files) => files,
                None => return Err(FileError::NotFound(e.message)),
            },
        };
        let walk = hostfs::Walk {
            same_mount: true,
            forbidden: self.skip_dirs(),
            into_workspaces: false,
        };
        let cap = self.config.max_resource_bytes;
        let shown = path.to_string();
        let sid = id.to_string();
        // As the session's uid, beneath its directory, on its filesystem, through no link.
        hostfs::as_uid(uid, move || {
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            let file = hostfs::open_beneath(cwd.as_fd(), &refs, &walk).map_err(|e| {
                match e.raw_os_error() {
                    Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV) => {
                        FileError::Invalid(format!(
                            "{shown:?} in session {sid} goes through a symbolic link or into \
another filesystem; links and mount points are not followed"
                        ))
                    }
                    Some(libc::ENOENT) => FileError::NotFound(format!(
                        "session {sid} has no file {shown:?}; resources/list shows its files"
                    )),
                    _ => FileError::Invalid(format!("{shown:?} in session {sid}: {e}")),
                }
            })?;
            match crate::workspace::read_capped(file, cap) {
                Ok(Ok(bytes)) => Ok(FileData {
                    bytes,
                    mime: files::mime_for(&shown),
                }),
                Ok(Err(size)) => Err(FileError::TooLarge(format!(
                    "{shown:?} is {} and resources/read returns at most {} \
(--max-resource-bytes); read the part you need in the session (head, a slice, a summary)",
                    files::human_size(size),
                    files::human_size(cap)
                ))),
                Err(e) => Err(FileError::Invalid(format!("{shown:?}: {e}"))),
            }
        })
        .await
        .unwrap_or_else(|e| Err(FileError::Invalid(format!("reading failed: {e}"))))
    }
}

impl SessionManager {
    /// The history of the caller's session `id`: open, or ended while what it leaves is kept.
    fn record_of(&self, caller: &Caller, id: &str) -> Option<Arc<std::sync::Mutex<Record>>> {
        self.table.read(|st| {
            let e = st.get(id).filter(|e| e.owner() == caller)?;
            match e {
                Entry::Open(s) => Some(s.record.clone()),
                _ => e.kept().map(|k| k.record.clone()),
            }
        })
    }

    /// The figures and displays the caller's sessions returned that their histories still
    /// hold: (URI, MIME type, bytes), for `resources/list`.
    pub fn list_shown(&self, caller: &Caller) -> Vec<(String, String, u64)> {
        let records: Vec<(SystemTime, Arc<std::sync::Mutex<Record>>)> = self.table.read(|st| {
            st.entries()
                .filter(|(_, e)| e.owner() == caller)
                .filter_map(|(_, e)| match e {
                    Entry::Open(s) => Some((s.created_at, s.record.clone())),
                    _ => e.kept().map(|k| (k.created_at, k.record.clone())),
                })
                .collect()
        });
        let mut records = records;
        records.sort_by_key(|r| r.0);
        let mut out = Vec::new();
        for (_, record) in records {
            let r = lock(&record);
            for c in r.history.cells() {
                for s in c.outputs.listed() {
                    out.push((s.uri.clone(), s.mime_type.clone(), s.data.len() as u64));
                }
            }
        }
        out
    }

    /// A figure or display part of one of the caller's sessions, by its whole URI.
    pub fn read_shown(&self, caller: &Caller, id: &str, uri: &str) -> Result<Shown, FileError> {
        let Some(record) = self.record_of(caller, id) else {
            let message = match self.lookup(caller, id) {
                Err(e) => e.message,
                Ok(_) => format!("session {id} has no history"),
            };
            return Err(FileError::NotFound(message));
        };
        let r = lock(&record);
        r.history
            .cells()
            .flat_map(|c| c.outputs.shown())
            .find(|s| s.uri == uri)
            .cloned()
            .ok_or_else(|| {
                FileError::NotFound(format!(
                    "session {id} holds no {uri}: figures and displays are kept with the \
session's history, the newest cells within --history-cells and --history-mb"
                ))
            })
    }
}

impl SessionManager {
    /// An evaluation's whole output (of one of the caller's sessions), by its URI without
    /// the page (`base`): all of it within the resource size cap, or one page of
    /// [`OUTPUT_PAGE`](files::OUTPUT_PAGE) bytes (cut at character boundaries).
    pub fn read_output(
        &self,
        caller: &Caller,
        id: &str,
        base: &str,
        page: Option<u64>,
    ) -> Result<String, FileError> {
        let Some(record) = self.record_of(caller, id) else {
            let message = match self.lookup(caller, id) {
                Err(e) => e.message,
                Ok(_) => format!("session {id} has no history"),
            };
            return Err(FileError::NotFound(message));
        };
        let r = lock(&record);
        let whole = r
            .history
            .cells()
            .filter_map(|c| c.outputs.whole.as_ref())
            .find(|w| w.uri == base)
            .ok_or_else(|| {
                FileError::NotFound(format!(
                    "session {id} holds no {base}: whole outputs are kept for the newest \
cells, within --whole-output-mb"
                ))
            })?;
        // Kept as text, so valid UTF-8; lossy only as a backstop.
        let text = String::from_utf8_lossy(&whole.data);
        let size = text.len();
        let pages = size.div_ceil(files::OUTPUT_PAGE).max(1);
        let Some(page) = page else {
            if size as u64 > self.config.max_resource_bytes {
                return Err(FileError::TooLarge(format!(
                    "{base} is {} and resources/read returns at most {} \
(--max-resource-bytes): read it by pages, {base}?page=1 to ?page={pages}",
                    files::human_size(size as u64),
                    files::human_size(self.config.max_resource_bytes)
                )));
            }
            return Ok(text.into_owned());
        };
        let n = usize::try_from(page).unwrap_or(usize::MAX);
        if n > pages {
            return Err(FileError::NotFound(format!(
                "{base} has {pages} page(s) of {}; there is no page {page}",
                files::human_size(files::OUTPUT_PAGE as u64)
            )));
        }
        // Boundaries moved back to a character's start, so pages join into the whole.
        let at = |i: usize| {
            let mut i = i.min(size);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            i
        };
        let (from, to) = (
            at((n - 1) * files::OUTPUT_PAGE),
            at(n.saturating_mul(files::OUTPUT_PAGE)),
        );
        Ok(text[from..to].to_string())
    }
}

/// A session file read for `resources/read`.
pub struct FileData {
    pub bytes: Vec<u8>,
    /// What its name suggests.
    pub mime: Option<&'static str>,
}

/// Why a session file cannot be read.
#[derive(Debug)]
pub enum FileError {
    /// No such session (of this caller) or file.
    NotFound(String),
    /// A path that is refused (outside the directory, through a link, not a file).
    Invalid(String),
    TooLarge(String),
}
