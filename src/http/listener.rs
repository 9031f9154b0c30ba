//! The HTTP listener: hyper's HTTP/1 server on each accepted connection, with the two limits
//! axum's `serve` lacks. A request's headers must arrive within the read timeout (hyper's
//! `header_read_timeout`, which also closes a kept-alive connection that sends no next
//! request in that time), and at most `max` connections are served at once: past that the
//! listener stops accepting, so new connections wait in the kernel's queue until a slot
//! frees, rather than each costing a task and a descriptor. Together they bound what
//! half-sent requests can hold, and for how long. (The body's own deadline is the guard's,
//! see `Deadline` in the parent module.)

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The connection limits of one listener.
#[derive(Clone)]
pub(super) struct Limits {
    pub read_timeout: Duration,
    /// Connections served at once.
    pub slots: Arc<Semaphore>,
    pub max: usize,
}

impl Limits {
    pub(super) fn new(read_timeout: Duration, max: usize) -> Self {
        let max = max.max(1);
        Self {
            read_timeout,
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Connections open now.
    pub(super) fn open(&self) -> usize {
        self.max.saturating_sub(self.slots.available_permits())
    }
}

/// Serve `router` on `listener` until `stop`; then stop accepting and let the open
/// connections finish their requests. Dropping the returned future (aborting its task)
/// drops every connection.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout);
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    loop {
        // A slot first, then the connection: past the cap, connections wait unaccepted.
        let slot = tokio::select! {
            _ = stop.cancelled() => break,
            slot = limits.slots.clone().acquire_owned() => match slot {
                Ok(s) => s,
                Err(_) => break, // the semaphore is never closed
            },
        };
        let stream = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors or memory for a moment: wait rather than spin.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = http.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(router.clone()),
        );
        let conn = graceful.watch(conn);
        conns.spawn(async move {
            // A timed-out or broken connection is the client's; nothing to report.
            if let Err(e) = conn.await {
                tracing::debug!("HTTP connection ended: {e}");
            }
            drop(slot);
        });
        // Forget the connections that ended.
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    // Open connections finish the request they are serving, then close.
    graceful.shutdown().await;
    conns.shutdown().await;
}
