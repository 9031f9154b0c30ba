//! MCP logging: a client that sent `logging/setLevel` receives, as `notifications/message`,
//! the server's log events of its own tool calls at that level or above, and nothing else.
//!
//! How an event finds its client: each tool call of such a client runs inside a task-local
//! [`Sink`] (see [`forward`]); the tracing layer of [`layer`] looks for that sink in the task
//! that emitted the event. Events of other tasks (another client's calls, the idle reaper,
//! the warm pool) have no sink, or another one, so they never reach this client. Only the
//! server's own events are forwarded (targets `replbox…`), at most [`MAX_PER_CALL`] per
//! call, each field cut to [`MAX_FIELD`] bytes.
#![allow(deprecated)] // MCP logging is deprecated by SEP-2577 but still in use by clients.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::{Peer, RoleServer};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, Filter};

/// Notifications one call may send; more are dropped.
pub const MAX_PER_CALL: usize = 256;
/// Bytes of one field's value in a notification.
pub const MAX_FIELD: usize = 2048;

/// How long a finished call waits for its notifications to be handed to the transport.
const FLUSH: Duration = Duration::from_secs(2);

/// MCP's levels, least severe first.
fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

fn mcp_level(level: &tracing::Level) -> LoggingLevel {
    match *level {
        tracing::Level::ERROR => LoggingLevel::Error,
        tracing::Level::WARN => LoggingLevel::Warning,
        tracing::Level::INFO => LoggingLevel::Info,
        _ => LoggingLevel::Debug,
    }
}

/// The level one connection asked for (none until it sends `logging/setLevel`: until then
/// it gets no log notifications).
#[derive(Clone, Default)]
pub(super) struct ClientLevel(Arc<AtomicU8>);

impl ClientLevel {
    const UNSET: u8 = u8::MAX;

    pub(super) fn new() -> Self {
        Self(Arc::new(AtomicU8::new(Self::UNSET)))
    }

    pub(super) fn set(&self, level: LoggingLevel) {
        self.0.store(rank(level), Ordering::Relaxed);
    }

    /// The least severe rank the client wants, if it asked for logs.
    fn min(&self) -> Option<u8> {
        Some(self.0.load(Ordering::Relaxed)).filter(|r| *r != Self::UNSET)
    }
}

/// Where the events of one call go.
struct Sink {
    min: u8,
    tx: mpsc::Sender<LoggingMessageNotificationParam>,
}

tokio::task_local! {
    static SINK: Sink;
}

/// Run one tool call of a client; when the client asked for logs, its events become
/// notifications to `peer`, sent in order while it runs and all handed over before the
/// call's result (bounded by a short wait).
pub(super) async fn forward<F: Future>(
    level: &ClientLevel,
    peer: &Peer<RoleServer>,
    call: F,
) -> F::Output {
    let Some(min) = level.min() else {
        return call.await;
    };
    let (tx, mut rx) = mpsc::channel(MAX_PER_CALL);
    let peer = peer.clone();
    let sender = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if peer.notify_logging_message(m).await.is_err() {
                break;
            }
        }
    });
    let out = SINK.scope(Sink { min, tx }, call).await;
    // The sink, and with it the sender, ended with the scope: the task stops once the
    // queue is empty.
    let _ = tokio::time::timeout(FLUSH, sender).await;
    out
}

/// The tracing layer that hands events to the sink of the call they belong to.
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    ToClient.with_filter(Wanted)
}

struct ToClient;

/// Only the server's events, only inside a call whose client wants that level. Decided per
/// event (`Interest::sometimes`), since it depends on the task.
struct Wanted;

impl<S> Filter<S> for Wanted {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        meta.is_event()
            && meta.target().starts_with("replbox")
            && SINK
                .try_with(|s| rank(mcp_level(meta.level())) >= s.min)
                .unwrap_or(false)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if meta.is_event() && meta.target().starts_with("replbox") {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }
}

impl<S: Subscriber> Layer<S> for ToClient {
    fn on_event(&self, event: &Event<'_>, _cx: Context<'_, S>) {
        let _ = SINK.try_with(|sink| {
            let mut fields = Fields(Map::new());
            event.record(&mut fields);
            let meta = event.metadata();
            let m = LoggingMessageNotificationParam::new(
                mcp_level(meta.level()),
                Value::Object(fields.0),
            )
            .with_logger(meta.target());
            // A full queue drops the event rather than slow the call.
            let _ = sink.tx.try_send(m);
        });
    }
}

/// An event's fields as JSON, each value bounded.
struct Fields(Map<String, Value>);

fn bounded(mut s: String) -> String {
    if s.len() > MAX_FIELD {
        let mut cut = MAX_FIELD;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), bounded(format!("{value:?}")).into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let v = if value.len() > MAX_FIELD {
            bounded(value.to_string())
        } else {
            value.to_string()
        };
        self.0.insert(field.name().into(), v.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    /// Events inside a sink's scope reach it at its level; events outside any scope, or
    /// below the level, or of another target, do not.
    #[tokio::test]
    async fn events_reach_only_the_sink_of_their_call() {
        let subscriber = tracing_subscriber::registry().with(layer());
        let _default = tracing::subscriber::set_default(subscriber);
        let (tx, mut rx) = mpsc::channel(MAX_PER_CALL);
        let sink = Sink {
            min: rank(LoggingLevel::Info),
            tx,
        };
        tracing::info!(target: "replbox::test", "before any call");
        SINK.scope(sink, async {
            tracing::info!(target: "replbox::test", n = 7, "inside the call");
            tracing::debug!(target: "replbox::test", "below the level");
            tracing::warn!(target: "rmcp::service", "not the server's");
            tracing::warn!(target: "replbox::test", long = %"x".repeat(5000), "bounded");
        })
        .await;
        let first = rx.recv().await.expect("the info event");
        assert_eq!(first.level, LoggingLevel::Info);
        assert_eq!(first.logger.as_deref(), Some("replbox::test"));
        assert_eq!(first.data["message"], "inside the call");
        assert_eq!(first.data["n"], 7);
        let second = rx.recv().await.expect("the warning");
        assert_eq!(second.level, LoggingLevel::Warning);
        let long = second.data["long"].as_str().unwrap_or_default();
        assert!(long.len() <= MAX_FIELD + '…'.len_utf8(), "{}", long.len());
        assert!(rx.recv().await.is_none(), "nothing else");
    }

    #[test]
    fn levels_rank_in_mcp_order() {
        let l = ClientLevel::new();
        assert_eq!(l.min(), None, "no logs until the client asks");
        l.set(LoggingLevel::Notice);
        assert_eq!(l.min(), Some(2));
        assert!(rank(mcp_level(&tracing::Level::WARN)) >= 2);
        assert!(rank(mcp_level(&tracing::Level::INFO)) < 2);
    }
}
