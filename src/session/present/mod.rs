//! What the tools show of the table: `session_list`, the history and exports of a session
//! (open, ended while kept, or suspended), and its files as resources.

pub mod export;
pub mod resources;

use std::time::SystemTime;

use super::live::{End, unix};
use super::manager::SessionManager;
use super::persist::suspended_rows;
use super::report::{EndedInfo, ListReport, SessionInfo};
use super::table::{Entry, Kept};
use crate::identity::Caller;

impl SessionManager {
    /// The caller's open sessions, and those that ended (files kept) or are suspended.
    pub fn list(&self, caller: &Caller) -> ListReport {
        let mut sessions: Vec<SessionInfo> = self
            .table
            .open_sessions(Some(caller))
            .iter()
            .map(|s| s.info())
            .collect();
        sessions.sort_by_key(|s| s.created_at);
        let mut ended = self.ended_rows(caller);
        for row in suspended_rows(&self.table, caller) {
            // A kept session that is also restorable is one row.
            match ended.iter_mut().find(|e| e.session_id == row.session_id) {
                Some(e) => {
                    e.state = row.state;
                    e.restorable = true;
                }
                None => ended.push(row),
            }
        }
        ListReport { sessions, ended }
    }

    /// The caller's ended sessions whose end is kept, oldest first.
    fn ended_rows(&self, caller: &Caller) -> Vec<EndedInfo> {
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
