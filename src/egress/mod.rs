//! The egress proxy: the only way out of the sandbox when the operator allows any network
//! (`--allow-domain`, `--allow-host`, `--allow-network`). It runs in the server, one listener
//! per run or session (an [`Endpoint`]), so its log says who asked; what it lets through is
//! decided by [`policy`], on the name and on the address it resolves to.
//!
//! At `bwrap` the endpoint is a Unix socket bound into the sandbox, whose network namespace
//! has only loopback: the helper's bridge relays `127.0.0.1:`[`BRIDGE_PORT`] to it. At
//! `landlock` and `none` it is a TCP port on the host's loopback (at `landlock` the only port
//! user code may connect to).
//!
//! An endpoint serves its own run or session only: its program is handed a secret in the
//! proxy URL (`http://replbox:SECRET@127.0.0.1:PORT`, which HTTP clients send as
//! `Proxy-Authorization`), and a connection without it is refused (`407`), however it found
//! the port or the socket.

pub mod policy;
mod proxy;

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinSet};

pub use policy::{EgressError, Policy};

/// The port the bridge listens on inside a sandbox's own network namespace.
pub const BRIDGE_PORT: u16 = 3128;
/// Connections open at once through one endpoint, through the endpoints of one principal,
/// and through the whole server. A principal's share is an eighth of the server's (two
/// endpoints' worth), so one principal's sessions cannot take every connection: it takes
/// eight principals at their caps to fill the server.
const PER_ENDPOINT: usize = 32;
const PER_SERVER: usize = 512;
const PER_PRINCIPAL: usize = PER_SERVER / 8;
/// A connection over which no byte moved either way for this long is closed.
const IDLE: Duration = Duration::from_secs(60);
/// Refusals answered at once per endpoint (each reads the request head first, briefly);
/// past that a connection over the caps is closed without an answer.
const REFUSING: usize = 4;

/// The server's proxy: the policy, this host's addresses, where endpoints' sockets live.
#[derive(Debug)]
pub struct Egress {
    policy: Policy,
    own: Arc<Vec<IpAddr>>,
    dir: PathBuf,
    total: Arc<Semaphore>,
    /// Each principal's connections (one entry per principal ever seen: bounded by the
    /// operator's tokens).
    principals: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// One run's or session's way to the proxy; closing it (dropping) stops its listener and
/// every connection through it.
pub struct Endpoint {
    /// The Unix socket (bwrap), else None.
    pub socket: Option<PathBuf>,
    /// The TCP port user code connects to on 127.0.0.1 (inside the sandbox's namespace for a
    /// socket).
    pub port: u16,
    /// What the endpoint's own program presents, and nobody else knows.
    secret: String,
    task: AbortHandle,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("socket", &self.socket)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// The proxy URL for the endpoint's own program (its proxy variables), credentials
    /// included.
    pub fn proxy_url(&self) -> String {
        format!("http://{USER}:{}@127.0.0.1:{}", self.secret, self.port)
    }
}

/// The user name in the proxy URL (the secret is its password).
const USER: &str = "replbox";

/// A fresh secret: 244 random bits (two v4 UUIDs, from the OS's generator), as hex, which
/// needs no escaping in a URL.
fn new_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(s) = &self.socket {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// Longest path a Unix socket may have (`sun_path` holds 108 bytes, its terminating NUL
/// included).
pub const SOCKET_PATH_MAX: usize = 107;

/// Bytes a socket's name in the proxy's directory adds to the directory's path
/// (`/` + 32 hex digits + `.sock`).
pub const SOCKET_NAME_LEN: usize = 1 + 32 + 5;

/// Longest directory [`Egress::unix`] can make sockets in.
pub const SOCKET_DIR_MAX: usize = SOCKET_PATH_MAX - SOCKET_NAME_LEN;

impl Egress {
    /// The proxy for `policy`, keeping its sockets in `dir` (created, the server's own).
    pub fn new(policy: Policy, dir: &Path) -> std::io::Result<Self> {
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // Passable, not listable: the pool uids reach their own socket by its random name.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
        Ok(Self {
            policy,
            own: Arc::new(own_addresses()),
            dir: dir.to_path_buf(),
            total: Arc::new(Semaphore::new(PER_SERVER)),
            principals: Mutex::new(HashMap::new()),
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// What one endpoint allows: the operator's policy and a caller's checked domains, for
    /// whoever presents `secret`.
    fn shared(&self, extra: &[String], secret: &str) -> Arc<proxy::Shared> {
        Arc::new(proxy::Shared {
            policy: self.policy.with_domains(extra),
            own: self.own.clone(),
            idle: IDLE,
            credentials: format!("{USER}:{secret}").into_bytes(),
        })
    }

    /// The caps a connection of `principal`'s endpoint `who` counts against.
    fn caps(&self, who: &str, principal: &str) -> Caps {
        let theirs = self
            .principals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(principal.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(PER_PRINCIPAL)))
            .clone();
        Caps {
            who: Arc::from(who),
            endpoint: Arc::new(Semaphore::new(PER_ENDPOINT)),
            principal: theirs,
            server: self.total.clone(),
            refusing: Arc::new(Semaphore::new(REFUSING)),
        }
    }

    /// A Unix-socket endpoint (for a sandbox with its own network namespace), allowing the
    /// policy and `extra` (a caller's checked domains). The socket is connectable by anyone
    /// who can reach the directory: the pool uid's bridge must.
    pub fn unix(&self, who: &str, principal: &str, extra: &[String]) -> std::io::Result<Endpoint> {
        let path = self
            .dir
            .join(format!("{}.sock", uuid::Uuid::new_v4().simple()));
        debug_assert_eq!(
            path.as_os_str().len(),
            self.dir.as_os_str().len() + SOCKET_NAME_LEN
        );
        let listener = tokio::net::UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        let secret = new_secret();
        let task = accept(
            self.caps(who, principal),
            listener,
            self.shared(extra, &secret),
        );
        Ok(Endpoint {
            socket: Some(path),
            port: BRIDGE_PORT,
            secret,
            task,
        })
    }

    /// A TCP endpoint on the host's loopback, on a port of the kernel's choosing.
    pub fn tcp(&self, who: &str, principal: &str, extra: &[String]) -> std::io::Result<Endpoint> {
        let std = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        std.set_nonblocking(true)?;
        let port = std.local_addr()?.port();
        let listener = tokio::net::TcpListener::from_std(std)?;
        let secret = new_secret();
        let task = accept(
            self.caps(who, principal),
            listener,
            self.shared(extra, &secret),
        );
        Ok(Endpoint {
            socket: None,
            port,
            secret,
            task,
        })
    }
}

/// What one endpoint's connections count against.
struct Caps {
    who: Arc<str>,
    endpoint: Arc<Semaphore>,
    principal: Arc<Semaphore>,
    server: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
}

/// Which cap a connection is over: what user code is answered (429) and the log says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum Full {
    #[error(
        "replbox egress: this session or run already has {PER_ENDPOINT} connections open \
         through the proxy, the most one may have; close some and try again"
    )]
    Endpoint,
    #[error(
        "replbox egress: this client's sessions and runs already have {PER_PRINCIPAL} \
         connections open through the proxy, the most one client may have; close some (or \
         end a session) and try again"
    )]
    Principal,
    #[error(
        "replbox egress: the proxy has {PER_SERVER} connections open, its most; try again later"
    )]
    Server,
}

impl Caps {
    /// A place for one more connection, or which cap there is none under.
    fn take(&self) -> Result<[OwnedSemaphorePermit; 3], Full> {
        let endpoint = (self.endpoint.clone().try_acquire_owned()).map_err(|_| Full::Endpoint)?;
        let principal =
            (self.principal.clone().try_acquire_owned()).map_err(|_| Full::Principal)?;
        let server = (self.server.clone().try_acquire_owned()).map_err(|_| Full::Server)?;
        Ok([endpoint, principal, server])
    }
}

/// The accept loop of one endpoint: bounded connections, each served by [`proxy::serve`];
/// aborting it drops every connection it started. A connection over a cap is answered
/// with an error saying which (429), when few such answers are under way.
fn accept<L: Listener>(caps: Caps, listener: L, shared: Arc<proxy::Shared>) -> AbortHandle {
    tokio::spawn(async move {
        let who = caps.who.clone();
        let mut conns = JoinSet::new();
        loop {
            let stream = match listener.next().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(who = %who, "egress: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            while conns.try_join_next().is_some() {}
            let permits = match caps.take() {
                Ok(p) => p,
                Err(why) => {
                    tracing::warn!(who = %who, "egress: {why}");
                    if let Ok(p) = caps.refusing.clone().try_acquire_owned() {
                        let shared = shared.clone();
                        conns.spawn(async move {
                            proxy::turn_away(stream, &shared, why.to_string()).await;
                            drop(p);
                        });
                    }
                    continue;
                }
            };
            let (shared, who) = (shared.clone(), who.clone());
            conns.spawn(async move {
                proxy::serve(stream, shared, who).await;
                drop(permits);
            });
        }
    })
    .abort_handle()
}

/// A listener of either kind.
trait Listener: Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn next(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Listener for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn next(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(s, _)| s)
    }
}

impl Listener for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn next(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(s, _)| s)
    }
}

/// This host's own addresses (every interface's), refused as destinations.
fn own_addresses() -> Vec<IpAddr> {
    let mut v = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            let Some(addr) = a.address else { continue };
            if let Some(s) = addr.as_sockaddr_in() {
                v.push(IpAddr::V4(s.ip()));
            } else if let Some(s) = addr.as_sockaddr_in6() {
                v.push(IpAddr::V6(s.ip()));
            }
        }
    }
    v.sort();
    v.dedup();
    v
}

/// Domains a caller asked for, refused: the caller's to fix (the operator's flags never reach
/// a tool call: the server does not start with a bad one).
impl From<EgressError> for crate::error::ToolError {
    fn from(e: EgressError) -> Self {
        Self::invalid(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::Full;

    /// What user code is answered over a cap, byte for byte.
    #[test]
    fn cap_messages_are_pinned() {
        assert_eq!(
            Full::Endpoint.to_string(),
            "replbox egress: this session or run already has 32 connections open through the \
             proxy, the most one may have; close some and try again"
        );
        assert_eq!(
            Full::Principal.to_string(),
            "replbox egress: this client's sessions and runs already have 64 connections open \
             through the proxy, the most one client may have; close some (or end a session) \
             and try again"
        );
        assert_eq!(
            Full::Server.to_string(),
            "replbox egress: the proxy has 512 connections open, its most; try again later"
        );
    }
}
