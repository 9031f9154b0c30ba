//! Sessions of a cluster (`--cluster`): each one claimed in the registry by the node that
//! holds it; a call naming a session no live node holds adopts it here from its journal on
//! the shared filesystem (claimed first, then moved into this node's state directory, then
//! suspended: the first evaluation replays it). See docs/cluster.md.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use super::journal::{self, Journaled};
use super::live::{End, Session};
use super::manager::SessionManager;
use super::table::Entry;
use crate::cluster::{Cluster, RENEW_EVERY, Record, check_node_id, heir};
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;

/// Why a claimed session's journal could not be taken over (the server's own failure).
#[derive(Debug, thiserror::Error)]
enum TakeError {
    #[error("cannot move {} to {}: {error}", from.display(), to.display())]
    Move {
        from: PathBuf,
        to: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot write {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error("{0}")]
    Join(tokio::task::JoinError),
}

fn unavailable(why: impl std::fmt::Display) -> ToolError {
    tracing::warn!("cluster: {why}");
    ToolError::new(
        ErrorKind::Unavailable,
        "this server cannot reach its cluster registry now, so it cannot tell who holds this \
session. Try again in a few seconds.",
    )
}

fn elsewhere(id: &str) -> ToolError {
    ToolError::new(
        ErrorKind::SessionElsewhere,
        format!(
            "session {id} is held by another server of this cluster: send the call to the server \
your requests are routed to (the same token reaches the same server), or try again later."
        ),
    )
    .session(id)
}

fn taking_over(id: &str) -> ToolError {
    ToolError::new(
        ErrorKind::Busy,
        format!(
            "session {id} is being taken over by a server of this cluster. Try again in a moment."
        ),
    )
    .session(id)
}

impl SessionManager {
    /// Join this manager to its cluster: journals read at start are left to adoption (this
    /// node claims them like any other when they are asked for), and the lease is renewed
    /// in the background for as long as the manager lives.
    pub fn set_cluster(self: &Arc<Self>, cluster: Arc<Cluster>) {
        let loaded: Vec<String> = self.table.read(|st| {
            st.entries()
                .filter(|(_, e)| matches!(e, Entry::Suspended(_)))
                .map(|(id, _)| id.clone())
                .collect()
        });
        for id in loaded {
            self.table.unsuspend(None, &id);
        }
        if self.cluster.set(cluster).is_err() {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(Self::watch_nodes(weak.clone()));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RENEW_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(me) = weak.upgrade() else { return };
                let Some(cluster) = me.cluster.get() else {
                    return;
                };
                match cluster.renew().await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Fenced (no lease) until every session it held is stopped here: a
                        // call between a new lease and their end would run on a session
                        // another node may hold.
                        me.lease_lost().await;
                        if let Err(e) = cluster.join().await {
                            tracing::warn!("cluster: cannot take a new lease yet: {e}");
                        }
                    }
                    Err(e) => tracing::warn!("cluster: cannot renew the lease: {e}"),
                }
            }
        });
    }

    /// Eager adoption: every [`RENEW_EVERY`], the live nodes; when one has gone (its lease
    /// expired or revoked), and once after joining, the sessions left in the directories of
    /// nodes that are not live are adopted here as suspended, those whose principal's
    /// [`heir`] this node is. A task of its own, so that a long sweep never delays renewal.
    async fn watch_nodes(weak: Weak<Self>) {
        let mut tick = tokio::time::interval(RENEW_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut known: Option<BTreeSet<String>> = None;
        let mut lease = 0;
        loop {
            tick.tick().await;
            let Some(me) = weak.upgrade() else { return };
            let Some(cluster) = me.cluster.get().cloned() else {
                return;
            };
            if cluster.fenced() {
                continue;
            }
            let live = match cluster.live_nodes().await {
                Ok(live) => live,
                Err(e) => {
                    tracing::warn!("cluster: cannot list the live nodes: {e}");
                    continue;
                }
            };
            // A new lease (the first, or after one was lost): this node's own journals
            // were left to adoption too.
            let joined = cluster.lease_id() != lease;
            let gone = known
                .as_ref()
                .is_some_and(|k| k.iter().any(|n| !live.contains(n)));
            if joined || gone {
                lease = cluster.lease_id();
                me.sweep(&cluster, &live, joined).await;
            }
            known = Some(live);
        }
    }

    /// Adopt as suspended the sessions whose journals are in the directories of nodes not
    /// in `live` (and in this node's own, `own`: journals of its former run), held by no
    /// node, whose principal's heir is this node. Each is claimed first (exactly one node
    /// wins), then its journal is moved here.
    async fn sweep(&self, cluster: &Arc<Cluster>, live: &BTreeSet<String>, own: bool) {
        let (shared, mine, live_) = (cluster.shared.clone(), cluster.node.clone(), live.clone());
        let found = tokio::task::spawn_blocking(move || left_journals(&shared, &mine, &live_, own))
            .await
            .unwrap_or_default();
        let mut adopted = 0usize;
        for (id, path) in found {
            if cluster.fenced() {
                return;
            }
            let _one = cluster.adopting.lock().await;
            if self.table.read(|st| st.get(&id).is_some()) {
                continue;
            }
            match cluster.owner(&id).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(e) => {
                    tracing::warn!("cluster: eager adoption stopped: {e}");
                    return;
                }
            }
            let (id_, max) = (id.clone(), self.journals.max());
            let owner = tokio::task::spawn_blocking(move || {
                journal::read(&path, &id_, max).ok().map(|j| j.owner)
            })
            .await
            .ok()
            .flatten();
            let Some(owner) = owner else { continue };
            if heir(&owner, live) != Some(cluster.node.as_str()) {
                continue;
            }
            let record = match cluster.claim_as(&id, &owner, true).await {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!("cluster: eager adoption stopped: {e}");
                    return;
                }
            };
            if self
                .take_journal(cluster, &owner, &id, &record)
                .await
                .is_ok()
            {
                adopted += 1;
            }
        }
        if adopted > 0 {
            tracing::info!(node = %cluster.node, adopted, "adopted a dead node's sessions as suspended");
        }
    }

    /// Before `session_list`: the caller's suspended sessions another node has taken over
    /// since they were adopted here are no longer listed (nor held) here.
    pub async fn cluster_prune(&self, caller: &Caller) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        let ids: Vec<String> = self.table.read(|st| {
            st.entries()
                .filter(|(_, e)| matches!(e, Entry::Suspended(_)) && e.owner() == caller)
                .map(|(id, _)| id.clone())
                .collect()
        });
        for id in ids {
            if let Ok(Some(r)) = cluster.owner(&id).await
                && r.node != cluster.node
            {
                self.table.unsuspend(Some(caller), &id);
            }
        }
    }

    /// The lease was lost: other nodes may have adopted this node's sessions. The open ones
    /// are ended here (handed over: a call in flight answers `unavailable`), their journals
    /// sealed as they are, their interpreters killed and their directories removed (an
    /// adoption here starts one again under the same id), and everything is left to
    /// adoption.
    async fn lease_lost(&self) {
        let mut stops = tokio::task::JoinSet::new();
        for s in self.table.open_sessions(None) {
            // Ended first, then sealed: a cell journaled before the seal is answered, one
            // refused by it is not (see `handover_error`).
            let first = self.table.mark_ended(&s, End::HandedOver);
            if let Some(w) = &s.journal {
                w.seal();
            }
            if first {
                stops.spawn(super::end::stop_handed_over(s));
            }
        }
        while stops.join_next().await.is_some() {}
        let suspended: Vec<String> = self.table.read(|st| {
            st.entries()
                .filter(|(_, e)| matches!(e, Entry::Suspended(_)))
                .map(|(id, _)| id.clone())
                .collect()
        });
        for id in suspended {
            self.table.unsuspend(None, &id);
        }
    }

    /// A new session's claim in the cluster (a no-op without one); on failure the session
    /// is closed again.
    pub(super) async fn claim_new(&self, caller: &Caller, id: &str) -> Result<(), ToolError> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(());
        };
        let claimed = cluster.claim(id, &caller.principal).await;
        let session = self.table.open(caller, id).ok();
        let written = match (&claimed, &session) {
            (Ok(Some(r)), Some(s)) => match s.journal.clone() {
                Some(w) => {
                    let (node, lease, claim) =
                        (cluster.node.clone(), r.lease, claim_of(cluster, r));
                    tokio::task::spawn_blocking(move || w.claim(&node, lease, claim))
                        .await
                        .map_err(std::io::Error::other)
                        .and_then(|r| r)
                        .map_err(|e| format!("cannot write the session's journal: {e}"))
                }
                None => Ok(()),
            },
            (Ok(Some(_)), None) => Ok(()),
            (Err(e), _) => Err(format!("{e}")),
            (Ok(None), _) => Err("a new session id is held in the cluster already".into()),
        };
        let Err(why) = written else { return Ok(()) };
        if let Some(session) = session {
            self.end(session, End::Closed).await;
        }
        if let Ok(Some(_)) = claimed {
            cluster.release(id).await;
        }
        Err(match claimed {
            Err(_) => unavailable(why),
            _ => ToolError::internal(why),
        })
    }

    /// Before any call on session `id`: refuse while fenced (this node may have lost its
    /// lease); adopt it when no live node holds it and its journal is the caller's; say so
    /// when another node holds it. Without a cluster, nothing.
    pub(super) async fn cluster_gate(&self, caller: &Caller, id: &str) -> Result<(), ToolError> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(());
        };
        if cluster.fenced() {
            return Err(ToolError::new(
                ErrorKind::Unavailable,
                "this server lost contact with its cluster registry: it serves no session until \
it is back (another server may take its sessions over). Try again in a few seconds.",
            )
            .session(id));
        }
        // Only a session id names a journal: anything else is unknown, no file looked at.
        let (here_now, suspended) = self.presence(caller, id);
        if (here_now && !suspended)
            || (!here_now && uuid::Uuid::parse_str(id).map_or(true, |u| u.to_string() != id))
        {
            return Ok(());
        }
        let _one = cluster.adopting.lock().await;
        let (here, suspended) = self.presence(caller, id);
        if suspended {
            if self.restore_held(cluster, caller, id).await? {
                return Ok(());
            }
        } else if here {
            return Ok(());
        }
        let Some(record) = self.registry_record(cluster, caller, id).await? else {
            return Ok(());
        };
        self.take_journal(cluster, &caller.principal, id, &record)
            .await
    }

    /// Whether `id` is in the table (open or starting, or suspended), and whether it is the
    /// caller's suspended session.
    fn presence(&self, caller: &Caller, id: &str) -> (bool, bool) {
        self.table.read(|st| match st.get(id) {
            Some(Entry::Open(_) | Entry::Starting { .. }) => (true, false),
            // The caller's suspended session may have been adopted here eagerly: checked.
            Some(e @ Entry::Suspended(_)) => (true, e.owner() == caller),
            _ => (false, false),
        })
    }

    /// The caller's suspended session `id`, held in the table: true if it is still this
    /// node's in the registry (restored there if it was adopted eagerly); otherwise it is
    /// unsuspended here and false. Called with `cluster.adopting` held.
    async fn restore_held(
        &self,
        cluster: &Cluster,
        caller: &Caller,
        id: &str,
    ) -> Result<bool, ToolError> {
        // Held here; adopted eagerly, it is restored now, so no other node may take it
        // over any more.
        if let Some(r) = cluster.owner(id).await.map_err(unavailable)?
            && r.node == cluster.node
            && (!r.suspended || cluster.activate(id, &r).await.map_err(unavailable)?)
        {
            return Ok(true);
        }
        // Orphaned again (re-adopted below), or taken over by another node.
        self.table.unsuspend(Some(caller), id);
        Ok(false)
    }

    /// The registry's record of `id`, once this node holds it (taken over or claimed), for
    /// its journal to be taken; `None` if the call goes on without adopting (another
    /// principal's session, or none). Called with `cluster.adopting` held.
    async fn registry_record(
        &self,
        cluster: &Cluster,
        caller: &Caller,
        id: &str,
    ) -> Result<Option<Record>, ToolError> {
        match cluster.owner(id).await.map_err(unavailable)? {
            Some(r) if r.principal != caller.principal => Ok(None),
            // Adopted eagerly by another node and not restored there: its owner's call
            // reached this node, so the session comes here.
            Some(r) if r.node != cluster.node && r.suspended => {
                Ok(Some(take_over_suspended(cluster, id, &r).await?))
            }
            Some(r) if r.node != cluster.node => Err(elsewhere(id)),
            // Ours in the registry, not in the table: adopted from its journal below (and
            // restored now, if it was adopted eagerly).
            Some(r) => {
                if r.suspended && !cluster.activate(id, &r).await.map_err(unavailable)? {
                    return Err(taking_over(id));
                }
                Ok(Some(r))
            }
            None => self.claim_orphan(cluster, caller, id).await,
        }
    }

    /// `id`, in no node's registry, claimed for the caller if its journal is an orphan on
    /// the shared filesystem; `None` if the call goes on without adopting.
    async fn claim_orphan(
        &self,
        cluster: &Cluster,
        caller: &Caller,
        id: &str,
    ) -> Result<Option<Record>, ToolError> {
        let Some(from) = self.orphan(cluster, id, caller).await else {
            // Moved by a node that claimed it meanwhile, or no journal at all.
            return match cluster.owner(id).await.map_err(unavailable)? {
                Some(r) if r.principal != caller.principal => Ok(None),
                Some(r) if r.node != cluster.node => Err(elsewhere(id)),
                Some(_) => Err(taking_over(id)),
                None => Ok(None),
            };
        };
        match cluster.claim(id, &caller.principal).await {
            Ok(Some(r)) => {
                tracing::info!(session = %id, from = %from.display(), generation = r.generation, "adopting a session");
                Ok(Some(r))
            }
            Ok(None) => Err(taking_over(id)),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The journal of `id` on the shared filesystem if it is the caller's session: where it
    /// is, and what it says.
    async fn orphan(&self, cluster: &Cluster, id: &str, caller: &Caller) -> Option<PathBuf> {
        let (shared, mine, id_, max) = (
            cluster.shared.clone(),
            cluster.node.clone(),
            id.to_string(),
            self.journals.max(),
        );
        let caller_ = caller.principal.clone();
        tokio::task::spawn_blocking(move || {
            let path = find_journal(&shared, &mine, &id_)?;
            let j = journal::read(&path, &id_, max).ok()?;
            (j.owner == caller_).then_some(path)
        })
        .await
        .ok()?
    }

    /// Move the claimed session's journal into this node's state directory (wherever an
    /// earlier adopter left it) and make it a suspended session here.
    async fn take_journal(
        &self,
        cluster: &Arc<Cluster>,
        principal: &str,
        id: &str,
        record: &Record,
    ) -> Result<(), ToolError> {
        let Some(dest) = self.journals.path_of(id) else {
            return Ok(());
        };
        let (shared, mine, id_, max) = (
            cluster.shared.clone(),
            cluster.node.clone(),
            id.to_string(),
            self.journals.max(),
        );
        let (lease, generation, claim) =
            (record.lease, record.generation, claim_of(cluster, record));
        let moved =
            tokio::task::spawn_blocking(move || -> Result<Option<journal::Journal>, TakeError> {
                let Some(from) = find_journal(&shared, &mine, &id_) else {
                    return Ok(None);
                };
                if from != dest {
                    std::fs::rename(&from, &dest).map_err(|error| TakeError::Move {
                        from,
                        to: dest.clone(),
                        error,
                    })?;
                }
                let j = journal::read(&dest, &id_, max)?;
                // The claim's line: from here on, a former owner's appends are ignored.
                let claimed = j
                    .claim
                    .as_ref()
                    .is_some_and(|(n, g, _)| *n == mine && *g == generation);
                if claimed {
                    return Ok(Some(j));
                }
                let full = j.full_at.is_some();
                journal::Writer::reopen(&dest, max, full)
                    .and_then(|w| w.claim(&mine, lease, claim))
                    .map_err(|error| TakeError::Write {
                        path: dest.clone(),
                        error,
                    })?;
                journal::read(&dest, &id_, max)
                    .map(Some)
                    .map_err(TakeError::from)
            })
            .await
            .unwrap_or_else(|e| Err(TakeError::Join(e)));
        match moved {
            Ok(Some(j)) if j.owner == principal => {
                let path = self.journals.path_of(id).unwrap_or_default();
                self.table.load(Journaled::of(&j, path));
                Ok(())
            }
            Ok(_) => {
                cluster.release(id).await;
                Ok(())
            }
            Err(why) => {
                cluster.release(id).await;
                Err(
                    ToolError::internal(format!("session {id} cannot be taken over: {why}"))
                        .session(id),
                )
            }
        }
    }

    /// The claim a restored session's journal is written under: its last, this node's
    /// (written when it was claimed here). Without a cluster, none.
    pub(super) fn journal_claim(
        &self,
        j: &journal::Journal,
    ) -> Result<Option<journal::Claim>, ToolError> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(None);
        };
        match &j.claim {
            Some((node, generation, lease)) if *node == cluster.node => {
                let r = Record {
                    node: node.clone(),
                    principal: j.owner.clone(),
                    suspended: false,
                    generation: *generation,
                    lease: *lease,
                };
                Ok(Some(claim_of(cluster, &r)))
            }
            _ => Err(unavailable(format!(
                "session {} is not claimed by this node in its journal",
                j.session_id
            ))),
        }
    }

    /// After a call on `session`: when its journal refused the call's line (this node may
    /// have lost the session's claim) or it was handed over while the call ran (its
    /// interpreter killed for that: `exited`), the call's result is not the session's: the
    /// session is stopped here (if it was not) and the caller told to call again, to be
    /// served from the journal, here or on another node.
    pub(super) async fn handed_over(
        &self,
        session: &Arc<Session>,
        exited: bool,
    ) -> Option<ToolError> {
        let refused = session.journal.as_ref().is_some_and(|w| w.refused());
        if refused && self.table.mark_ended(session, End::HandedOver) {
            if let Some(w) = &session.journal {
                w.seal();
            }
            super::end::stop_handed_over(session.clone()).await;
        }
        if !matches!(session.ended(), Some(End::HandedOver)) {
            return None;
        }
        (exited || refused).then(|| session.ended_error())
    }

    /// A session closed: out of the cluster's registry.
    pub(super) async fn cluster_release(&self, id: &str) {
        if let Some(cluster) = self.cluster.get() {
            cluster.release(id).await;
        }
    }

    /// Leave the cluster (shutdown, after the sessions were stopped with their journals
    /// kept): other nodes adopt them without waiting for the lease to expire.
    pub(super) async fn cluster_leave(&self) {
        if let Some(cluster) = self.cluster.get() {
            cluster.leave().await;
        }
    }
}

/// Takes `id` over from the node `r` names, which adopted it eagerly and has not restored
/// it; if that fails, why the call cannot go on here.
async fn take_over_suspended(cluster: &Cluster, id: &str, r: &Record) -> Result<Record, ToolError> {
    match cluster.take_over(id, r).await.map_err(unavailable)? {
        Some(taken) => {
            tracing::info!(session = %id, from = %r.node, generation = taken.generation, "taking a session over");
            Ok(taken)
        }
        None => match cluster.owner(id).await.map_err(unavailable)? {
            Some(r) if r.node != cluster.node => Err(elsewhere(id)),
            _ => Err(taking_over(id)),
        },
    }
}

/// Appends under the claim `r`, refused once this node may have lost it.
fn claim_of(cluster: &Arc<Cluster>, r: &Record) -> journal::Claim {
    let (c, lease) = (cluster.clone(), r.lease);
    journal::Claim {
        generation: r.generation,
        holds: Box::new(move || c.holds(lease)),
    }
}

/// Where the journal of session `id` is among the nodes' directories of `shared` (this
/// node's first); entries that are not plain directories named like a node are skipped,
/// links never followed.
fn find_journal(shared: &Path, mine: &str, id: &str) -> Option<PathBuf> {
    let name = format!("{id}.{}", super::state_dir::SUFFIX);
    let is_file = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file());
    let own = shared.join(mine).join(&name);
    if is_file(&own) {
        return Some(own);
    }
    for e in std::fs::read_dir(shared).ok()?.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let node = e.file_name();
        let Some(node) = node.to_str() else { continue };
        if check_node_id(node).is_err() {
            continue;
        }
        let p = e.path().join(&name);
        if is_file(&p) {
            return Some(p);
        }
    }
    None
}

/// The journals (session id, path) in the directories of `shared` of nodes not in `live`,
/// and in `mine`'s when `own`; entries that are not plain directories named like a node, or
/// plain files named like a session's journal, are skipped, links never followed.
fn left_journals(
    shared: &Path,
    mine: &str,
    live: &BTreeSet<String>,
    own: bool,
) -> Vec<(String, PathBuf)> {
    let suffix = format!(".{}", super::state_dir::SUFFIX);
    let mut out = Vec::new();
    let Ok(nodes) = std::fs::read_dir(shared) else {
        return out;
    };
    for e in nodes.flatten() {
        let name = e.file_name();
        let Some(node) = name.to_str() else { continue };
        let wanted = if node == mine {
            own
        } else {
            !live.contains(node)
        };
        if !wanted || check_node_id(node).is_err() || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(e.path()) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(&suffix)) else {
                continue;
            };
            let is_id = uuid::Uuid::parse_str(id).is_ok_and(|u| u.to_string() == id);
            if is_id && f.file_type().is_ok_and(|t| t.is_file()) {
                out.push((id.to_string(), f.path()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journals_are_found_in_node_directories_only() {
        let d = tempfile::tempdir().unwrap();
        let id = "6f1c2b4e-8a43-4d8e-9d0e-2b9a1c5e7f10";
        for n in ["a", "b", ".hidden"] {
            std::fs::create_dir(d.path().join(n)).unwrap();
        }
        assert_eq!(find_journal(d.path(), "a", id), None);
        std::fs::write(d.path().join(".hidden").join(format!("{id}.journal")), "").unwrap();
        assert_eq!(find_journal(d.path(), "a", id), None);
        // A link to a journal is no journal.
        std::os::unix::fs::symlink(
            d.path().join(".hidden").join(format!("{id}.journal")),
            d.path().join("b").join(format!("{id}.journal")),
        )
        .unwrap();
        assert_eq!(find_journal(d.path(), "a", id), None);
        std::fs::remove_file(d.path().join("b").join(format!("{id}.journal"))).unwrap();
        std::fs::write(d.path().join("b").join(format!("{id}.journal")), "").unwrap();
        assert_eq!(
            find_journal(d.path(), "a", id),
            Some(d.path().join("b").join(format!("{id}.journal")))
        );
    }
}
