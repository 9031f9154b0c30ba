//! The way from one session's (or run's) code to its tools: a directory of its own (the
//! modules user code imports, a secret, a Unix socket), bound read-only into its sandbox;
//! the server answers on the socket. Never the network, and never another session's: the
//! directory is root's with the session's group (no other uid may enter it), the socket
//! checks its peer's uid, and every request carries the secret only this session can read.
//! Calls are answered only while one of its evaluations runs, within its bounds.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use super::endpoint::{Inner, Scope, State, refusal};
use super::record::CallRecord;
use super::relay;
use super::{Access, Shared, modules};

/// Longest request line (the arguments of one call).
const MAX_REQUEST: usize = 1024 * 1024;
/// Connections of one channel open at once; more are closed at once.
const MAX_CONNECTIONS: usize = 64;
/// The socket's name in the channel's directory.
pub const SOCKET: &str = "sock";
/// The secret's file in the channel's directory.
pub const SECRET: &str = "secret";

/// One session's or run's channel; dropping it closes the socket and removes the directory.
pub struct Channel {
    dir: PathBuf,
    inner: Arc<Inner>,
    task: AbortHandle,
}

/// While held, calls are answered for one evaluation; dropping it ends that (calls still in
/// flight are cancelled).
pub struct ScopeGuard {
    inner: Arc<Inner>,
    scope: Arc<Scope>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        self.scope.cancel.cancel();
        let mut st = self.inner.lock();
        if st
            .scope
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &self.scope))
        {
            st.scope = None;
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(s) = self.inner.lock().scope.take() {
            s.cancel.cancel();
        }
        crate::workspace::remove_tree(&self.dir);
    }
}

impl Channel {
    /// A channel for `access` in a fresh directory under `root`, for code running as `uid`
    /// (None: the server's own uid).
    pub(super) fn open(
        root: &Path,
        access: Arc<Access>,
        shared: Arc<Shared>,
        who: &str,
        uid: Option<u32>,
    ) -> std::io::Result<Self> {
        let name = uuid::Uuid::new_v4().simple().to_string();
        let dir = root.join(&name[..16]);
        let socket = dir.join(SOCKET);
        if socket.as_os_str().len() >= 100 {
            return Err(std::io::Error::other(format!(
                "the tools socket's path {} is too long for a Unix socket; use a shorter \
                 --work-dir",
                socket.display()
            )));
        }
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let made = (|| -> std::io::Result<(String, UnixListener)> {
            let secret = format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            );
            for (rel, text) in modules::files() {
                write_file(&dir, rel, text)?;
            }
            write_file(&dir, SECRET, &secret)?;
            let listener = UnixListener::bind(&socket)?;
            std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660))?;
            if let Some(uid) = uid {
                // Root's, with the session's group: it reads, it cannot change.
                for p in walk(&dir) {
                    std::os::unix::fs::chown(&p, Some(0), Some(uid))?;
                }
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2750))?;
            }
            Ok((secret, listener))
        })();
        let (secret, listener) = match made {
            Ok(m) => m,
            Err(e) => {
                crate::workspace::remove_tree(&dir);
                return Err(e);
            }
        };
        let concurrent = Arc::new(Semaphore::new(shared.limits.max_concurrent));
        let inner = Arc::new(Inner {
            access,
            shared,
            who: who.to_string(),
            uid,
            secret,
            state: Mutex::new(State::default()),
            concurrent,
        });
        let task = accept(inner.clone(), listener);
        Ok(Self { dir, inner, task })
    }

    /// The channel's directory (bound read-only into the sandbox).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The variables that let each language's module find it, and `replbox-tool` on PATH
    /// (prepended to `path`).
    pub fn env(&self, path: &str) -> Vec<(String, String)> {
        let d = self.dir.display().to_string();
        vec![
            ("REPLBOX_TOOLS".into(), d.clone()),
            ("PYTHONPATH".into(), format!("{d}/python")),
            ("NODE_PATH".into(), format!("{d}/node")),
            ("RUBYLIB".into(), format!("{d}/ruby")),
            ("PATH".into(), format!("{d}/bin:{path}")),
        ]
    }

    /// What the code can call: each server and its tools' names.
    pub fn listing(&self) -> Vec<super::ServerTools> {
        self.inner.access.listing()
    }

    /// Answer calls for evaluation `eval_id` until the guard is dropped (which cancels the
    /// calls still in flight), within `deadline`. An interrupt reaches a call through the
    /// code: the interrupted code closes its connection, which cancels the call (a second
    /// way to end it, racing the interpreter's own interrupt, would leave the REPL in a
    /// state its recovery does not expect). `replay`: the calls the journal recorded for
    /// it, answered from the record. Calls of an earlier evaluation not taken are dropped.
    pub fn begin(
        &self,
        eval_id: u64,
        deadline: tokio::time::Instant,
        replay: Vec<CallRecord>,
    ) -> ScopeGuard {
        let scope = Arc::new(Scope {
            deadline,
            cancel: CancellationToken::new(),
            made: AtomicU32::new(0),
            replay: Mutex::new(replay),
        });
        let mut st = self.inner.lock();
        if st.eval_id != eval_id {
            st.eval_id = eval_id;
            st.calls.clear();
            st.kept = 0;
        } else {
            // A resumed evaluation counts the calls it made before it paused.
            scope.made.store(
                st.calls.len().try_into().unwrap_or(u32::MAX),
                Ordering::Relaxed,
            );
        }
        if let Some(old) = st.scope.replace(scope.clone()) {
            old.cancel.cancel();
        }
        drop(st);
        ScopeGuard {
            inner: self.inner.clone(),
            scope,
        }
    }

    /// The calls evaluation `eval_id` made, in the order they ended (taken).
    pub fn take_calls(&self, eval_id: u64) -> Vec<CallRecord> {
        let mut st = self.inner.lock();
        if st.eval_id != eval_id {
            return Vec::new();
        }
        st.kept = 0;
        std::mem::take(&mut st.calls)
    }
}

fn write_file(dir: &Path, rel: &str, text: &str) -> std::io::Result<()> {
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(parent)?;
    }
    let mode = if rel.starts_with("bin/") {
        0o750
    } else {
        0o640
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)?;
    std::io::Write::write_all(&mut f, text.as_bytes())
}

/// Everything in `dir` (the server's own, just made), itself first.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        i += 1;
        if let Ok(rd) = std::fs::read_dir(&p) {
            for e in rd.flatten() {
                out.push(e.path());
            }
        }
    }
    out
}

/// The accept loop: each connection served by [`serve`], at most [`MAX_CONNECTIONS`].
fn accept(inner: Arc<Inner>, listener: UnixListener) -> AbortHandle {
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(who = %inner.who, "tools socket: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            while conns.try_join_next().is_some() {}
            let Ok(permit) = open.clone().try_acquire_owned() else {
                tracing::warn!(who = %inner.who, "tools socket: {MAX_CONNECTIONS} connections open; closing one more");
                continue;
            };
            if !inner.peer_allowed(&stream) {
                tracing::warn!(who = %inner.who, "tools socket: a connection from another user refused");
                continue;
            }
            let inner = inner.clone();
            conns.spawn(async move {
                serve(inner, stream).await;
                drop(permit);
            });
        }
    })
    .abort_handle()
}

/// One request line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    secret: String,
    op: String,
    #[serde(default)]
    server: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
    /// `cli`: a first line `ok` or `error`, then the text, and the connection is closed.
    #[serde(default)]
    format: Option<String>,
}

/// Serve one connection: requests, one a line, each answered with one line.
async fn serve(inner: Arc<Inner>, stream: UnixStream) {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut r)
            .take(MAX_REQUEST as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.len() > MAX_REQUEST {
            let _ = w
                .write_all(&reply_line(&refusal(format!(
                    "the request is over {MAX_REQUEST} bytes: pass smaller arguments (write \
                     large data to a file instead)"
                ))))
                .await;
            return;
        }
        let req: Request = match serde_json::from_slice(&line) {
            Ok(r) => r,
            Err(e) => {
                let _ = w
                    .write_all(&reply_line(&refusal(format!(
                        "the request is not valid JSON ({e}): are the arguments a JSON object?"
                    ))))
                    .await;
                return;
            }
        };
        if !bool::from(req.secret.as_bytes().ct_eq(inner.secret.as_bytes())) {
            tracing::warn!(who = %inner.who, "tools socket: a request without the session's secret refused");
            let _ = w
                .write_all(&reply_line(&refusal("not this session's secret".into())))
                .await;
            return;
        }
        let cli = req.format.as_deref() == Some("cli");
        let reply = match req.op.as_str() {
            "list" => inner.catalog().await,
            "call" => {
                let (Some(server), Some(tool)) = (req.server, req.tool) else {
                    let _ = w
                        .write_all(&reply_line(&refusal(
                            "a call names a server and a tool".into(),
                        )))
                        .await;
                    return;
                };
                // Code that gives up (interrupted, killed) closes its connection: the call
                // ends as cancelled, and rmcp tells the upstream (notifications/cancelled).
                let gone = std::pin::pin!(closed(&mut r));
                let args = req.arguments.unwrap_or(Value::Null);
                let (reply, hung_up) = relay::call(&inner, server, tool, args, gone).await;
                if hung_up {
                    return;
                }
                reply
            }
            other => refusal(format!("unknown op {other:?} (list, call)")),
        };
        if cli {
            let _ = w.write_all(&cli_text(&reply)).await;
            return;
        }
        if w.write_all(&reply_line(&reply)).await.is_err() {
            return;
        }
    }
}

/// Resolves when the peer closes its side (no request is read while one is answered).
async fn closed<R: tokio::io::AsyncRead + Unpin>(r: &mut R) {
    let mut b = [0u8; 1];
    loop {
        match r.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn reply_line(v: &Value) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    b.push(b'\n');
    b
}

/// A reply for `replbox-tool`: `ok` and the structured content (else the text), or
/// `error` and the message.
fn cli_text(reply: &Value) -> Vec<u8> {
    if reply["ok"] != Value::Bool(true) {
        let e = &reply["error"];
        let msg = e["message"].as_str().unwrap_or("the call failed");
        return format!("error\n{msg}\n").into_bytes();
    }
    if let Some(servers) = reply.get("servers").and_then(Value::as_array) {
        let mut t = String::from("ok\n");
        for s in servers {
            let name = s["name"].as_str().unwrap_or("");
            for tool in s["tools"].as_array().into_iter().flatten() {
                let first = tool["description"]
                    .as_str()
                    .unwrap_or("")
                    .lines()
                    .next()
                    .unwrap_or("");
                t.push_str(&format!(
                    "{name} {}\t{first}\n",
                    tool["name"].as_str().unwrap_or("")
                ));
            }
        }
        return t.into_bytes();
    }
    let result = &reply["result"];
    let mut t = String::from("ok\n");
    if let Some(s) = result.get("structuredContent") {
        t.push_str(&s.to_string());
        t.push('\n');
        return t.into_bytes();
    }
    for c in result["content"].as_array().into_iter().flatten() {
        match c["type"].as_str() {
            Some("text") => {
                t.push_str(c["text"].as_str().unwrap_or(""));
                t.push('\n');
            }
            Some(kind) => {
                t.push_str(&format!(
                    "{}\n",
                    json!({"type": kind, "mimeType": c["mimeType"]})
                ));
            }
            None => {}
        }
    }
    t.into_bytes()
}

impl Inner {
    /// The servers and tools this channel may call, with descriptions and schemas.
    async fn catalog(&self) -> Value {
        let mut servers = Vec::new();
        for g in &self.access.servers {
            let live = match g.instance.get().await {
                Ok(l) => l,
                Err(e) => {
                    servers.push(json!({"name": g.name, "tools": [], "error": e.to_string()}));
                    continue;
                }
            };
            let tools: Vec<Value> = live
                .tools
                .iter()
                .filter(|t| g.tools.allows(&t.name))
                .map(|t| {
                    let mut v = json!({
                        "name": t.name,
                        "description": t.description,
                        "inputSchema": t.input_schema,
                    });
                    if let Some(o) = &t.output_schema {
                        v["outputSchema"] = Value::Object((**o).clone());
                    }
                    v
                })
                .collect();
            servers.push(json!({"name": g.name, "tools": tools}));
        }
        json!({"ok": true, "servers": servers})
    }
}
