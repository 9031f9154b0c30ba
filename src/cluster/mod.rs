//! Several servers as one (`--cluster`): a registry (etcd) says which node holds which
//! session, and journals on a shared filesystem let another node adopt the sessions of a
//! node that died. A leaf below `session`: it knows keys, leases and node ids, not sessions.
//!
//! Each node holds a lease ([`LEASE_TTL`]) renewed every [`RENEW_EVERY`] and registers
//! `nodes/<id>` under it; each session is `sessions/<id>` under its owner's lease, created
//! only where absent (a compare-and-swap), so its key vanishes with its owner and exactly
//! one node can claim it afterwards. A node that cannot renew its lease in time stops
//! serving its sessions' evaluations ([`Cluster::fenced`]) before others may adopt them.

pub mod etcd;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How long a node's lease lives without renewal: its sessions are adoptable this long
/// after it died.
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// How often the lease is renewed.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);
/// A node stops evaluating when its last renewal is older than the TTL less this margin,
/// so it has stopped before the registry lets another node adopt.
const FENCE_MARGIN: Duration = Duration::from_millis(1500);

/// The cluster flags (a leaf: `config` flattens them into the server's settings).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClusterFlags {
    /// Join a cluster of replbox servers coordinated by etcd: its client URLs
    /// (`http://host:2379`, comma-separated). Needs --http and --state-dir SHARED/NODE-ID on
    /// a filesystem every node shares. See docs/cluster.md.
    #[arg(
        long,
        env = "REPLBOX_CLUSTER",
        value_name = "URL[,URL]",
        value_delimiter = ','
    )]
    pub cluster: Vec<String>,

    /// This node's name in the cluster (default: the host name); the last component of
    /// --state-dir.
    #[arg(long, env = "REPLBOX_NODE_ID", value_name = "ID")]
    pub node_id: Option<String>,
}

impl ClusterFlags {
    /// The same flags on a command line.
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        if !self.cluster.is_empty() {
            args.push("--cluster".into());
            args.push(self.cluster.join(",").into());
        }
        if let Some(id) = &self.node_id {
            args.push("--node-id".into());
            args.push(id.into());
        }
        args
    }
}

/// What the registry holds for a session: never a token, only the principal's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub node: String,
    pub principal: String,
    /// Adopted eagerly, not asked for yet: another node the owner's calls reach may take
    /// it over ([`Cluster::take_over`]) until its holder restores it ([`Cluster::activate`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspended: bool,
    /// The registry's revision of the claim (its key's last write): it grows with every
    /// claim, so a journal line of an older one is a former owner's.
    #[serde(skip)]
    pub generation: i64,
    /// The lease the claim is bound to.
    #[serde(skip)]
    pub lease: i64,
}

/// A key's value as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub value: Vec<u8>,
    /// The revision that created the key.
    pub create_revision: i64,
    /// The revision that wrote it last.
    pub mod_revision: i64,
    /// The lease it is bound to (0: none).
    pub lease: i64,
}

/// A registry's answer, boxed so the trait has implementations chosen at run time.
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = anyhow::Result<T>> + Send + 'a>>;

/// The few operations a coordination store must offer: leases and keys bound to them,
/// created only where absent. etcd implements it ([`etcd::Etcd`]); a Kubernetes `Lease`
/// backend can follow.
pub trait Registry: Send + Sync {
    /// A new lease of `ttl`: its id.
    fn grant(&self, ttl: Duration) -> Fut<'_, i64>;
    /// Renew a lease; `false` when it is gone (expired or revoked).
    fn keep_alive(&self, lease: i64) -> Fut<'_, bool>;
    /// End a lease now: its keys go with it.
    fn revoke(&self, lease: i64) -> Fut<'_, ()>;
    /// Put `key` under `lease`, whatever was there.
    fn put(&self, key: String, value: Vec<u8>, lease: i64) -> Fut<'_, ()>;
    /// The value of `key`, if any.
    fn get(&self, key: String) -> Fut<'_, Option<Kv>>;
    /// Create `key` under `lease` only where it does not exist: the revision of the
    /// creation, or `None` when it exists.
    fn create(&self, key: String, value: Vec<u8>, lease: i64) -> Fut<'_, Option<i64>>;
    /// Delete `key` if it is held under `lease`.
    fn delete_held(&self, key: String, lease: i64) -> Fut<'_, ()>;
    /// Put `key` under `lease` only where its last write was at `revision` (a
    /// compare-and-swap): the revision of the write, or `None` when it changed meanwhile.
    fn replace(
        &self,
        key: String,
        value: Vec<u8>,
        lease: i64,
        revision: i64,
    ) -> Fut<'_, Option<i64>>;
    /// The keys that start with `prefix`.
    fn keys(&self, prefix: String) -> Fut<'_, Vec<String>>;
}

/// A node id: a file name on the shared filesystem and a registry key, so 1-64 of
/// `A-Z a-z 0-9 - _ .`, not starting with a dot.
pub fn check_node_id(id: &str) -> anyhow::Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        anyhow::bail!(
            "--node-id {id:?}: a node id is 1-64 characters of A-Z a-z 0-9 - _ . (not starting \
with a dot)"
        )
    }
}

/// The host's name, the default node id.
fn hostname() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    Ok(name.trim().to_string())
}

/// This node in its cluster: its id, the shared directory of every node's journals, the
/// registry and its lease.
pub struct Cluster {
    pub node: String,
    /// The directory every node's state directory is in (`SHARED/<node-id>`).
    pub shared: PathBuf,
    registry: Box<dyn Registry>,
    /// The lease held now; 0 while none is.
    lease: AtomicI64,
    /// When the last renewal that succeeded was sent.
    renewed: Mutex<Instant>,
    /// Held while a lease is taken, so that two joins never hold two leases.
    joining: tokio::sync::Mutex<()>,
    /// Held while a session is adopted here (eagerly, or by a call), so that a call never
    /// races this node's own eager adoption of the session it names.
    pub adopting: tokio::sync::Mutex<()>,
}

impl Cluster {
    /// The node of these flags, with `state_dir` its own directory on the shared
    /// filesystem; `None` without --cluster. Nothing is contacted yet ([`Cluster::join`]).
    pub fn new(flags: &ClusterFlags, state_dir: Option<&Path>) -> anyhow::Result<Option<Self>> {
        if flags.cluster.is_empty() {
            if flags.node_id.is_some() {
                anyhow::bail!("--node-id needs --cluster");
            }
            return Ok(None);
        }
        let node = match &flags.node_id {
            Some(id) => id.clone(),
            None => hostname()?,
        };
        check_node_id(&node)?;
        let Some(dir) = state_dir else {
            anyhow::bail!(
                "--cluster needs --state-dir SHARED/{node}: the journals other nodes adopt \
sessions from, on a filesystem every node shares"
            );
        };
        let shared = match (dir.file_name(), dir.parent()) {
            (Some(name), Some(parent)) if name == node.as_str() => parent.to_path_buf(),
            _ => anyhow::bail!(
                "--cluster: --state-dir must be SHARED/{node} (its last component the node id), \
not {}",
                dir.display()
            ),
        };
        let registry = etcd::Etcd::new(&flags.cluster)?;
        Ok(Some(Self {
            node,
            shared,
            registry: Box::new(registry),
            lease: AtomicI64::new(0),
            renewed: Mutex::new(Instant::now()),
            joining: tokio::sync::Mutex::new(()),
            adopting: tokio::sync::Mutex::new(()),
        }))
    }

    /// Take a lease and register this node under it (nothing when one is held).
    pub async fn join(&self) -> anyhow::Result<()> {
        let _one = self.joining.lock().await;
        if self.lease.load(Ordering::SeqCst) != 0 {
            return Ok(());
        }
        let sent = Instant::now();
        let lease = self.registry.grant(LEASE_TTL).await?;
        self.registry
            .put(node_key(&self.node), Vec::new(), lease)
            .await?;
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = sent;
        self.lease.store(lease, Ordering::SeqCst);
        tracing::info!(node = %self.node, lease, "joined the cluster");
        Ok(())
    }

    /// Renew the lease once. `Ok(false)`: it was gone, every session this node held may
    /// have been adopted elsewhere, and none is held now (fenced) until [`Cluster::join`].
    pub async fn renew(&self) -> anyhow::Result<bool> {
        let lease = self.lease.load(Ordering::SeqCst);
        if lease == 0 {
            // Not joined yet (the registry was out of reach at start): nothing was held.
            self.join().await?;
            return Ok(true);
        }
        let sent = Instant::now();
        if self.registry.keep_alive(lease).await? {
            *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = sent;
            return Ok(true);
        }
        self.lease.store(0, Ordering::SeqCst);
        tracing::error!(node = %self.node, "the cluster lease was lost: this node's sessions may be adopted by others");
        Ok(false)
    }

    /// The lease held now (0: none): a new one means a new membership.
    pub fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::SeqCst)
    }

    /// Whether this node may not have its lease any more: then it serves none of its
    /// sessions' evaluations, since another node may adopt them.
    pub fn fenced(&self) -> bool {
        self.lease.load(Ordering::SeqCst) == 0
            || self
                .renewed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed()
                > LEASE_TTL.saturating_sub(FENCE_MARGIN)
    }

    /// Whether a claim made under `lease` is still this node's to act on: the lease is the
    /// one held and not possibly expired. Checked before every journal append.
    pub fn holds(&self, lease: i64) -> bool {
        lease != 0 && self.lease.load(Ordering::SeqCst) == lease && !self.fenced()
    }

    /// Leave: revoke the lease, so other nodes may adopt this node's sessions at once.
    pub async fn leave(&self) {
        let lease = self.lease.swap(0, Ordering::SeqCst);
        if lease != 0 {
            match self.registry.revoke(lease).await {
                Ok(()) => tracing::info!(node = %self.node, "left the cluster"),
                Err(e) => tracing::warn!(node = %self.node, "cannot revoke the lease: {e}"),
            }
        }
    }

    /// Who holds session `id` (`None`: no live node does).
    pub async fn owner(&self, id: &str) -> anyhow::Result<Option<Record>> {
        let Some(kv) = self.registry.get(session_key(id)).await? else {
            return Ok(None);
        };
        let mut record: Record = serde_json::from_slice(&kv.value).map_err(|e| {
            anyhow::anyhow!("the registry's record of session {id} is not readable: {e}")
        })?;
        record.generation = kv.mod_revision;
        record.lease = kv.lease;
        Ok(Some(record))
    }

    /// Claim session `id` for this node where no live node holds it: the record written, or
    /// `None` when another node holds it.
    pub async fn claim(&self, id: &str, principal: &str) -> anyhow::Result<Option<Record>> {
        self.claim_as(id, principal, false).await
    }

    /// [`Cluster::claim`], marked `suspended` when it is an eager adoption.
    pub async fn claim_as(
        &self,
        id: &str,
        principal: &str,
        suspended: bool,
    ) -> anyhow::Result<Option<Record>> {
        let lease = self.lease()?;
        let mut record = Record {
            node: self.node.clone(),
            principal: principal.to_string(),
            suspended,
            generation: 0,
            lease,
        };
        let value = serde_json::to_vec(&record)?;
        let Some(rev) = self.registry.create(session_key(id), value, lease).await? else {
            return Ok(None);
        };
        record.generation = rev;
        Ok(Some(record))
    }

    /// Take session `id` over from the node that adopted it eagerly (`held` is its record,
    /// `suspended`): the record written, or `None` when it changed meanwhile (restored
    /// there, or taken by another node).
    pub async fn take_over(&self, id: &str, held: &Record) -> anyhow::Result<Option<Record>> {
        let lease = self.lease()?;
        self.rewrite(id, held, lease).await
    }

    /// Session `id`, adopted here eagerly (`held`), is being restored: no other node may
    /// take it over any more. `false` when one did meanwhile.
    pub async fn activate(&self, id: &str, held: &Record) -> anyhow::Result<bool> {
        Ok(self.rewrite(id, held, held.lease).await?.is_some())
    }

    async fn rewrite(&self, id: &str, held: &Record, lease: i64) -> anyhow::Result<Option<Record>> {
        let mut record = Record {
            node: self.node.clone(),
            principal: held.principal.clone(),
            suspended: false,
            generation: 0,
            lease,
        };
        let value = serde_json::to_vec(&record)?;
        let Some(rev) = self
            .registry
            .replace(session_key(id), value, lease, held.generation)
            .await?
        else {
            return Ok(None);
        };
        record.generation = rev;
        Ok(Some(record))
    }

    /// The nodes that hold a lease now, this one among them.
    pub async fn live_nodes(&self) -> anyhow::Result<std::collections::BTreeSet<String>> {
        let prefix = node_key("");
        let mut live: std::collections::BTreeSet<String> = self
            .registry
            .keys(prefix.clone())
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_string))
            .collect();
        live.insert(self.node.clone());
        Ok(live)
    }

    /// Give session `id` up (it was closed, or a start failed).
    pub async fn release(&self, id: &str) {
        let lease = self.lease.load(Ordering::SeqCst);
        if lease == 0 {
            return;
        }
        if let Err(e) = self.registry.delete_held(session_key(id), lease).await {
            tracing::warn!(session = %id, "cannot remove the session from the cluster registry: {e}");
        }
    }

    fn lease(&self) -> anyhow::Result<i64> {
        match self.lease.load(Ordering::SeqCst) {
            0 => anyhow::bail!("this node holds no cluster lease now"),
            l => Ok(l),
        }
    }
}

/// The node of `live` that adopts a dead node's sessions of `principal`: the highest of a
/// hash of (principal, node), rendezvous hashing. Every node computes the same answer from
/// the same live set without asking anyone; a principal's sessions stay together; a node
/// dying moves only the principals it was chosen for. A stable hash (SHA-256), so nodes of
/// different builds agree.
pub fn heir<'a>(principal: &str, live: impl IntoIterator<Item = &'a String>) -> Option<&'a str> {
    use sha2::Digest;
    live.into_iter()
        .map(|node| {
            let mut h = sha2::Sha256::new();
            h.update(principal.as_bytes());
            h.update([0u8]);
            h.update(node.as_bytes());
            let d = h.finalize();
            let mut score = [0u8; 8];
            score.copy_from_slice(&d[..8]);
            (u64::from_be_bytes(score), node)
        })
        .max()
        .map(|(_, node)| node.as_str())
}

fn node_key(node: &str) -> String {
    format!("replbox/nodes/{node}")
}

fn session_key(id: &str) -> String {
    format!("replbox/sessions/{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_principal_has_one_heir_and_a_death_moves_only_its_own() {
        let nodes: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let principals: Vec<String> = (0..200).map(|i| format!("p{i}")).collect();
        let mut counts = [0usize; 3];
        for p in &principals {
            let h = heir(p, &nodes).unwrap();
            // The same answer in any order.
            assert_eq!(heir(p, nodes.iter().rev()), Some(h));
            counts[nodes.iter().position(|n| n == h).unwrap()] += 1;
            // Without c, only c's principals move.
            let without_c: Vec<String> = nodes[..2].to_vec();
            let h2 = heir(p, &without_c).unwrap();
            if h != "c" {
                assert_eq!(h2, h, "{p}");
            }
        }
        assert!(counts.iter().all(|&c| c > 30), "spread: {counts:?}");
        assert_eq!(heir("p", &Vec::<String>::new()), None);
    }

    #[test]
    fn node_ids_are_names_not_paths() {
        for bad in ["", "..", ".x", "a/b", "a b", &"x".repeat(65), "é"] {
            assert!(check_node_id(bad).is_err(), "{bad:?}");
        }
        for good in ["node-1", "replbox-0.eu", "A_b"] {
            check_node_id(good).unwrap();
        }
    }

    #[test]
    fn the_state_dir_must_be_shared_slash_node_id() {
        let flags = |id: &str| ClusterFlags {
            cluster: vec!["http://127.0.0.1:1".into()],
            node_id: Some(id.into()),
        };
        let c = Cluster::new(&flags("n1"), Some(Path::new("/s/n1")))
            .unwrap()
            .unwrap();
        assert_eq!(c.shared, Path::new("/s"));
        let e = Cluster::new(&flags("n1"), Some(Path::new("/s/other")))
            .err()
            .unwrap();
        assert!(e.to_string().contains("SHARED/n1"), "{e}");
        assert!(Cluster::new(&flags("n1"), None).is_err());
        assert!(Cluster::new(&flags("../x"), Some(Path::new("/s/../x"))).is_err());
        let none = ClusterFlags {
            cluster: vec![],
            node_id: Some("n".into()),
        };
        assert!(Cluster::new(&none, None).is_err());
    }
}
