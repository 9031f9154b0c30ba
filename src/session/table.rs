//! The session table: every session id this server knows, one [`Entry`] each, in one map
//! under one lock. An id goes `Starting` → `Open` → `Ended`, or `Suspended` while a journal
//! can start it again; ended ones are forgotten oldest first (`--max-ended-sessions`), and
//! what is kept of them (files, history) goes oldest first too, past the session limit or
//! when `--keep-files-s` runs out.
//!
//! The lock is a std mutex held for short, synchronous sections: never across an await, and
//! nothing that does work when dropped is dropped under it (what leaves the table is handed
//! back to be released). A session's own small locks (its phase, its last use) may be taken
//! under it, never the other way round.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use super::history::Record;
use super::journal::Journaled;
use super::live::{End, Footprint, Session, lock};
use crate::identity::Caller;
use crate::lang::Language;
use crate::share::{Share, Shares, Use};

/// One id of the table.
pub(super) enum Entry {
    /// Being started for its owner (counted against the limits); a restore holds the entry
    /// it came from, put back if the start fails.
    Starting {
        owner: Caller,
        from: Option<Suspended>,
    },
    Open(Arc<Session>),
    Ended(Ended),
    /// Restorable from its journal.
    Suspended(Suspended),
}

impl Entry {
    pub(super) fn owner(&self) -> &Caller {
        match self {
            Entry::Starting { owner, .. } => owner,
            Entry::Open(s) => &s.owner,
            Entry::Ended(e) => &e.owner,
            Entry::Suspended(s) => &s.journal.owner,
        }
    }

    /// What is kept of its end, if it ended in this server.
    fn kept_mut(&mut self) -> Option<&mut Option<Kept>> {
        match self {
            Entry::Ended(e) => Some(&mut e.kept),
            Entry::Suspended(Suspended { ended: Some(e), .. }) => Some(&mut e.kept),
            _ => None,
        }
    }

    /// What is kept of its end (files, history), while it is.
    pub(super) fn kept(&self) -> Option<&Kept> {
        match self {
            Entry::Ended(e) => e.kept.as_ref(),
            Entry::Suspended(s) => s.ended.as_ref().and_then(|e| e.kept.as_ref()),
            _ => None,
        }
    }
}

/// A session that ended in this server: how, and what is kept of it for a while.
pub(super) struct Ended {
    pub owner: Caller,
    pub how: End,
    /// Its place among the endings: the order they are forgotten in.
    seq: u64,
    pub kept: Option<Kept>,
}

/// A session its journal can start again: what lists need of the journal, and, when it
/// ended in this server, that ending.
pub(super) struct Suspended {
    pub journal: Journaled,
    pub ended: Option<Ended>,
}

/// What is kept of an ended session for `--keep-files-s`: its history, and its files,
/// read as its uid, which stays its own meanwhile (nothing else can run as it and write
/// where they are read; its tree was killed and its uid swept when that was not confirmed).
/// When every uid is in use, the oldest kept files give their uid back early.
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

/// Ids in the order their sessions ended (oldest first).
#[derive(Default)]
struct Order(VecDeque<(u64, String)>);

impl Order {
    fn insert(&mut self, seq: u64, id: &str) {
        let at = self.0.partition_point(|(s, _)| *s < seq);
        self.0.insert(at, (seq, id.to_string()));
    }

    fn remove(&mut self, id: &str) {
        if let Some(at) = self.0.iter().position(|(_, i)| i == id) {
            self.0.remove(at);
        }
    }

    fn oldest(&self) -> Option<&str> {
        self.0.front().map(|(_, id)| id.as_str())
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn ids(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(_, id)| id.as_str())
    }
}

#[derive(Default)]
pub(super) struct State {
    entries: HashMap<String, Entry>,
    /// The `Ended` entries, oldest first.
    ended: Order,
    /// The entries whose end is kept (files, history), oldest first.
    kept: Order,
    next_seq: u64,
}

impl State {
    pub(super) fn get(&self, id: &str) -> Option<&Entry> {
        self.entries.get(id)
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter()
    }

    /// The open sessions.
    pub(super) fn open(&self) -> impl Iterator<Item = &Arc<Session>> {
        self.entries.values().filter_map(|e| match e {
            Entry::Open(s) => Some(s),
            _ => None,
        })
    }

    /// Open and starting sessions: all of them, and those of `caller`.
    fn active(&self, caller: &Caller) -> (usize, usize, usize) {
        let (mut all, mut mine, mut mine_starting) = (0, 0, 0);
        for e in self.entries.values() {
            let starting = matches!(e, Entry::Starting { .. });
            if !starting && !matches!(e, Entry::Open(_)) {
                continue;
            }
            all += 1;
            if e.owner() == caller {
                if starting {
                    mine_starting += 1;
                } else {
                    mine += 1;
                }
            }
        }
        (all, mine, mine_starting)
    }

    /// Put `id` in, replacing what was there, keeping the orders true.
    fn put(&mut self, id: &str, entry: Entry) -> Option<Entry> {
        let old = self.take(id);
        if let Entry::Ended(e) = &entry {
            self.ended.insert(e.seq, id);
        }
        if let Some(seq) = entry_seq(&entry).filter(|_| entry.kept().is_some()) {
            self.kept.insert(seq, id);
        }
        self.entries.insert(id.to_string(), entry);
        old
    }

    /// Take `id` out, keeping the orders true.
    fn take(&mut self, id: &str) -> Option<Entry> {
        let old = self.entries.remove(id)?;
        if matches!(old, Entry::Ended(_)) {
            self.ended.remove(id);
        }
        if old.kept().is_some() {
            self.kept.remove(id);
        }
        Some(old)
    }

    /// Take what is kept of `id`'s end out, leaving the entry.
    fn take_kept(&mut self, id: &str) -> Option<Kept> {
        let kept = self.entries.get_mut(id)?.kept_mut()?.take();
        if kept.is_some() {
            self.kept.remove(id);
        }
        kept
    }
}

fn entry_seq(e: &Entry) -> Option<u64> {
    match e {
        Entry::Ended(e) => Some(e.seq),
        Entry::Suspended(Suspended { ended: Some(e), .. }) => Some(e.seq),
        _ => None,
    }
}

/// The limits a start is admitted under.
pub(super) struct Limits {
    /// Open and starting sessions of the server.
    pub max: usize,
    /// Of one principal (0: no limit).
    pub per_principal: usize,
}

/// Why a start was not admitted.
pub(super) enum Refusal {
    /// The caller holds its limit of sessions (open, starting).
    Principal {
        mine: usize,
        starting: usize,
        limit: usize,
    },
    /// The server holds its limit: the caller may make room by evicting one.
    Server,
    /// The caller's share of sessions and runs is taken.
    Share(crate::error::ToolError),
    /// A restore of an id that is not a suspended session of the caller.
    NotSuspended,
}

/// The table.
pub(super) struct Table {
    state: Mutex<State>,
    /// Ended sessions remembered at most.
    remember: usize,
    /// Ended sessions whose files and history are kept at most.
    keep: usize,
}

/// What leaves the table and must be released outside its lock.
#[must_use]
pub(super) struct Leaving(Vec<Kept>);

impl Leaving {
    /// Release what left the table, in order.
    pub(super) async fn release(self) {
        for k in self.0 {
            k.release().await;
        }
    }
}

impl Table {
    pub(super) fn new(remember: usize, keep: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            remember,
            keep: keep.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Read the table under its lock (no await, no other table call inside).
    pub(super) fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock())
    }

    /// Reserve a start for `caller` under the limits: a new id, or the caller's suspended
    /// session `restore` (which then leaves the list of restorable ones until the start
    /// succeeds or fails). The caller's share of sessions and runs is taken with it.
    pub(super) fn admit<'a>(
        &'a self,
        caller: &Caller,
        id: &str,
        restore: bool,
        limits: &Limits,
        shares: &Arc<Shares>,
    ) -> Result<Slot<'a>, Refusal> {
        let mut st = self.lock();
        if restore {
            let theirs =
                matches!(st.get(id), Some(Entry::Suspended(s)) if s.journal.owner == *caller);
            if !theirs {
                return Err(Refusal::NotSuspended);
            }
        }
        let (all, mine, starting) = st.active(caller);
        if limits.per_principal > 0 && mine + starting >= limits.per_principal {
            return Err(Refusal::Principal {
                mine,
                starting,
                limit: limits.per_principal,
            });
        }
        if all >= limits.max {
            return Err(Refusal::Server);
        }
        // Sessions and runs together, after the sessions' own limits, whose messages are the
        // more useful ones when both are reached.
        let share = shares.take(caller, Use::Session).map_err(Refusal::Share)?;
        let from = match st.take(id) {
            Some(Entry::Suspended(s)) => Some(s),
            _ => None,
        };
        st.entries.insert(
            id.to_string(),
            Entry::Starting {
                owner: caller.clone(),
                from,
            },
        );
        Ok(Slot {
            table: self,
            id: id.to_string(),
            share: Some(share),
            armed: true,
        })
    }

    /// A started session enters under its id, in place of the slot's reservation.
    pub(super) fn enter(&self, mut slot: Slot<'_>, session: Arc<Session>) {
        slot.armed = false;
        let mut st = self.lock();
        let reserved = match st.get(&slot.id) {
            Some(Entry::Starting { .. }) => st.take(&slot.id),
            _ => None,
        };
        let id = session.id.clone();
        let old = st.put(&id, Entry::Open(session));
        drop(st);
        drop((reserved, old));
    }

    /// The open session `id`, or what the table knows of it instead.
    pub(super) fn open(&self, caller: &Caller, id: &str) -> Result<Arc<Session>, Miss> {
        let st = self.lock();
        let Some(e) = st.get(id).filter(|e| e.owner() == caller) else {
            return Err(Miss::Unknown);
        };
        match e {
            Entry::Open(s) => Ok(s.clone()),
            Entry::Starting { .. } => Err(Miss::Starting),
            Entry::Ended(e) => Err(Miss::Ended(e.how.clone())),
            Entry::Suspended(s) => Err(Miss::Suspended(Box::new(s.journal.clone()))),
        }
    }

    /// The open sessions (of `of`, when given): a copy, no lock held while they are used.
    pub(super) fn open_sessions(&self, of: Option<&Caller>) -> Vec<Arc<Session>> {
        self.read(|st| {
            st.open()
                .filter(|s| of.is_none_or(|c| s.owner == *c))
                .cloned()
                .collect()
        })
    }

    /// The caller's suspended session `id`: what lists need of its journal.
    pub(super) fn suspended(&self, caller: &Caller, id: &str) -> Option<Journaled> {
        self.read(|st| match st.get(id) {
            Some(Entry::Suspended(s)) if s.journal.owner == *caller => Some(s.journal.clone()),
            _ => None,
        })
    }

    /// The directory and uid of the caller's ended session `id`, while its files are kept.
    pub(super) fn kept_files(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Option<(Arc<OwnedFd>, Option<u32>)> {
        self.read(|st| {
            let e = st.get(id).filter(|e| e.owner() == caller)?;
            let k = e.kept().filter(|k| k.has_files())?;
            Some((k.cwd_fd.clone(), k.uid))
        })
    }

    /// Record that `session` ended (the first reason wins; false if it had ended already):
    /// it leaves the open ones, and its share goes back. Ended sessions past the cap are
    /// forgotten, oldest first.
    pub(super) fn end(&self, session: &Session, how: End) -> (bool, Leaving) {
        if !session.end(how.clone()) {
            return (false, Leaving(Vec::new()));
        }
        let mut leaving = Vec::new();
        let mut open = None;
        {
            let mut st = self.lock();
            let ours = matches!(st.get(&session.id),
                Some(Entry::Open(s)) if std::ptr::eq(s.as_ref(), session));
            if ours {
                let seq = st.next_seq;
                st.next_seq += 1;
                let ended = Entry::Ended(Ended {
                    owner: session.owner.clone(),
                    how,
                    seq,
                    kept: None,
                });
                open = st.put(&session.id, ended);
                while st.ended.len() > self.remember {
                    let Some(oldest) = st.ended.oldest().map(str::to_string) else {
                        break;
                    };
                    if let Some(Entry::Ended(e)) = st.take(&oldest) {
                        leaving.extend(e.kept);
                    }
                }
            }
        }
        drop(open);
        // Its share goes back with its place in the table: what it keeps after it ended
        // (files, their uid) is reclaimed when a uid is needed.
        drop(lock(&session.share).take());
        (true, Leaving(leaving))
    }

    /// [`end`](Self::end), releasing in the background what it forgot.
    pub(super) fn mark_ended(&self, session: &Session, how: End) -> bool {
        let (first, leaving) = self.end(session, how);
        if !leaving.0.is_empty() {
            tokio::spawn(leaving.release());
        }
        first
    }

    /// Keep what an ended session leaves (its files and history) beside its entry; past
    /// the cap the oldest kept go. Returned to be released when its entry is gone (or
    /// restored) meanwhile, or when it was kept already.
    pub(super) fn keep(&self, id: &str, kept: Kept) -> Leaving {
        let mut st = self.lock();
        let slot = match st.entries.get_mut(id).and_then(Entry::kept_mut) {
            Some(slot) if slot.is_none() => slot,
            _ => return Leaving(vec![kept]),
        };
        *slot = Some(kept);
        let seq = st.entries.get(id).and_then(entry_seq).unwrap_or(0);
        st.kept.insert(seq, id);
        let mut leaving = Vec::new();
        while st.kept.len() > self.keep {
            let Some(oldest) = st.kept.oldest().map(str::to_string) else {
                break;
            };
            leaving.extend(st.take_kept(&oldest));
        }
        Leaving(leaving)
    }

    /// An ended session whose journal is kept becomes restorable.
    pub(super) fn suspend(&self, journal: Journaled) {
        let mut st = self.lock();
        let id = journal.id.clone();
        let ended = match st.take(&id) {
            Some(Entry::Ended(e)) => Some(e),
            Some(other) => {
                // Restored or started again meanwhile: it is not suspended.
                st.put(&id, other);
                return;
            }
            None => None,
        };
        st.put(&id, Entry::Suspended(Suspended { journal, ended }));
    }

    /// A journal read at start: its session is restorable.
    pub(super) fn load(&self, journal: Journaled) {
        let id = journal.id.clone();
        self.lock().put(
            &id,
            Entry::Suspended(Suspended {
                journal,
                ended: None,
            }),
        );
    }

    /// The caller's suspended session `id` no longer restorable (its journal deleted, or
    /// too old): it is an ended one again when it ended here, else forgotten. Its journal.
    pub(super) fn unsuspend(&self, caller: Option<&Caller>, id: &str) -> Option<Journaled> {
        let mut st = self.lock();
        let ok = matches!(st.get(id), Some(Entry::Suspended(s)) if caller.is_none_or(|c| s.journal.owner == *c));
        if !ok {
            return None;
        }
        let Some(Entry::Suspended(s)) = st.take(id) else {
            return None;
        };
        if let Some(e) = s.ended {
            st.put(id, Entry::Ended(e));
        }
        Some(s.journal)
    }

    /// Take what is kept of `id` out (a restore supersedes it).
    pub(super) fn take_kept(&self, id: &str) -> Option<Kept> {
        let mut st = self.lock();
        if let Some(Entry::Starting {
            from: Some(Suspended { ended: Some(e), .. }),
            ..
        }) = st.entries.get_mut(id)
        {
            return e.kept.take();
        }
        st.take_kept(id)
    }

    /// What is kept past `now`: taken out, to be released.
    pub(super) fn expire(&self, now: SystemTime) -> Leaving {
        let mut st = self.lock();
        let expired: Vec<String> = st
            .kept
            .ids()
            .filter(|id| {
                st.get(id)
                    .and_then(Entry::kept)
                    .is_some_and(|k| k.until <= now)
            })
            .map(str::to_string)
            .collect();
        Leaving(expired.iter().filter_map(|id| st.take_kept(id)).collect())
    }

    /// Everything kept (server shutdown).
    pub(super) fn take_all_kept(&self) -> Leaving {
        let mut st = self.lock();
        let all: Vec<String> = st.kept.ids().map(str::to_string).collect();
        Leaving(all.iter().filter_map(|id| st.take_kept(id)).collect())
    }

    /// The files of the oldest kept session that `f` accepts, taken out (its history
    /// stays): its uid is needed.
    pub(super) fn reclaim_files(
        &self,
        f: impl Fn(&Caller, &Kept) -> bool,
    ) -> Option<(String, Footprint)> {
        let mut st = self.lock();
        let id = st
            .kept
            .ids()
            .find(|id| {
                st.get(id)
                    .is_some_and(|e| e.kept().is_some_and(|k| f(e.owner(), k)))
            })?
            .to_string();
        let kept = st.entries.get_mut(&id)?.kept_mut()?.as_mut()?;
        kept.files.take().map(|f| (id, f))
    }
}

/// What the table knows of an id that is not an open session of the caller.
pub(super) enum Miss {
    Unknown,
    Starting,
    Ended(End),
    Suspended(Box<Journaled>),
}

/// A reserved start: released (the reservation dropped, a restored entry put back) unless
/// the session enters the table.
pub(super) struct Slot<'a> {
    table: &'a Table,
    pub(super) id: String,
    share: Option<Share>,
    armed: bool,
}

impl Slot<'_> {
    /// The share this slot holds, for the session to hold until it ends.
    pub(super) fn share(&mut self) -> Option<Share> {
        self.share.take()
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut st = self.table.lock();
        if let Some(Entry::Starting { .. }) = st.get(&self.id)
            && let Some(Entry::Starting {
                from: Some(back), ..
            }) = st.take(&self.id)
        {
            st.put(&self.id, Entry::Suspended(back));
        }
    }
}
