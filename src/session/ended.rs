//! What is kept of an ended session (closed, exited, reaped, evicted): its files stay
//! readable as resources, read-only, and its history stays listable and exportable, for
//! `--keep-files-s`; then its directory is removed (a caller's `cwd` never is) and its uid
//! returned.
//!
//! The files are read as the session's uid, as while it ran, so the uid stays the session's
//! until then: it is not handed to another session or run, so nothing else can run as it
//! and write where these files are read. Nothing of the session runs either: its tree was
//! killed, and its uid swept when that was not confirmed. When every uid is in use, the
//! oldest kept directory gives its uid back early ([`Reclaim`]).

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use schemars::JsonSchema;
use serde::Serialize;

use super::entry::{End, Footprint, Session, unix};
use super::history::Record;
use super::manager::SessionManager;
use super::table::{Entry, Leaving};
use crate::identity::Caller;
use crate::lang::Language;
use crate::sandbox::Reclaim;

/// What is kept of an ended session, beside its entry in the table.
pub(super) struct Kept {
    pub lang: Arc<Language>,
    pub cwd_fd: Arc<OwnedFd>,
    pub uid: Option<u32>,
    pub created_at: SystemTime,
    pub ended_at: SystemTime,
    pub until: SystemTime,
    pub evals: u64,
    pub record: Arc<Mutex<Record>>,
    /// The directory and uid; None once released (its uid reclaimed).
    pub files: Option<Footprint>,
    /// Its uid is bound to no principal (a warm session's): any caller may take it back.
    pub unbound: bool,
}

impl Kept {
    /// Whether its files can still be read.
    pub fn has_files(&self) -> bool {
        self.files.is_some()
    }

    /// Remove the directory and return the uid, and wait for both.
    pub(super) async fn release(self) {
        if let Some(task) = self.files.and_then(Footprint::release) {
            let _ = task.await;
        }
    }
}

impl Leaving {
    /// Release what left the table, in order.
    pub(super) async fn release(self) {
        for k in self.0 {
            k.release().await;
        }
    }
}

/// One ended (or suspended) session in `session_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EndedInfo {
    pub session_id: String,
    pub language: String,
    /// `ended`, or `suspended`: restorable with session_restore (its journal is kept).
    pub state: String,
    /// How it ended: `closed`, `exited`, `reaped`, `evicted`, or `server_stopped`.
    pub reason: String,
    /// Unix time it ended, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// Unix time until which its files stay readable as resources (read-only) and its
    /// history stays listable; absent when they are gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_kept_until: Option<u64>,
    pub evals: u64,
    pub restorable: bool,
}

impl SessionManager {
    /// A session's interpreter is gone: keep its files and history for a while, or release
    /// everything at once when nothing is kept.
    pub(super) async fn retire(&self, session: Arc<Session>) {
        let keep = Duration::from_secs(self.config.keep_files_s);
        if keep.is_zero() {
            session.dispose().await;
            return;
        }
        let s = session.clone();
        let taken = tokio::task::spawn_blocking(move || {
            let files = s.take_footprint();
            // Read once, off the workers: whether anyone may take its uid back.
            let unbound = files
                .as_ref()
                .and_then(|f| f.lease.as_ref())
                .is_some_and(|l| l.unbound());
            (files, unbound)
        })
        .await;
        let Ok((files, unbound)) = taken else {
            return;
        };
        let now = SystemTime::now();
        let kept = Kept {
            lang: session.lang.clone(),
            cwd_fd: session.cwd_fd.clone(),
            uid: session.uid,
            created_at: session.created_at,
            ended_at: now,
            until: now + keep,
            evals: session.evals.load(std::sync::atomic::Ordering::Relaxed),
            record: session.record.clone(),
            files,
            unbound,
        };
        let id = session.id.clone();
        drop(session);
        // At most as many kept as sessions may be open: the oldest goes first.
        self.table.keep(&id, kept).release().await;
    }

    /// Release what has been kept long enough.
    pub(super) async fn expire_kept(&self) {
        self.table.expire(SystemTime::now()).release().await;
    }

    /// Release everything kept (server shutdown).
    pub(super) async fn release_kept(&self) {
        self.table.take_all_kept().release().await;
    }

    /// The caller's ended session `id` whose files are kept: its directory and uid.
    pub(super) fn kept_files(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Option<(Arc<OwnedFd>, Option<u32>)> {
        self.table.read(|st| {
            let e = st.get(id).filter(|e| e.owner() == caller)?;
            let k = e.kept().filter(|k| k.has_files())?;
            Some((k.cwd_fd.clone(), k.uid))
        })
    }

    /// The caller's ended sessions whose end is kept, for `session_list`.
    pub(super) fn ended_rows(&self, caller: &Caller) -> Vec<EndedInfo> {
        let mut rows: Vec<(SystemTime, EndedInfo)> = self.table.read(|st| {
            st.entries()
                .filter(|(_, e)| e.owner() == caller)
                .filter_map(|(id, e)| {
                    let (how, k) = match e {
                        Entry::Ended(end) => (&end.how, end.kept.as_ref()?),
                        Entry::Suspended(s) => {
                            let end = s.ended.as_ref()?;
                            (&end.how, end.kept.as_ref()?)
                        }
                        _ => return None,
                    };
                    Some((k.ended_at, ended_row(id, how, k)))
                })
                .collect()
        });
        rows.sort_by_key(|r| r.0);
        rows.into_iter().map(|r| r.1).collect()
    }
}

fn ended_row(id: &str, how: &End, k: &Kept) -> EndedInfo {
    EndedInfo {
        session_id: id.to_string(),
        language: k.lang.id().to_string(),
        state: "ended".into(),
        reason: how.reason().into(),
        ended_at: Some(unix(k.ended_at)),
        files_kept_until: k.has_files().then(|| unix(k.until)),
        evals: k.evals,
        restorable: false,
    }
}

impl Reclaim for SessionManager {
    fn reclaim<'a>(
        &'a self,
        principal: &'a str,
        own: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            // One bound to the principal (its own ended session's), or, unless only that
            // helps, a warm session's, whose uid was left unbound: anyone may have it.
            let taken = self.table.reclaim_files(|owner, k| {
                k.files.as_ref().and_then(|f| f.lease.as_ref()).is_some()
                    && match (own, k.unbound) {
                        (true, unbound) => owner.principal == principal && !unbound,
                        (false, unbound) => owner.principal == principal || unbound,
                    }
            });
            let Some((id, files)) = taken else {
                return false;
            };
            tracing::info!(session = %id, "removing an ended session's files early: its uid is needed");
            if let Some(task) = files.release() {
                let _ = task.await;
            }
            true
        })
    }

    fn gives_own(&self) -> bool {
        true
    }
}
