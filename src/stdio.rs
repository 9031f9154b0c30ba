//! MCP over stdio: the line framing between the process's stdin and stdout and rmcp.
//!
//! rmcp reads one JSON-RPC message a line, but answers nothing to a line it cannot read (not
//! UTF-8, not JSON, longer than its limit), so a client waits forever for that request's
//! reply. This layer reads the lines itself, bounded by `--max-line-bytes` (tokio-util's
//! delimiter codec, on bytes: `LinesCodec` would drop a line not in UTF-8 unread, and with
//! it the id to answer), hands rmcp every message it accepts (rmcp keeps doing the
//! protocol), and answers every other line that could be a request with a JSON-RPC error:
//! parse error (-32700) for what is not JSON, invalid request (-32600) for a line too long
//! or JSON that is not a message rmcp accepts, with the request's id when it can be read,
//! `null` otherwise. Notifications get no answer, as JSON-RPC wants. Everything written to
//! stdout goes through one task, one serialized message a line, so nothing but JSON-RPC
//! ever reaches it and lines never interleave.
//!
//! The way out is bounded: rmcp spawns a task for every message it sends, and its handlers
//! answer every request read, so a client that does not read would make the server hold
//! its answers without end. Reading stops while [`QUEUE`] messages or [`QUEUE_BYTES`] bytes
//! wait to be written (and
//! notifications past twice that are dropped), or while [`IN_FLIGHT`] requests read are
//! not answered yet (a handler that takes a moment, as reading a 4 MiB resource does,
//! would otherwise let a client have hundreds of answers made at once: 2 GiB for 300), so
//! such a client stops its own requests being read and the server's memory stays bounded.
//! A client that writes everything before it reads anything thus blocks once its unread
//! requests fill the pipe: a client must read as it writes.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, RequestId};
use rmcp::service::TxJsonRpcMessage;
use rmcp::transport::Transport;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, Decoder};

/// JSON-RPC's "Parse error": the line is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's "Invalid Request": JSON, but not a request this server reads.
pub const INVALID_REQUEST: i64 = -32600;

/// Bytes of an over-long line kept to find its id (an id comes first in practice).
const ID_PREFIX: usize = 4096;
/// Messages waiting to be written; past this, reading waits for the client to read.
pub const QUEUE: usize = 64;
/// Bytes waiting to be written; past this, reading waits too (one answer may be larger).
pub const QUEUE_BYTES: usize = 8 << 20;
/// Requests read and not yet answered; past this, reading waits for an answer. Each
/// evaluation is bounded by its timeout, so this waits for no longer than one of them.
pub const IN_FLIGHT: usize = 8;

/// What to do with one line.
#[derive(Debug)]
pub enum Verdict {
    /// A message for rmcp.
    Message(Box<ClientJsonRpcMessage>),
    /// An error to answer with (a whole JSON-RPC response).
    Answer(Value),
    /// Nothing: a blank line, or a notification or response that cannot be read.
    Ignore,
}

/// A JSON-RPC error response.
pub fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Judge one complete line (without its newline).
pub fn classify(line: &[u8]) -> Verdict {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // RFC 8259 lets a parser ignore a byte order mark.
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Ignore;
    }
    let rejected = match serde_json::from_slice::<ClientJsonRpcMessage>(line) {
        Ok(m) => return Verdict::Message(Box::new(m)),
        Err(e) => e,
    };
    let value = match serde_json::from_slice::<Value>(line) {
        Ok(v) => v,
        Err(e) => {
            return Verdict::Answer(error(
                recover_id(line),
                PARSE_ERROR,
                &format!("parse error: the line is not JSON in UTF-8 ({e})"),
            ));
        }
    };
    let Some(obj) = value.as_object() else {
        return Verdict::Answer(error(
            Value::Null,
            INVALID_REQUEST,
            "invalid request: a message is one JSON object per line (batches are not supported)",
        ));
    };
    let is_response = obj.contains_key("result") || obj.contains_key("error");
    match obj.get("id") {
        // A notification (or a response) that cannot be read: JSON-RPC answers neither.
        None if obj.contains_key("method") || is_response => Verdict::Ignore,
        Some(_) if is_response => Verdict::Ignore,
        id => Verdict::Answer(error(
            id.cloned().filter(valid_id).unwrap_or(Value::Null),
            INVALID_REQUEST,
            &format!("invalid request: not a JSON-RPC request this server reads ({rejected})"),
        )),
    }
}

/// The answer to a line longer than `max` bytes, of which `prefix` are its first bytes.
pub fn oversized(prefix: &[u8], max: usize) -> Value {
    error(
        recover_id(prefix),
        INVALID_REQUEST,
        &format!(
            "invalid request: the message is longer than this server's limit of {max} bytes \
             a line (--max-line-bytes); send less in one call"
        ),
    )
}

/// An id JSON-RPC allows: a string or a number.
fn valid_id(v: &Value) -> bool {
    v.is_string() || v.is_number()
}

/// The `id` of a top-level JSON object that may be cut short or broken further on: the
/// object's members are read in order until the first error, and an `id` met before it is
/// kept. `null` when there is none to read.
pub fn recover_id(bytes: &[u8]) -> Value {
    struct Members<'a>(&'a mut Option<Value>);
    impl<'de> Visitor<'de> for Members<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC message")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                if key == "id" {
                    let v: Value = map.next_value()?;
                    *self.0 = valid_id(&v).then_some(v);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(())
        }
    }
    let mut id = None;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let _ = serde::Deserializer::deserialize_map(&mut de, Members(&mut id));
    id.unwrap_or(Value::Null)
}

/// One line for the writer, and who waits for it to be written.
struct Out {
    bytes: Vec<u8>,
    done: Option<oneshot::Sender<std::io::Result<()>>>,
    /// Counted as owed until written (or dropped).
    _debt: Option<Debt>,
}

/// Messages handed to `send` and not yet written.
#[derive(Debug, Default)]
struct Owed {
    n: AtomicUsize,
    bytes: AtomicUsize,
    less: Notify,
}

/// One message owed (of so many bytes); paid when dropped.
#[derive(Debug)]
struct Debt(Arc<Owed>, usize);

impl Drop for Debt {
    fn drop(&mut self) {
        self.0.n.fetch_sub(1, Ordering::SeqCst);
        self.0.bytes.fetch_sub(self.1, Ordering::SeqCst);
        self.0.less.notify_waiters();
    }
}

impl Owed {
    fn incur(self: &Arc<Self>, bytes: usize) -> Debt {
        self.n.fetch_add(1, Ordering::SeqCst);
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
        Debt(self.clone(), bytes)
    }

    fn count(&self) -> usize {
        self.n.load(Ordering::SeqCst)
    }

    /// Wait until fewer than `limit` messages and `max_bytes` bytes are owed.
    /// Cancellation-safe.
    async fn below(&self, limit: usize, max_bytes: usize) {
        loop {
            let less = self.less.notified();
            tokio::pin!(less);
            less.as_mut().enable();
            if self.count() < limit && self.bytes.load(Ordering::SeqCst) < max_bytes {
                return;
            }
            less.await;
        }
    }
}

/// The transport rmcp serves on: lines in from `R`, messages out through the writer task.
pub struct Framing<R> {
    read: R,
    /// Bytes read and not framed yet: at most a line of `max` bytes and one read more.
    buf: BytesMut,
    /// Finds the lines, each at most `max` bytes (without its newline).
    lines: AnyDelimiterCodec,
    max: usize,
    /// The first bytes of a line found too long (where its id is), while the rest of it is
    /// dropped up to its newline.
    cut: Option<Vec<u8>>,
    /// The writer's queue: unbounded as a channel, bounded by [`Owed`] (reading waits).
    out: Option<mpsc::UnboundedSender<Out>>,
    writer: Option<JoinHandle<()>>,
    owed: Arc<Owed>,
    /// Requests read and not answered, by id (a list: a client may reuse an id).
    asked: HashMap<RequestId, Vec<Debt>>,
    in_flight: Arc<Owed>,
}

/// The process's stdin and stdout, framed (within a Tokio runtime).
pub fn transport(max_line: usize) -> Framing<impl AsyncRead + Unpin + Send + 'static> {
    let (read, write) = rmcp::transport::stdio_pipes();
    Framing::new(read, write, max_line)
}

/// Bytes asked of the reader at a time.
const READ: usize = 8192;

enum Read {
    Line(Bytes),
    /// A line longer than `max`, by its first bytes.
    Oversized(Vec<u8>),
    Eof,
}

fn lines(max: usize) -> AnyDelimiterCodec {
    AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), Vec::new(), max)
}

impl<R: AsyncRead + Unpin + Send + 'static> Framing<R> {
    pub fn new<W: AsyncWrite + Unpin + Send + 'static>(read: R, write: W, max_line: usize) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            read,
            buf: BytesMut::new(),
            lines: lines(max_line),
            max: max_line,
            cut: None,
            out: Some(tx),
            writer: Some(tokio::spawn(write_loop(write, rx))),
            owed: Arc::default(),
            asked: HashMap::new(),
            in_flight: Arc::default(),
        }
    }

    /// The next line (without its newline), never holding more than `max` bytes of it.
    /// Cancellation-safe (rmcp polls `receive` in a `select!`): what was read is in
    /// `self.buf`, or was dropped as the rest of the line in `self.cut`.
    async fn read_line(&mut self) -> std::io::Result<Read> {
        loop {
            if let Some(head) = &mut self.cut {
                // A line too long is answered where it ends, not at once: one cut short by
                // the end of input is a message nobody waits for. The codec would drop the
                // rest too, but not tell where it ends, so it starts afresh after it.
                let newline = memchr::memchr(b'\n', &self.buf);
                let take = newline.map_or(self.buf.len(), |i| i + 1);
                // Keep the first bytes (where the id is), drop the rest.
                let room = ID_PREFIX.saturating_sub(head.len());
                head.extend_from_slice(&self.buf[..take.min(room)]);
                self.buf.advance(take);
                if newline.is_some() {
                    self.lines = lines(self.max);
                    return Ok(Read::Oversized(self.cut.take().unwrap_or_default()));
                }
            } else {
                match self.lines.decode(&mut self.buf) {
                    Ok(Some(line)) => return Ok(Read::Line(line)),
                    Ok(None) => {}
                    Err(AnyDelimiterCodecError::MaxChunkLengthExceeded) => {
                        self.cut = Some(Vec::with_capacity(ID_PREFIX));
                        continue;
                    }
                    Err(AnyDelimiterCodecError::Io(e)) => return Err(e),
                }
            }
            self.buf.reserve(READ);
            if self.read.read_buf(&mut self.buf).await? == 0 {
                return Ok(Read::Eof);
            }
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::UnboundedReceiver<Out>) {
    while let Some(out) = rx.recv().await {
        let result = async {
            w.write_all(&out.bytes).await?;
            w.flush().await
        }
        .await;
        let failed = result.is_err();
        if let Err(e) = &result {
            tracing::warn!("cannot write to stdout: {e}");
        }
        if let Some(done) = out.done {
            let _ = done.send(result);
        }
        if failed {
            return;
        }
    }
}

fn closed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::NotConnected, "stdout is closed")
}

fn line_of(v: &impl serde::Serialize) -> serde_json::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec(v)?;
    bytes.push(b'\n');
    Ok(bytes)
}

impl<R> Framing<R> {
    /// Queue `bytes` for the writer, owed until written; with `wait`, what tells when
    /// they are.
    fn queue(&self, bytes: Vec<u8>, wait: bool) -> std::io::Result<Option<Written>> {
        let (done, written) = match wait {
            true => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        self.out
            .as_ref()
            .ok_or_else(closed)?
            .send(Out {
                _debt: Some(self.owed.incur(bytes.len())),
                bytes,
                done,
            })
            .map_err(|_| closed())?;
        Ok(written)
    }
}

type Written = oneshot::Receiver<std::io::Result<()>>;

impl<R: AsyncRead + Unpin + Send + 'static> Transport<RoleServer> for Framing<R> {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // A notification (progress, a log line) is advice: past twice the queue, one for a
        // client that does not read is dropped rather than held.
        let drop_it =
            matches!(item, JsonRpcMessage::Notification(_)) && self.owed.count() >= 2 * QUEUE;
        // Queued here, not in the future rmcp spawns, so messages are written in the order
        // rmcp sends them.
        let queued = if drop_it {
            tracing::debug!("a notification dropped: the client is not reading");
            Ok(None)
        } else {
            line_of(&item)
                .map_err(std::io::Error::other)
                .and_then(|bytes| self.queue(bytes, true))
        };
        // The request is answered: its answer is owed now, queued above.
        let answered = match &item {
            JsonRpcMessage::Response(r) => Some(&r.id),
            JsonRpcMessage::Error(e) => e.id.as_ref(),
            _ => None,
        };
        if let Some(id) = answered
            && let Some(debts) = self.asked.get_mut(id)
        {
            debts.pop();
            if debts.is_empty() {
                self.asked.remove(id);
            }
        }
        async move {
            match queued? {
                Some(wait) => wait.await.map_err(|_| closed())?,
                None => Ok(()),
            }
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            // Nothing more is read while the answers to what was read wait for the client,
            // or while many requests read are still being answered.
            self.owed.below(QUEUE, QUEUE_BYTES).await;
            self.in_flight.below(IN_FLIGHT, usize::MAX).await;
            let read = match self.read_line().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("cannot read stdin: {e}");
                    return None;
                }
            };
            let answer = match read {
                // A last line without its newline is a message cut short: nobody waits.
                Read::Eof => return None,
                Read::Oversized(head) => {
                    tracing::debug!(max = self.max, "a line longer than --max-line-bytes");
                    Some(oversized(&head, self.max))
                }
                Read::Line(line) => match classify(&line) {
                    Verdict::Message(m) => {
                        if let JsonRpcMessage::Request(r) = &*m {
                            let debt = self.in_flight.incur(0);
                            self.asked.entry(r.id.clone()).or_default().push(debt);
                        }
                        return Some(*m);
                    }
                    Verdict::Answer(a) => {
                        tracing::debug!(answer = %a, "a line rmcp cannot read");
                        Some(a)
                    }
                    Verdict::Ignore => None,
                },
            };
            if let Some(Ok(bytes)) = answer.map(|a| line_of(&a)) {
                self.queue(bytes, false).ok()?;
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Everything queued is written before the writer ends (bounded: a client that stopped
        // reading must not hold the server up).
        drop(self.out.take());
        if let Some(w) = self.writer.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), w).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(line: &[u8]) -> Value {
        match classify(line) {
            Verdict::Answer(a) => a,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(line)),
        }
    }

    #[test]
    fn requests_pass_and_bad_lines_are_answered() {
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            Verdict::Message(_)
        ));
        assert!(matches!(classify(b"  \r"), Verdict::Ignore));
        let a = answer(b"\xff");
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (Value::Null, json!(-32700))
        );
        let a = answer(b"{\"id\":\"x\",\"method\":\"\xff\"}");
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (json!("x"), json!(-32700))
        );
        let a = answer(br#"{"jsonrpc":"2.0","id":{"no":1},"method":3}"#);
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (Value::Null, json!(-32600))
        );
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":1}"#),
            Verdict::Ignore
        ));
        // A response of the client that cannot be read is not answered either.
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":4,"error":5}"#),
            Verdict::Ignore
        ));
    }

    #[test]
    fn ids_are_found_in_broken_lines() {
        assert_eq!(
            recover_id(br#"{"jsonrpc":"2.0","id":42,"params":{"a":"#),
            json!(42)
        );
        assert_eq!(recover_id(br#"{"params":{"id":1},"id":"s"#), Value::Null);
        assert_eq!(recover_id(br#"{"params":{"id":1},"id":"s","#), json!("s"));
        assert_eq!(recover_id(br#"{"id":[1]}"#), Value::Null);
        assert_eq!(recover_id(b"[{\"id\":1}]"), Value::Null);
        assert_eq!(recover_id(b""), Value::Null);
    }

    #[tokio::test]
    async fn lines_are_bounded_and_every_request_is_answered() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(server);
        let mut t = Framing::new(read, write, 64);
        let long = format!(r#"{{"id":5,"method":"x","params":"{}"}}"#, "y".repeat(200));
        let input = format!(
            "{long}\nnot json\n{}\n",
            r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#
        );
        client.write_all(input.as_bytes()).await.unwrap();
        let m = t.receive().await.expect("the ping");
        assert!(serde_json::to_string(&m).unwrap().contains("ping"));
        // What is held of the long line is its first bytes and a read's worth.
        assert!(t.buf.capacity() <= 64 + 2 * READ, "{}", t.buf.capacity());
        drop(client.shutdown().await);
        assert!(t.receive().await.is_none());
        t.close().await.unwrap();
        // The client sees the end once both halves of the server's end are gone.
        drop(t);
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut client, &mut out)
            .await
            .unwrap();
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[0]["id"], 5);
        assert_eq!(lines[0]["error"]["code"], INVALID_REQUEST);
        assert!(
            lines[0]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("64 bytes")
        );
        assert_eq!(lines[1]["id"], Value::Null);
        assert_eq!(lines[1]["error"]["code"], PARSE_ERROR);
    }

    #[tokio::test]
    async fn a_long_line_is_answered_where_it_ends_by_the_id_in_its_first_bytes() {
        // A small pipe in: the server reads a few bytes at a time.
        let (mut client, read) = tokio::io::duplex(16);
        let (write, mut answers) = tokio::io::duplex(1 << 16);
        let mut t = Framing::new(read, write, 64);
        let reader = tokio::spawn(async move {
            let m = t.receive().await;
            (t, m)
        });
        // The id is past the limit (but within the bytes kept of a line too long).
        let long = format!(
            r#"{{"method":"x","params":"{}","id":"late","more":"{}"}}"#,
            "y".repeat(100),
            "z".repeat(10_000)
        );
        client.write_all(long.as_bytes()).await.unwrap();
        client
            .write_all(b"\n\xff\n{\"id\":\"u\",\"method\":\"\xff\"}\n")
            .await
            .unwrap();
        client
            .write_all(br#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#)
            .await
            .unwrap();
        client.write_all(b"\n").await.unwrap();
        let (mut t, m) = reader.await.unwrap();
        assert!(
            serde_json::to_string(&m.expect("the ping"))
                .unwrap()
                .contains("ping")
        );
        // A line too long that the end of input cuts short is a message nobody waits for.
        let reader = tokio::spawn(async move {
            let m = t.receive().await;
            (t, m)
        });
        client.write_all(long.as_bytes()).await.unwrap();
        drop(client.shutdown().await);
        let (mut t, m) = reader.await.unwrap();
        assert!(m.is_none());
        t.close().await.unwrap();
        drop(t);
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut answers, &mut out)
            .await
            .unwrap();
        let got: Vec<(Value, Value)> = out
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|a| (a["id"].clone(), a["error"]["code"].clone()))
            .collect();
        assert_eq!(
            got,
            [
                (json!("late"), json!(INVALID_REQUEST)),
                (Value::Null, json!(PARSE_ERROR)),
                (json!("u"), json!(PARSE_ERROR)),
            ],
            "{out}"
        );
    }
}
