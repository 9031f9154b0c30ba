//! The HTTP listener: hyper's HTTP/1 server on each accepted connection, with the limits
//! axum's `serve` lacks. A request's headers must arrive within the read timeout (hyper's
//! `header_read_timeout`, which also closes a kept-alive connection that sends no next
//! request in that time), and at most `max` connections are served at once: past that the
//! listener stops accepting, so new connections wait in the kernel's queue until a slot
//! frees, rather than each costing a task and a descriptor. Together they bound what
//! half-sent requests can hold, and for how long. (The body's own deadline is the guard's,
//! see `Deadline` in the parent module.)
//!
//! Two more bounds keep one client from taking every slot:
//! - A connection counts in the share of the principal whose request it last carried, until
//!   it closes (`--http-max-connections-per-principal`): the guard asks [`Conn::attribute`]
//!   and refuses a request past its principal's share. Requests that carry no principal
//!   (`/healthz`, refusals before the token, paths and methods with no route) close their
//!   connection after the answer.
//! - Past the cap, a few more connections are accepted ([`Limits::overflow`]): each has
//!   [`OVERFLOW_READ_TIMEOUT`] to send its request, `/healthz` and `/metrics` are answered
//!   at once, and any other request waits for a slot (then it is served like any other),
//!   or, when a quarter of the cap already waits so, is answered 503. [`RESERVED`] of
//!   them are never taken by waiting requests: a probe gets through a full server.
//! - A connection that has sent no request yet counts in no share, so one that stays silent
//!   for [`pending::STALLED`] gives up its slot or place to a connection that needs one
//!   (`pending`): stalled connections cannot hold a full server against real requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::identity::Caller;

mod pending;

use pending::{Clocked, Held, Pending, Slot};

/// Connections accepted past the cap that requests waiting for a slot never take: what a
/// probe of `/healthz` or `/metrics` finds free on a full server.
pub(super) const RESERVED: usize = 2;

/// How long a connection accepted past the cap may take to send its request's headers (a
/// client sends them at once; a slow one holds the place no longer than this).
const OVERFLOW_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a request carries a principal: one that does not is answered (refused) at once
/// past the cap, never waiting for a slot (it would hold a waiting place for nobody).
pub(super) type Admits = Arc<dyn Fn(&axum::http::HeaderMap) -> bool + Send + Sync>;

/// Paths answered on a connection accepted past the cap without waiting for a slot.
fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/metrics")
}

/// The connection limits of one listener.
#[derive(Clone)]
pub(super) struct Limits {
    pub read_timeout: Duration,
    /// Connections served at once.
    pub slots: Arc<Semaphore>,
    pub max: usize,
    /// Connections accepted past `max`: requests waiting for a slot, and probes.
    overflow: Arc<Semaphore>,
    /// Of those, the requests waiting for a slot (at most `waiting_max`).
    waiting: Arc<Semaphore>,
    waiting_max: usize,
    /// Connections one principal may hold.
    pub share: usize,
    /// Connections held per principal.
    held: Arc<Mutex<HashMap<Caller, usize>>>,
    /// Connections that have sent no request yet.
    pending: Arc<Pending>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Limits {
    pub(super) fn new(read_timeout: Duration, max: usize, share: usize) -> Self {
        let max = max.max(1);
        // A quarter of the cap may wait past it.
        let waiting = (max / 4).max(1);
        Self {
            read_timeout,
            slots: Arc::new(Semaphore::new(max)),
            max,
            overflow: Arc::new(Semaphore::new(waiting + RESERVED)),
            waiting: Arc::new(Semaphore::new(waiting)),
            waiting_max: waiting,
            share: share.clamp(1, max),
            held: Arc::default(),
            pending: Arc::default(),
        }
    }

    /// Connections closed so far because they sent no request while others waited.
    pub(super) fn stalled_closed(&self) -> u64 {
        self.pending.closed()
    }

    /// How many connections are accepted past the cap.
    pub(super) fn overflow(&self) -> usize {
        self.waiting_max + RESERVED
    }

    /// Requests past the cap waiting for a slot now.
    pub(super) fn waiting(&self) -> usize {
        self.waiting_max
            .saturating_sub(self.waiting.available_permits())
    }

    /// Connections open now (those accepted past the cap included).
    pub(super) fn open(&self) -> usize {
        self.max.saturating_sub(self.slots.available_permits())
            + self
                .overflow()
                .saturating_sub(self.overflow.available_permits())
    }
}

/// One connection: the principal whose share it counts in, if any.
pub(super) struct Conn {
    principal: Mutex<Option<Caller>>,
    held: Arc<Mutex<HashMap<Caller, usize>>>,
    share: usize,
}

impl Conn {
    /// Count this connection in `caller`'s share (it carries a request of theirs); false
    /// when their share is full with other connections.
    pub(super) fn attribute(&self, caller: &Caller) -> bool {
        let mut mine = lock(&self.principal);
        if mine.as_ref() == Some(caller) {
            return true;
        }
        let mut held = lock(&self.held);
        let n = held.get(caller).copied().unwrap_or(0);
        if n >= self.share {
            return false;
        }
        held.insert(caller.clone(), n + 1);
        if let Some(previous) = mine.take() {
            release(&mut held, &previous);
        }
        *mine = Some(caller.clone());
        true
    }
}

fn release(held: &mut HashMap<Caller, usize>, caller: &Caller) {
    if let Some(n) = held.get_mut(caller) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            held.remove(caller);
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(p) = lock(&self.principal).take() {
            release(&mut lock(&self.held), &p);
        }
    }
}

tokio::task_local! {
    /// The connection a request arrived on: hyper serves each connection's requests
    /// within the connection's task, where this is set.
    pub(super) static CONN: Arc<Conn>;
}

/// A connection accepted past the cap: its place, then, once a request of it needs one, a
/// slot (held until it closes).
struct Overflow {
    limits: Limits,
    place: Held,
    slot: tokio::sync::Mutex<Option<Slot>>,
}

impl Overflow {
    /// Wait for a slot, unless this connection holds one already; false when too many
    /// requests wait already.
    async fn slot(&self) -> bool {
        let mut slot = self.slot.lock().await;
        if slot.is_some() {
            return true;
        }
        let Ok(_waiting) = self.limits.waiting.clone().try_acquire_owned() else {
            return false;
        };
        // A slot that frees, or one a stalled connection gives up.
        let permit = tokio::select! {
            permit = self.limits.slots.clone().acquire_owned() => match permit {
                Ok(p) => Slot::General(p),
                Err(_) => return false, // the semaphore is never closed
            },
            taken = self.limits.pending.take(true) => taken,
        };
        *slot = Some(permit);
        // Counted as a served connection now, no longer past the cap.
        lock(&self.place).take();
        true
    }
}

/// The answer to a request past the cap when too many wait already.
fn busy(max: usize) -> axum::response::Response {
    use axum::http::{HeaderValue, StatusCode, header};
    let mut r = axum::response::Response::new(axum::body::Body::from(format!(
        "Service Unavailable: all {max} connections this server serves at once are in use \
         (--http-max-connections) and others wait already; retry shortly"
    )));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Serve `router` on `listener` until `stop`; then stop accepting and let the open
/// connections finish their requests. Dropping the returned future (aborting its task)
/// drops every connection.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    admits: Admits,
    stop: CancellationToken,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout);
    // Past the cap: a short time to send the request, and one request per connection.
    let mut overflow_http = hyper::server::conn::http1::Builder::new();
    overflow_http
        .timer(TokioTimer::new())
        .header_read_timeout(OVERFLOW_READ_TIMEOUT.min(limits.read_timeout))
        .keep_alive(false);
    let builders = Builders {
        http,
        overflow_http,
        graceful: GracefulShutdown::new(),
        admits,
    };
    let mut conns = JoinSet::new();
    while let Some((slot, accepted)) = next_slot(&listener, &limits, &stop).await {
        let accepted = match accepted {
            Some(a) => a,
            None => tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            },
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors or memory for a moment: wait rather than spin.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // A slot freed while this one waited in accept: serve it in full.
        let slot = match slot {
            Slot::Overflow(p) => match limits.slots.clone().try_acquire_owned() {
                Ok(s) => {
                    drop(p);
                    Slot::General(s)
                }
                Err(_) => Slot::Overflow(p),
            },
            general => general,
        };
        let _ = stream.set_nodelay(true);
        conns.spawn(connection(&builders, stream, slot, &router, &limits));
        // Forget the connections that ended.
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    // Open connections finish the request they are serving, then close.
    builders.graceful.shutdown().await;
    conns.shutdown().await;
}

/// The two ways a connection is served, and the shutdown that watches them all.
struct Builders {
    http: hyper::server::conn::http1::Builder,
    overflow_http: hyper::server::conn::http1::Builder,
    graceful: GracefulShutdown,
    admits: Admits,
}

type Accepted = std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)>;

/// The slot (or place past the cap) the next connection gets, and the connection when it
/// was accepted already; None once `stop`. A slot first, then the connection: past the cap
/// (and the places past it), connections wait unaccepted, unless a connection that sends
/// nothing holds a slot.
async fn next_slot(
    listener: &TcpListener,
    limits: &Limits,
    stop: &CancellationToken,
) -> Option<(Slot, Option<Accepted>)> {
    let either = || async {
        tokio::select! {
            slot = limits.slots.clone().acquire_owned() => slot.map(Slot::General),
            place = limits.overflow.clone().acquire_owned() => place.map(Slot::Overflow),
        }
    };
    tokio::select! {
        biased;
        _ = stop.cancelled() => None,
        // The semaphores are never closed.
        slot = either() => Some((slot.ok()?, None)),
        accepted = async {
            limits.pending.stalled().await;
            listener.accept().await
        } => {
            // Everything is held, one place by a connection that sends nothing, and a
            // client is at the door: it takes that place.
            let slot = tokio::select! {
                biased;
                _ = stop.cancelled() => return None,
                slot = either() => slot.ok()?,
                taken = limits.pending.take(false) => taken,
            };
            Some((slot, Some(accepted)))
        }
    }
}

/// Serve one connection in `slot` until it ends, or, while it has sent no request, until a
/// connection that waits takes its slot.
fn connection(
    b: &Builders,
    stream: tokio::net::TcpStream,
    slot: Slot,
    router: &Router,
    limits: &Limits,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let tag = Arc::new(Conn {
        principal: Mutex::new(None),
        held: limits.held.clone(),
        share: limits.share,
    });
    let general = matches!(slot, Slot::General(_));
    let held: Held = Arc::new(Mutex::new(Some(slot)));
    let close = CancellationToken::new();
    let pending = limits.pending.clone();
    let id = pending.add(held.clone(), close.clone());
    // Its first request ends its pending state: later ones skip the registry's lock.
    let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first_request = {
        let pending = pending.clone();
        move || {
            if !sent.swap(true, std::sync::atomic::Ordering::Relaxed) {
                pending.remove(id);
            }
        }
    };
    let io = TokioIo::new(Clocked::new(stream, pending.clone(), id));
    let inner = TowerToHyperService::new(router.clone());
    let serving = if general {
        serve_general(b, io, inner, &first_request)
    } else {
        serve_overflow(b, io, inner, &first_request, limits, &held)
    };
    CONN.scope(tag, async move {
        tokio::select! {
            // A timed-out or broken connection is the client's; nothing to report.
            ended = serving => if let Err(e) = ended {
                tracing::debug!("HTTP connection ended: {e}");
            },
            _ = close.cancelled() => {}
        }
        pending.remove(id);
        // The slot (or the place, if an overflow connection's request never took a slot)
        // frees here, unless a waiting connection took it.
        drop(held);
    })
}

/// A connection being served, boxed: the general and the overflow ones differ in type.
type Serving = std::pin::Pin<Box<dyn std::future::Future<Output = hyper::Result<()>> + Send>>;

/// A connection in a slot: served in full, closed after an answer that carried no
/// principal.
fn serve_general(
    b: &Builders,
    io: TokioIo<Clocked>,
    inner: TowerToHyperService<Router>,
    first_request: &(impl Fn() + Clone + Send + 'static),
) -> Serving {
    let first_request = first_request.clone();
    let service = hyper::service::service_fn(move |req| {
        first_request();
        let call = hyper::service::Service::call(&inner, req);
        async move {
            let mut response = call.await?;
            // Kept open, a connection that counts in no principal's share (a probe's,
            // a refusal's, a request for no route) would hold its slot unbounded,
            // and it is no longer pending: it closes after its answer.
            if CONN
                .try_with(|c| lock(&c.principal).is_none())
                .unwrap_or(true)
            {
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    Box::pin(b.graceful.watch(b.http.serve_connection(io, service)))
}

/// A connection past the cap, in the place `held`: probes and requests without a principal
/// are answered at once, any other request waits for a slot or is answered 503.
fn serve_overflow(
    b: &Builders,
    io: TokioIo<Clocked>,
    inner: TowerToHyperService<Router>,
    first_request: &(impl Fn() + Clone + Send + 'static),
    limits: &Limits,
    held: &Held,
) -> Serving {
    let state = Arc::new(Overflow {
        limits: limits.clone(),
        place: held.clone(),
        slot: tokio::sync::Mutex::new(None),
    });
    let max = limits.max;
    let first_request = first_request.clone();
    let admits = b.admits.clone();
    let service = hyper::service::service_fn(move |req| {
        first_request();
        let state = state.clone();
        let inner = inner.clone();
        let waits = !is_probe(req.uri().path()) && admits(req.headers());
        async move {
            if waits && !state.slot().await {
                return Ok(busy(max));
            }
            hyper::service::Service::call(&inner, req).await
        }
    });
    Box::pin(
        b.graceful
            .watch(b.overflow_http.serve_connection(io, service)),
    )
}
