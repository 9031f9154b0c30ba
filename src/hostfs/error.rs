//! Why a caller's host path is refused, or file work as a session's uid could not run.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// An error of the host path layer. `what` names the path as the caller gave it (`cwd`,
/// `venv`, `path`), `path` is the path as given.
#[derive(Debug, thiserror::Error)]
pub enum HostfsError {
    #[error(
        "{what} {path}: {sys} is never a session's directory (kernel and system runtime \
         files); choose a directory of your data"
    )]
    System {
        what: String,
        path: PathBuf,
        sys: &'static str,
    },
    #[error(
        "{what} {path} contains {sys} (kernel and system runtime files), which is never part \
         of a session's directory; choose a directory of your data"
    )]
    ContainsSystem {
        what: String,
        path: PathBuf,
        sys: &'static str,
    },
    #[error(
        "{what} {path} overlaps the server's own working area {workspace}: give a directory \
         outside it"
    )]
    Workspace {
        what: String,
        path: PathBuf,
        workspace: PathBuf,
    },
    #[error(
        "{what} {path} is inside another replbox server's working area {workspace}: give a \
         directory outside it"
    )]
    OtherWorkspace {
        what: String,
        path: PathBuf,
        workspace: PathBuf,
    },
    #[error(
        "{what} {path} contains {masked}, which the sandbox hides from sessions; give a \
         directory that does not contain it"
    )]
    ContainsMasked {
        what: String,
        path: PathBuf,
        masked: PathBuf,
    },
    #[error(
        "{what} {path} is inside {masked}, which the sandbox hides from sessions (it holds \
         other users' files, credentials or service sockets). The server's operator can allow \
         it by adding `--allow-cwd {path}` to the server's arguments after `serve` (or \
         REPLBOX_ALLOW_CWD; `replbox install --client NAME --project {path}` writes it into a \
         client's configuration), for a cwd and for files to copy alike; otherwise use a path \
         outside it"
    )]
    Masked {
        what: String,
        path: PathBuf,
        masked: PathBuf,
    },
    #[error("{what} {path}: give an absolute path")]
    Relative { what: String, path: PathBuf },
    #[error("{what} contains a NUL byte")]
    Nul { what: String },
    /// The session's user cannot search `blocked`, a directory on the way.
    #[error(
        "{what} {path}: {user} cannot enter it: {blocked} is not searchable by that user on \
         this host. Give the directories on the way search permission for others (chmod o+x \
         {blocked}) or choose another directory"
    )]
    CannotEnter {
        what: String,
        path: PathBuf,
        blocked: PathBuf,
        user: String,
    },
    #[error("path: cannot read {path} as {user}: {source}")]
    CannotRead {
        path: PathBuf,
        user: String,
        source: io::Error,
    },
    #[error("{what} {path} changed while it was checked (a link appeared); try again")]
    Changed { what: String, path: PathBuf },
    #[error("{what} {path}: not a file")]
    NotFile { what: String, path: PathBuf },
    #[error("{what} {path} is not a directory")]
    NotDirectory { what: String, path: PathBuf },
    #[error("{what} {path}: {source}")]
    Io {
        what: String,
        path: PathBuf,
        source: io::Error,
    },
    /// The file work itself (not the path) failed: the server's part.
    #[error("the file work failed: {0}")]
    Join(#[source] tokio::task::JoinError),
    #[error("the file work failed")]
    Lost,
    #[error("cannot start a thread for file work: {0}")]
    Thread(#[source] io::Error),
    #[error("the file work thread ended at once")]
    ThreadEnded,
    #[error("cannot take the session's user id {uid} for file work: {source}")]
    Credentials { uid: u32, source: Arc<io::Error> },
}

impl HostfsError {
    /// Whether the server's own file work failed, rather than the caller's path.
    pub fn is_file_work(&self) -> bool {
        matches!(
            self,
            Self::Join(_)
                | Self::Lost
                | Self::Thread(_)
                | Self::ThreadEnded
                | Self::Credentials { .. }
        )
    }
}

/// A caller's host path refused (the caller's to fix), or the server's own file work as the
/// session's uid that failed (internal).
impl From<HostfsError> for crate::error::ToolError {
    fn from(e: HostfsError) -> Self {
        if e.is_file_work() {
            Self::internal(e.to_string())
        } else {
            Self::invalid(e.to_string())
        }
    }
}
