//! Connections that have not yet sent a request's headers. On a full server such a
//! connection holds a slot (or a place past the cap) while it sends nothing, and the token
//! that would count it in a principal's share has not arrived: a client that opens
//! connections and stalls them could hold every slot for the read timeout each. So, once
//! one has been stalled for [`STALLED`], it gives up its slot to a connection that needs
//! one: a request waiting for a slot, or a new connection when nothing is free. A client
//! sends its headers with the connection (they arrive with the handshake's last packet),
//! so only a stalled one is ever closed, and only when someone else waits. The clock starts
//! when the server first reads the connection ([`Clocked`]), not when it accepted it: a
//! server slow to get to a connection (a loaded host) does not count against its client.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lock;

/// How long a connection may send nothing before it gives up its slot to one that waits.
pub(super) const STALLED: Duration = Duration::from_millis(250);

/// Which kind of slot a connection holds.
pub(super) enum Slot {
    /// One of the `max` served at once.
    General(
        #[expect(dead_code, reason = "held for its drop, which frees the slot")]
        OwnedSemaphorePermit,
    ),
    /// A place accepted past the cap.
    Overflow(OwnedSemaphorePermit),
}

impl Slot {
    fn is_general(&self) -> bool {
        matches!(self, Slot::General(_))
    }
}

/// What a connection holds, shared with the registry so that closing a stalled one hands its
/// slot straight to the connection that takes it (not back to the semaphore, where another
/// waiter could take it first).
pub(super) type Held = Arc<Mutex<Option<Slot>>>;

struct Entry {
    /// When the server first read it; None until then.
    since: Option<Instant>,
    close: CancellationToken,
    held: Held,
}

/// The connections accepted that have sent no request yet, oldest first.
#[derive(Default)]
pub(super) struct Pending {
    entries: Mutex<(u64, BTreeMap<u64, Entry>)>,
    added: Notify,
    closed: AtomicU64,
}

impl Pending {
    /// Register a connection just accepted; `close` ends it.
    pub(super) fn add(&self, held: Held, close: CancellationToken) -> u64 {
        let mut g = lock(&self.entries);
        let id = g.0;
        g.0 += 1;
        g.1.insert(
            id,
            Entry {
                since: None,
                close,
                held,
            },
        );
        drop(g);
        self.added.notify_waiters();
        id
    }

    /// The server reads the connection for the first time: its clock starts.
    fn start(&self, id: u64) {
        if let Some(e) = lock(&self.entries).1.get_mut(&id) {
            e.since.get_or_insert_with(Instant::now);
        }
        self.added.notify_waiters();
    }

    /// The connection sent a request (or ended): it is no longer pending.
    pub(super) fn remove(&self, id: u64) {
        lock(&self.entries).1.remove(&id);
    }

    /// Connections closed so far for stalling while others waited.
    pub(super) fn closed(&self) -> u64 {
        self.closed.load(Ordering::Relaxed)
    }

    /// Close the oldest connection stalled for [`STALLED`] holding a slot (a general one if
    /// `general`) and take its slot; otherwise when one may be, if any is pending.
    fn try_take(&self, general: bool) -> Result<Slot, Option<Instant>> {
        let mut g = lock(&self.entries);
        let now = Instant::now();
        // The connection silent the longest, among those holding a slot of the kind.
        let oldest =
            g.1.iter()
                .filter(|(_, e)| match lock(&e.held).as_ref() {
                    Some(s) => !general || s.is_general(),
                    None => false,
                })
                .filter_map(|(id, e)| Some((e.since?, *id)))
                .min();
        let Some((since, id)) = oldest else {
            return Err(None);
        };
        if now.duration_since(since) < STALLED {
            return Err(Some(since + STALLED));
        }
        let Some(e) = g.1.remove(&id) else {
            return Err(Some(now));
        };
        drop(g);
        e.close.cancel();
        let slot = lock(&e.held).take();
        match slot {
            Some(slot) => {
                self.closed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("closed an HTTP connection that sent no request for {STALLED:?}");
                Ok(slot)
            }
            None => Err(Some(now)),
        }
    }

    /// Wait until a connection has been stalled for [`STALLED`] holding a slot (a general
    /// one if `general`), close it and take its slot. Cancel-safe: a connection is closed
    /// only in the poll that returns its slot.
    pub(super) async fn take(&self, general: bool) -> Slot {
        loop {
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            match self.try_take(general) {
                Ok(slot) => return slot,
                Err(Some(at)) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = added => {}
                    }
                }
                Err(None) => added.await,
            }
        }
    }

    /// Wait until some connection has been stalled for [`STALLED`] holding any slot,
    /// without closing it.
    pub(super) async fn stalled(&self) {
        loop {
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let next = {
                let g = lock(&self.entries);
                g.1.values()
                    .filter(|e| lock(&e.held).is_some())
                    .filter_map(|e| e.since)
                    .min()
                    .map(|since| since + STALLED)
            };
            match next {
                Some(at) if at <= Instant::now() => return,
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = added => {}
                    }
                }
                None => added.await,
            }
        }
    }
}

/// A connection's socket that starts its pending clock at the server's first read of it.
pub(super) struct Clocked {
    inner: tokio::net::TcpStream,
    start: Option<(Arc<Pending>, u64)>,
}

impl Clocked {
    pub(super) fn new(inner: tokio::net::TcpStream, pending: Arc<Pending>, id: u64) -> Self {
        Self {
            inner,
            start: Some((pending, id)),
        }
    }
}

impl tokio::io::AsyncRead for Clocked {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some((pending, id)) = this.start.take() {
            pending.start(id);
        }
        std::pin::Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Clocked {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
