//! Connections that have not yet sent a request's headers. On a full server such a
//! connection holds a slot (or a place past the cap) while it sends nothing, and the token
//! that would count it in a principal's share has not arrived: a client that opens
//! connections and stalls them could hold every slot for the read timeout each. So, once
//! one has been stalled for [`STALLED`], it gives up its slot to a connection that needs
//! one: a request waiting for a slot, or a new connection when nothing is free. A client
//! sends its headers with the connection (they arrive with the handshake's last packet),
//! so only a stalled one is ever closed, and only when someone else waits.

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
    since: Instant,
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
                since: Instant::now(),
                close,
                held,
            },
        );
        drop(g);
        self.added.notify_waiters();
        id
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
        let mut next = None;
        let mut found = None;
        for (id, e) in g.1.iter() {
            let held = lock(&e.held);
            match held.as_ref() {
                Some(s) if !general || s.is_general() => {}
                _ => continue,
            }
            if now.duration_since(e.since) >= STALLED {
                found = Some(*id);
            } else {
                next = Some(e.since + STALLED);
            }
            break;
        }
        let Some(id) = found else { return Err(next) };
        let Some(e) = g.1.remove(&id) else {
            return Err(next);
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
                    .find(|e| lock(&e.held).is_some())
                    .map(|e| e.since + STALLED)
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
