//! Starting a session: a place under the limits (evicting the idlest session when
//! configured to), a warm session or a cold start, its journal, and its entry in the table.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::journal::Writer;
use super::launch::StartRequest;
use super::live::{End, Phase, Session};
use super::manager::SessionManager;
use super::report::StartReport;
use super::table::{Limits, Refusal, Slot};
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;
use crate::session::history::Record;

impl SessionManager {
    /// Start a session; errors are messages for the agent.
    pub async fn start(
        &self,
        caller: &Caller,
        req: StartRequest,
    ) -> Result<StartReport, ToolError> {
        self.launcher.check_idle_timeout(req.idle_timeout_s)?;
        let id = uuid::Uuid::new_v4().to_string();
        let slot = self.admit(caller, &id, false).await?;
        let (report, _) = self.start_as(caller, req, slot, None).await?;
        self.claim_new(caller, &report.session_id).await?;
        Ok(report)
    }

    /// Start the session `slot` holds a place for: a new one (`restoring` None: its journal
    /// is created), or one restored from its journal (which it goes on writing). Every check
    /// of a new session applies either way. A new session that needs nothing a warm one
    /// lacks is a warm one (then its id is the warm one's).
    pub(super) async fn start_as(
        &self,
        caller: &Caller,
        req: StartRequest,
        mut slot: Slot<'_>,
        restoring: Option<Arc<Writer>>,
    ) -> Result<(StartReport, Arc<Session>), ToolError> {
        let id = slot.id.clone();
        let (lang, spec) = self.launcher.session_language(&req.language)?;
        let domains = self.launcher.check_request(&lang, &req)?;
        let upstreams = self.launcher.upstreams.get();
        let access = super::tools::access(upstreams, caller, &req.mcp_servers).await?;
        let journaled = restoring.is_none().then(|| req.clone());
        let idle_timeout = self.config.idle_timeout(req.idle_timeout_s);
        let warm = match restoring {
            None => self.warm.take(&lang, &req, &caller.principal).await?,
            Some(_) => None,
        };
        let (mut up, warm) = match warm {
            Some(up) => (up, true),
            None => (
                self.launcher
                    .start_cold(caller, req, id, (lang, spec), (&domains, access))
                    .await?,
                false,
            ),
        };
        let journal = match journaled {
            Some(r) => {
                let (id, notes) = (up.id.clone(), &mut up.notes);
                self.journals.create(&id, caller, &r, notes).await
            }
            None => restoring,
        };
        let record = Record::new(self.config.history_bounds());
        let (report, parts) = up.into_session(
            caller,
            self.sandbox.level,
            (idle_timeout, warm),
            (journal, slot.share(), record),
        );
        let session = Arc::new(Session::new(parts));
        self.table.enter(slot, session.clone());
        Ok((report, session))
    }

    /// Take a place under the session limits for `id` (a new session, or the caller's
    /// suspended one when `restore`): the caller's own (per principal), then the server's,
    /// where the idlest session is evicted when configured to.
    pub(super) async fn admit(
        &self,
        caller: &Caller,
        id: &str,
        restore: bool,
    ) -> Result<Slot<'_>, ToolError> {
        let limits = Limits {
            max: self.config.max_sessions,
            per_principal: self.config.max_sessions_per_principal,
        };
        loop {
            match self.table.admit(caller, id, restore, &limits, &self.shares) {
                Ok(slot) => return Ok(slot),
                Err(Refusal::Principal {
                    mine,
                    starting,
                    limit,
                }) => {
                    return Err(ToolError::new(
                        ErrorKind::Limit,
                        format!(
                            "session limit reached: you already have {mine} open session(s){} and \
the limit per client is {limit} (max_sessions_per_principal). Close one you no longer need with \
session_close (session_list shows them), or reuse one with session_eval.",
                            if starting > 0 {
                                format!(" and {starting} starting")
                            } else {
                                String::new()
                            }
                        ),
                    ));
                }
                Err(Refusal::Share(e)) => return Err(e),
                Err(Refusal::NotSuspended) => return Err(self.not_restorable(caller, id)),
                Err(Refusal::Server) => {}
            }
            let idlest = self
                .table
                .open_sessions(None)
                .into_iter()
                .filter(|s| !matches!(s.phase(), Phase::Busy { .. }))
                .max_by_key(|s| s.idle_for());
            match idlest {
                Some(victim) if self.config.evict_idle => {
                    let idle = victim.idle_for();
                    tracing::info!(session = %victim.id, "evicting the idlest session");
                    let how = End::Evicted {
                        at: SystemTime::now(),
                        idle,
                        waiting: victim.waiting_for_input(),
                    };
                    self.end(victim, how).await;
                }
                _ => return Err(ToolError::new(ErrorKind::Limit, self.limit_message(caller))),
            }
        }
    }

    fn limit_message(&self, caller: &Caller) -> String {
        let open = self.table.open_sessions(None);
        let mut mine: Vec<(Duration, String)> = open
            .iter()
            .filter(|s| s.owner == *caller)
            .map(|s| {
                (
                    s.idle_for(),
                    format!(
                        "{} ({}, idle {} s)",
                        s.id,
                        s.lang.id(),
                        s.idle_for().as_secs()
                    ),
                )
            })
            .collect();
        mine.sort_by_key(|m| std::cmp::Reverse(m.0));
        let list: Vec<String> = mine.into_iter().take(3).map(|(_, d)| d).collect();
        let yours = if list.is_empty() {
            "none of them are yours".to_string()
        } else {
            format!("your idlest: {}", list.join("; "))
        };
        format!(
            "session limit reached: {} sessions are open (the server allows {}). Close one with \
session_close ({yours}), or wait for idle sessions to be closed.",
            open.len(),
            self.config.max_sessions
        )
    }
}
