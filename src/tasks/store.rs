//! Tasks on disk (`--state-dir`): one file per task, `<state dir>/tasks/<task id>.task`,
//! written when the task is created and again when it ends (to a temporary name, synced,
//! then renamed over the old one, so a file is always whole), deleted when the task is
//! forgotten. Read back at start as hostile data: bounded, unknown fields refused, the id
//! must be the file's name; a file that does not read is reported, set aside and skipped.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rmcp::model::{JsonObject, Task, TaskPayload};
use serde::{Deserialize, Serialize};

/// The format of the files written here.
const VERSION: u32 = 1;

/// The largest task file read back (a result is bounded as the tool's, far below this).
pub const MAX_FILE: u64 = 64 << 20;

/// How a task ended, as its file keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    Completed { result: JsonObject },
    Failed { error: JsonObject },
    Cancelled,
}

impl Outcome {
    pub fn of(p: &TaskPayload) -> Option<Self> {
        match p {
            TaskPayload::Completed { result } => Some(Self::Completed {
                result: result.clone(),
            }),
            TaskPayload::Failed { error } => Some(Self::Failed {
                error: error.clone(),
            }),
            TaskPayload::Cancelled => Some(Self::Cancelled),
            _ => None,
        }
    }

    pub fn payload(self) -> TaskPayload {
        match self {
            Self::Completed { result } => TaskPayload::Completed { result },
            Self::Failed { error } => TaskPayload::Failed { error },
            Self::Cancelled => TaskPayload::Cancelled,
        }
    }
}

/// One task's file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stored {
    pub version: u32,
    pub task: Task,
    /// The principal it belongs to.
    pub owner: String,
    /// The tool it runs.
    pub tool: String,
    /// Unix milliseconds.
    pub created_ms: u64,
    #[serde(default)]
    pub ended_ms: Option<u64>,
    /// The caller's idempotency key and the fingerprint of its call.
    #[serde(default)]
    pub key: Option<(String, String)>,
    /// How it ended; none while it runs.
    #[serde(default)]
    pub outcome: Option<Outcome>,
}

impl Stored {
    pub fn new_version() -> u32 {
        VERSION
    }
}

/// The directory of task files.
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// `<state dir>/tasks`, created (0700) if needed. The state directory has been checked
    /// (the server's own, 0700): nobody else can have put a link there.
    pub fn open(state_dir: &Path) -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = state_dir.join("tasks");
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let meta = std::fs::symlink_metadata(&dir)?;
        if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(io::Error::other(format!(
                "{} is not a directory of the server's own",
                dir.display()
            )));
        }
        Ok(Self { dir })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.task"))
    }

    /// Write a task's file whole (temporary name, sync, rename).
    pub fn save(&self, s: &Stored) -> io::Result<()> {
        let id = &s.task.task_id;
        let json = serde_json::to_vec(s).map_err(io::Error::other)?;
        let tmp = self.dir.join(format!(".{id}.tmp"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(&json)?;
        f.sync_data()?;
        drop(f);
        std::fs::rename(&tmp, self.path(id))?;
        File::open(&self.dir)?.sync_all()
    }

    /// Delete a task's file.
    pub fn remove(&self, id: &str) {
        let _ = std::fs::remove_file(self.path(id));
    }

    /// Every task file that reads; the others are set aside (`.corrupt`) with an error.
    pub fn load(&self) -> Vec<Stored> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') && name.ends_with(".tmp") {
                // A save the server was killed in: the old file (if any) is still whole.
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let Some(id) = name.strip_suffix(".task") else {
                continue;
            };
            if !uuid::Uuid::parse_str(id).is_ok_and(|u| u.to_string() == id) {
                continue;
            }
            match read(&e.path(), id) {
                Ok(s) => out.push(s),
                Err(why) => {
                    let aside = e.path().with_extension("task.corrupt");
                    tracing::error!(task = %id, %why, "unreadable task file skipped; moved to {}", aside.display());
                    let _ = std::fs::rename(e.path(), aside);
                }
            }
        }
        out
    }
}

/// Why a task file does not read (it is then set aside).
#[derive(Debug, thiserror::Error)]
pub enum TaskFileError {
    /// It cannot be opened or read, is not a regular file, or is over [`MAX_FILE`].
    #[error(transparent)]
    File(#[from] crate::bounded_read::ReadError),
    #[error("{0}")]
    Json(serde_json::Error),
    #[error("version {0}, this server reads {VERSION}")]
    Version(u32),
    #[error("it names task {found:?}, not {id:?}")]
    OtherTask { found: String, id: String },
    #[error("no owner")]
    NoOwner,
    #[error("an idempotency key over the bound")]
    KeyTooLong,
}

/// Read task `id`'s file: bounded, no link followed, its id the file's.
fn read(path: &Path, id: &str) -> Result<Stored, TaskFileError> {
    let (bytes, _) = crate::bounded_read::read(path, MAX_FILE)?;
    parse(&bytes, id)
}

/// Parse a task file's bytes (see [`read`]).
pub fn parse(bytes: &[u8], id: &str) -> Result<Stored, TaskFileError> {
    let s: Stored = serde_json::from_slice(bytes).map_err(TaskFileError::Json)?;
    if s.version != VERSION {
        return Err(TaskFileError::Version(s.version));
    }
    if s.task.task_id != id {
        return Err(TaskFileError::OtherTask {
            found: s.task.task_id,
            id: id.into(),
        });
    }
    if s.owner.is_empty() || s.owner.len() > 256 {
        return Err(TaskFileError::NoOwner);
    }
    if s.key.as_ref().is_some_and(|(k, _)| k.len() > 1024) {
        return Err(TaskFileError::KeyTooLong);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::TaskStatus;

    fn stored(id: &str, owner: &str) -> Vec<u8> {
        serde_json::to_vec(&Stored {
            version: VERSION,
            task: Task::new(id, TaskStatus::Working, "t", "t"),
            owner: owner.into(),
            tool: "run-code".into(),
            created_ms: 1,
            ended_ms: None,
            key: None,
            outcome: None,
        })
        .unwrap()
    }

    /// Why a file is set aside, as the log says it.
    #[test]
    fn messages_are_pinned() {
        let e = |bytes: &[u8], id: &str| parse(bytes, id).unwrap_err().to_string();
        assert!(parse(&stored("a", "alice"), "a").is_ok());
        assert_eq!(
            e(&stored("a", "alice"), "b"),
            "it names task \"a\", not \"b\""
        );
        assert_eq!(e(&stored("a", ""), "a"), "no owner");
        let old = String::from_utf8(stored("a", "alice"))
            .unwrap()
            .replace("\"version\":1", "\"version\":7");
        assert_eq!(e(old.as_bytes(), "a"), "version 7, this server reads 1");
        assert_eq!(e(b"", "a"), "EOF while parsing a value at line 1 column 0");
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            read(d.path(), "a").unwrap_err().to_string(),
            "not a regular file"
        );
        assert_eq!(
            read(&d.path().join("absent"), "a").unwrap_err().to_string(),
            "cannot open it: No such file or directory (os error 2)"
        );
    }
}
