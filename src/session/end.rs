//! Ending sessions: close, idle reaping, eviction, an interpreter that exited, and server
//! shutdown. An ended session's tree is killed first; then its journal says how it ended
//! (or is deleted, on close) and its files and history are kept for `--keep-files-s` (or
//! released at once); what is kept goes when it expires, past the cap, or early when its uid
//! is needed ([`Reclaim`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use super::live::{End, Session};
use super::manager::SessionManager;
use super::report::CloseReport;
use super::table::Kept;
use crate::error::ToolError;
use crate::identity::Caller;
use crate::sandbox::Reclaim;

impl SessionManager {
    /// End a session for `how`: forget it, kill its tree, keep its files for a while (or
    /// remove its directory).
    pub(super) async fn end(&self, session: Arc<Session>, how: End) -> Option<i32> {
        if !self.table.mark_ended(&session, how.clone()) {
            return None;
        }
        let exit_code = kill_session(&session).await;
        self.journals.end(&self.table, &session, &how).await;
        self.retire(session).await;
        exit_code
    }

    /// After a call whose evaluation ended the interpreter: its journal says so, and its
    /// files and history are kept for a while (once, whichever call sees it).
    pub(super) async fn after_call(&self, session: &Arc<Session>) {
        if let Some(how @ End::Exited { .. }) = session.ended()
            && session.claim_retirement()
        {
            self.journals.end(&self.table, session, &how).await;
            self.retire(session.clone()).await;
        }
    }

    /// Close a session: kill its interpreter's tree and remove its directory (after the
    /// files are kept a while) and its journal. A suspended session's journal is deleted.
    pub async fn close(&self, caller: &Caller, id: &str) -> Result<CloseReport, ToolError> {
        self.cluster_gate(caller, id).await?;
        if self.journals.discard(&self.table, caller, id).await {
            self.cluster_release(id).await;
            return Ok(CloseReport {
                session_id: id.to_string(),
                closed: true,
                exit_code: None,
            });
        }
        let session = self.lookup(caller, id)?;
        let exit_code = self.end(session, End::Closed).await;
        self.cluster_release(id).await;
        Ok(CloseReport {
            session_id: id.to_string(),
            closed: true,
            exit_code,
        })
    }

    /// Close every session idle for longer than its idle timeout.
    pub async fn reap_idle(&self) {
        let expired: Vec<Arc<Session>> = self.table.read(|st| {
            st.open()
                .filter(|s| s.idle_for() > s.idle_timeout)
                .cloned()
                .collect()
        });
        for s in expired {
            let idle = s.idle_for();
            tracing::info!(session = %s.id, idle_s = idle.as_secs(), "closing idle session");
            let how = End::Reaped {
                at: SystemTime::now(),
                idle,
                waiting: s.waiting_for_input(),
            };
            self.end(s, how).await;
        }
    }

    /// A session's interpreter is gone: keep its files and history for a while, or release
    /// everything at once when nothing is kept.
    async fn retire(&self, session: Arc<Session>) {
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
            evals: session.evals.load(Ordering::Relaxed),
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

    /// Close every session (server shutdown).
    pub async fn shutdown(&self) {
        let mut tasks = Vec::new();
        for s in self.table.open_sessions(None) {
            if self.table.mark_ended(&s, End::Closed) {
                tasks.push(tokio::spawn(finish(s)));
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        self.table.take_all_kept().release().await;
        self.cluster_leave().await;
    }
}

/// Kill a gone session's tree; then, unless a call still holds it, remove its directory and
/// return its uid.
pub(super) async fn finish(session: Arc<Session>) -> Option<i32> {
    let exit_code = kill_session(&session).await;
    session.dispose().await;
    exit_code
}

/// Stop a session handed over to the cluster: kill its tree and remove its directory and
/// return its uid now, even while a call still holds it.
pub(super) async fn stop_handed_over(session: Arc<Session>) {
    kill_session(&session).await;
    let s = session.clone();
    let files = tokio::task::spawn_blocking(move || s.take_footprint()).await;
    if let Some(task) = files.ok().flatten().and_then(|f| f.release()) {
        let _ = task.await;
    }
    session.dispose().await;
}

/// Kill a session's interpreter tree, even while an evaluation holds it.
async fn kill_session(session: &Session) -> Option<i32> {
    let mut guard = match session.interp.try_lock() {
        Ok(g) => g,
        Err(_) => {
            // The evaluation in flight returns promptly once its tree is gone. The helper's
            // pid is kept for this: the interpreter's parent could be the server itself.
            let helper = session.helper.load(Ordering::Relaxed);
            crate::exec::spawn::terminate_helper(u32::try_from(helper).unwrap_or(0));
            session.interp.lock().await
        }
    };
    let status = match guard.as_mut() {
        Some(i) => i.kill().await,
        None => None,
    };
    *guard = None;
    status.and_then(|s| s.code())
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
