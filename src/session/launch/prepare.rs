//! A session's directories before its interpreter starts: the caller's cwd (else the
//! session's `work/`), virtual environment and files, dealt with as the session's uid.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::ToolError;
use crate::hostfs::{self, CwdPolicy};
use crate::lang::Language;
use crate::lang::Why;
use crate::sandbox::BindError;
use crate::session::files::{self, InFile};
use crate::venv::{self, Venv, VenvPolicy};

/// Why a session's directories could not be prepared: the caller's cwd, venv or files.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Cwd(#[from] hostfs::HostfsError),
    /// The sandbox cannot bind the cwd (its reason).
    #[error("cwd {cwd}: {why}")]
    Bind { cwd: PathBuf, why: BindError },
    #[error(transparent)]
    Venv(#[from] venv::VenvError),
    #[error(transparent)]
    Files(#[from] files::InFileError),
}

/// A session's cwd, venv or files refused: the caller's to fix.
impl From<PrepareError> for ToolError {
    fn from(e: PrepareError) -> Self {
        match e {
            PrepareError::Cwd(e) => e.into(),
            PrepareError::Venv(e) => e.into(),
            e => Self::invalid(e.to_string()),
        }
    }
}

/// A session's directories once the caller's cwd and files are dealt with.
pub(in crate::session) struct Prepared {
    /// The caller's cwd, canonical (None: the private `work/`).
    pub(super) caller_cwd: Option<PathBuf>,
    pub(super) cwd_fd: Arc<OwnedFd>,
    pub(super) out_fd: Arc<OwnedFd>,
    /// Whether the session's uid may write in its cwd.
    pub(super) writable: bool,
    pub(super) brought: Arc<files::Written>,
    /// The virtual environment to run in, and why.
    pub(super) venv: Option<(Venv, Why)>,
    /// Why a `.venv` in the cwd was not used.
    pub(super) venv_note: Option<String>,
    /// Who could have made or changed the `.venv` found in the cwd (decided by the caller
    /// of [`prepare_dirs`], which knows whose uids they are).
    pub(super) venv_writers: Option<venv::Writers>,
}

/// Which virtual environment a session asks for.
#[derive(Debug, Clone)]
pub(in crate::session) enum VenvAsk {
    /// None: the language takes none, or no cwd to look in.
    No,
    /// The caller's `venv`.
    Given(PathBuf),
    /// A `.venv` in the caller's cwd, if there is one.
    Look,
}

impl VenvAsk {
    /// What a request for `lang` asks: its `venv` (refused for a language that takes
    /// none), else a look into its cwd when it has one.
    pub(super) fn of(
        lang: &Language,
        venv: Option<PathBuf>,
        has_cwd: bool,
    ) -> Result<Self, ToolError> {
        match (venv, lang.spec.venv) {
            (Some(_), false) => Err(ToolError::invalid(format!(
                "venv is a Python virtual environment, and {} takes none; leave venv out",
                lang.id()
            ))),
            (Some(v), true) => Ok(VenvAsk::Given(v)),
            (None, true) if has_cwd => Ok(VenvAsk::Look),
            (None, _) => Ok(VenvAsk::No),
        }
    }
}

/// Decide the caller's cwd (else the session's `work/`) and virtual environment, and bring
/// the files in: run as the session's uid (through [`hostfs::as_uid`]). `bind` says why the
/// sandbox may not bind a cwd (checked before any file is brought in).
#[allow(clippy::too_many_arguments)]
pub(super) fn prepare_dirs(
    policy: &CwdPolicy,
    bind: &dyn Fn(&Path) -> Result<(), BindError>,
    uid: Option<u32>,
    cwd: Option<PathBuf>,
    (ask, venv_policy): (VenvAsk, VenvPolicy),
    work_fd: OwnedFd,
    out_fd: OwnedFd,
    in_files: Vec<InFile>,
    local: bool,
) -> Result<Prepared, PrepareError> {
    let (caller_cwd, cwd_fd, writable) = match cwd {
        Some(p) => {
            let c = hostfs::check_cwd(policy, &p, uid)?;
            bind(&c.path).map_err(|why| PrepareError::Bind {
                cwd: p.clone(),
                why,
            })?;
            (Some(c.path), c.dir, c.writable)
        }
        None => (None, work_fd, true),
    };
    let (mut venv, mut venv_note, mut venv_writers) = (None, None, None);
    match (ask, &caller_cwd) {
        (VenvAsk::Given(p), _) => {
            venv = Some((venv::inspect(&venv_policy, &p, uid)?, Why::Venv));
        }
        (VenvAsk::Look, Some(dir))
            if rustix::fs::statat(&cwd_fd, ".venv", rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                .is_ok() =>
        {
            // Not asked for by name: one that cannot be used is said, and the session
            // starts with the server's Python.
            let found = venv::inspect(&venv_policy, &dir.join(".venv"), uid).and_then(|v| {
                let w = venv::writers(dir, cwd_fd.as_fd(), v.dir.as_fd())?;
                Ok((v, w))
            });
            match found {
                Ok((v, w)) => {
                    venv = Some((v, Why::CwdVenv));
                    venv_writers = Some(w);
                }
                Err(e) => {
                    venv_note = Some(format!(
                        "the .venv in cwd was not used ({e}); this session runs the server's \
Python. Pass venv to name an environment"
                    ))
                }
            }
        }
        _ => {}
    }
    let brought = if in_files.is_empty() {
        files::Written::default()
    } else {
        let host_paths = local.then_some(policy);
        files::bring_in(
            in_files,
            cwd_fd.as_fd(),
            host_paths,
            &hostfs::user_name(uid),
        )?
    };
    Ok(Prepared {
        caller_cwd,
        cwd_fd: Arc::new(cwd_fd),
        out_fd: Arc::new(out_fd),
        writable,
        brought: Arc::new(brought),
        venv,
        venv_note,
        venv_writers,
    })
}

/// What the start result says about a cwd the session may not write.
pub(super) fn read_only_note(cwd: &Path, uid: Option<u32>) -> String {
    let who = uid.map_or("the server's user".to_string(), |u| format!("uid {u}"));
    format!(
        "cwd {} is read-only for this session: its code runs as {who}, which may not write \
there; it can read the files. To let sessions write there, give that user write permission with \
an ACL on the directory (setfacl -m u:{}:rwx DIR; keep the directory and those above it root's), \
or leave cwd out to work in a private directory",
        cwd.display(),
        uid.map_or("USER".to_string(), |u| u.to_string()),
    )
}
