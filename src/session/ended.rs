//! Ended sessions: what stays of a session once its interpreter is gone (closed, exited,
//! reaped, evicted). Its files stay readable as resources, read-only, and its history stays
//! listable and exportable, for `--keep-files-s`; then its directory is removed (a caller's
//! `cwd` never is) and its uid returned.
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

use super::entry::{Gone, Remains, Session, lock, unix};
use super::history::Record;
use super::manager::SessionManager;
use crate::identity::Caller;
use crate::lang::Language;
use crate::sandbox::Reclaim;

/// What is kept of an ended session.
pub(super) struct Kept {
    pub id: String,
    pub owner: Caller,
    pub lang: Arc<Language>,
    pub cwd_fd: Arc<OwnedFd>,
    pub uid: Option<u32>,
    pub created_at: SystemTime,
    pub ended_at: SystemTime,
    pub until: SystemTime,
    pub how: Gone,
    pub evals: u64,
    pub record: Arc<Mutex<Record>>,
    /// The directory and uid; None once released (expired, or its uid reclaimed).
    pub remains: Mutex<Option<Remains>>,
}

impl Kept {
    /// Whether its files can still be read.
    pub fn has_files(&self) -> bool {
        lock(&self.remains).is_some()
    }

    /// Remove the directory and return the uid, and wait for both.
    pub(super) async fn release(&self) {
        let remains = lock(&self.remains).take();
        if let Some(task) = remains.and_then(Remains::release) {
            let _ = task.await;
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
    pub(super) async fn retire(&self, session: Arc<Session>, how: Gone) {
        if self.kept.contains_key(&session.id) {
            return; // retired already (closed while an evaluation ended it)
        }
        let keep = Duration::from_secs(self.config.keep_files_s);
        if keep.is_zero() {
            session.dispose().await;
            return;
        }
        let s = session.clone();
        let Ok(remains) = tokio::task::spawn_blocking(move || s.take_remains()).await else {
            return;
        };
        let now = SystemTime::now();
        let kept = Arc::new(Kept {
            id: session.id.clone(),
            owner: session.owner.clone(),
            lang: session.lang.clone(),
            cwd_fd: session.cwd_fd.clone(),
            uid: session.uid,
            created_at: session.created_at,
            ended_at: now,
            until: now + keep,
            how,
            evals: session.evals.load(std::sync::atomic::Ordering::Relaxed),
            record: session.record.clone(),
            remains: Mutex::new(remains),
        });
        drop(session);
        self.kept.insert(kept.id.clone(), kept);
        // At most as many kept as sessions may be open: the oldest goes first.
        while self.kept.len() > self.config.max_sessions.max(1) {
            let Some(oldest) = self.oldest_kept(|_| true) else {
                break;
            };
            if let Some((_, k)) = self.kept.remove(&oldest) {
                k.release().await;
            }
        }
    }

    /// The oldest kept session matching `f`.
    fn oldest_kept(&self, f: impl Fn(&Kept) -> bool) -> Option<String> {
        self.kept
            .iter()
            .filter(|k| f(k.value()))
            .min_by_key(|k| k.ended_at)
            .map(|k| k.key().clone())
    }

    /// Release what has been kept long enough.
    pub(super) async fn expire_kept(&self) {
        let now = SystemTime::now();
        let expired: Vec<String> = self
            .kept
            .iter()
            .filter(|k| k.until <= now)
            .map(|k| k.key().clone())
            .collect();
        for id in expired {
            if let Some((_, k)) = self.kept.remove(&id) {
                k.release().await;
            }
        }
    }

    /// Release everything kept (server shutdown).
    pub(super) async fn release_kept(&self) {
        let all: Vec<String> = self.kept.iter().map(|k| k.key().clone()).collect();
        for id in all {
            if let Some((_, k)) = self.kept.remove(&id) {
                k.release().await;
            }
        }
    }

    /// The kept record of the caller's ended session `id`.
    pub(super) fn kept(&self, caller: &Caller, id: &str) -> Option<Arc<Kept>> {
        self.kept
            .get(id)
            .filter(|k| k.owner == *caller)
            .map(|k| k.clone())
    }

    /// The caller's ended sessions, for `session_list`.
    pub(super) fn ended_rows(&self, caller: &Caller) -> Vec<EndedInfo> {
        let mut rows: Vec<(SystemTime, EndedInfo)> = self
            .kept
            .iter()
            .filter(|k| k.owner == *caller)
            .map(|k| {
                (
                    k.ended_at,
                    EndedInfo {
                        session_id: k.key().clone(),
                        language: k.lang.id().to_string(),
                        state: "ended".into(),
                        reason: k.how.reason().into(),
                        ended_at: Some(unix(k.ended_at)),
                        files_kept_until: k.has_files().then(|| unix(k.until)),
                        evals: k.evals,
                        restorable: false,
                    },
                )
            })
            .collect();
        rows.sort_by_key(|r| r.0);
        rows.into_iter().map(|r| r.1).collect()
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
            let Some(id) = self.oldest_kept(|k| {
                lock(&k.remains)
                    .as_ref()
                    .and_then(|r| r.lease.as_ref())
                    .is_some_and(|l| match (own, l.unbound()) {
                        (true, unbound) => k.owner.principal == principal && !unbound,
                        (false, unbound) => k.owner.principal == principal || unbound,
                    })
            }) else {
                return false;
            };
            let Some(k) = self.kept.get(&id).map(|k| k.clone()) else {
                return false;
            };
            tracing::info!(session = %id, "removing an ended session's files early: its uid is needed");
            k.release().await;
            true
        })
    }

    fn gives_own(&self) -> bool {
        true
    }
}
