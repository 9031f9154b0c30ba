//! The server's metrics in the Prometheus text format (`GET /metrics` on the HTTP
//! listener), through `prometheus-client`. Every name starts with `replbox_`. Counters and
//! histograms are recorded as calls end; gauges are set from the server's state just before
//! each scrape ([`Gauges`]). Label values come from the server's own vocabulary (tool
//! names, statuses, language ids), never from a caller's free text, so their number is
//! bounded.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LanguageLabel {
    language: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabel {
    level: String,
}

type Durations = Family<LanguageLabel, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    server: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

/// Code mode's metrics: calls to upstream MCP servers by server (the operator's names) and
/// status (the server's words), and their durations. A handle on families the registry
/// holds, for the upstream module to record into.
#[derive(Clone)]
pub struct UpstreamMetrics {
    calls: Family<UpstreamLabels, Counter>,
    duration: Family<ServerLabel, Histogram, fn() -> Histogram>,
}

impl UpstreamMetrics {
    /// A call to `server`'s tool ended with `status` after `seconds`.
    pub fn upstream_call(&self, server: &str, status: &str, seconds: f64) {
        self.calls
            .get_or_create(&UpstreamLabels {
                server: server.to_string(),
                status: status.to_string(),
            })
            .inc();
        self.duration
            .get_or_create(&ServerLabel {
                server: server.to_string(),
            })
            .observe(seconds);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: String,
}

/// Packages on demand's metrics: installations by where they were answered from
/// (`cache`: the shared cache alone, offline; `index`: the index was asked), and packages
/// put in a layer from the cache (hits) or downloaded (misses).
#[derive(Clone, Default)]
pub struct PackageMetrics {
    installs: Family<SourceLabel, Counter>,
    hits: Counter,
    misses: Counter,
    bytes: Gauge,
    evictions: Counter,
}

impl PackageMetrics {
    /// An installation answered from the cache alone put `packages` in a layer.
    pub fn offline(&self, packages: usize) {
        self.installs
            .get_or_create(&SourceLabel {
                source: "cache".into(),
            })
            .inc();
        self.hits.inc_by(packages as u64);
    }

    /// An installation that asked the index put `packages` in a layer, `downloaded` of
    /// them fetched.
    pub fn online(&self, packages: usize, downloaded: u32) {
        self.installs
            .get_or_create(&SourceLabel {
                source: "index".into(),
            })
            .inc();
        let downloaded = u64::from(downloaded);
        self.misses.inc_by(downloaded);
        self.hits
            .inc_by((packages as u64).saturating_sub(downloaded));
    }

    /// The shared cache holds `bytes` now.
    pub fn cache_bytes(&self, bytes: u64) {
        self.bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// A package was evicted from the shared cache.
    pub fn evicted(&self) {
        self.evictions.inc();
    }
}

/// Seconds, from a fast evaluation to the longest timeout.
fn durations() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        300.0, 600.0,
    ])
}

/// The levels the sandbox gauge always lists (the one in force is 1).
const LEVELS: [&str; 3] = ["none", "landlock", "bwrap"];

pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    eval: Durations,
    run: Durations,
    sessions_open: Gauge,
    warm_pool: Family<LanguageLabel, Gauge>,
    warm_sessions: Family<LanguageLabel, Gauge>,
    uids_in_use: Gauge,
    sandbox_level: Family<LevelLabel, Gauge>,
    http_connections: Gauge,
    upstream: UpstreamMetrics,
    packages: PackageMetrics,
    /// One scrape at a time: gauges are set, then encoded.
    scrape: Mutex<()>,
}

/// The state gauges show, read by the caller just before a scrape.
pub struct Gauges<'a> {
    pub sessions_open: usize,
    /// Ready interpreters per language with a warm pool.
    pub warm_pool: Vec<(String, usize)>,
    /// Warm sessions ready per session language.
    pub warm_sessions: Vec<(String, usize)>,
    /// Sandbox uids this server holds (0 when it does not run as root).
    pub uids_in_use: usize,
    pub sandbox_level: &'a str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("replbox");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "tool_calls",
            "Tool calls that ended, by tool and status (ok, an error kind, an evaluation status)",
            calls.clone(),
        );
        let eval: Durations = Family::new_with_constructor(durations);
        registry.register_with_unit(
            "eval_duration",
            "Duration of session evaluations (session_eval, session_input), by language",
            Unit::Seconds,
            eval.clone(),
        );
        let run: Durations = Family::new_with_constructor(durations);
        registry.register_with_unit(
            "run_duration",
            "Duration of run-code runs, by language",
            Unit::Seconds,
            run.clone(),
        );
        let sessions_open = Gauge::default();
        registry.register(
            "sessions_open",
            "REPL sessions open, all principals",
            sessions_open.clone(),
        );
        let warm_pool = Family::<LanguageLabel, Gauge>::default();
        registry.register(
            "warm_pool_size",
            "Interpreters ready in the warm pool, by language",
            warm_pool.clone(),
        );
        let warm_sessions = Family::<LanguageLabel, Gauge>::default();
        registry.register(
            "warm_sessions",
            "Sessions started ahead of time and ready (--session-pool), by language",
            warm_sessions.clone(),
        );
        let uids_in_use = Gauge::default();
        registry.register(
            "uids_in_use",
            "Sandbox user ids held by sessions, runs and pooled interpreters",
            uids_in_use.clone(),
        );
        let sandbox_level = Family::<LevelLabel, Gauge>::default();
        registry.register(
            "sandbox_level",
            "The sandbox level in force (1) among all levels (0)",
            sandbox_level.clone(),
        );
        let http_connections = Gauge::default();
        registry.register(
            "http_connections",
            "HTTP connections open on the listener",
            http_connections.clone(),
        );
        let upstream = UpstreamMetrics {
            calls: Family::default(),
            duration: Family::new_with_constructor(durations),
        };
        registry.register(
            "upstream_tool_calls",
            "Tool calls code made to upstream MCP servers (code mode), by server and status",
            upstream.calls.clone(),
        );
        registry.register_with_unit(
            "upstream_call_duration",
            "Duration of code's tool calls to upstream MCP servers, by server",
            Unit::Seconds,
            upstream.duration.clone(),
        );
        let packages = PackageMetrics::default();
        registry.register(
            "package_installs",
            "Package installations (packages, %pip), by source: cache (offline) or index",
            packages.installs.clone(),
        );
        registry.register(
            "package_cache_hits",
            "Packages put in a layer from the shared cache, without a download",
            packages.hits.clone(),
        );
        registry.register(
            "package_cache_misses",
            "Packages the installer downloaded from the index",
            packages.misses.clone(),
        );
        registry.register_with_unit(
            "package_cache",
            "Size of the shared package cache (uv's and npm's), as last measured",
            Unit::Bytes,
            packages.bytes.clone(),
        );
        registry.register(
            "package_cache_evictions",
            "Packages evicted from the shared cache to keep it under --package-cache-mb",
            packages.evictions.clone(),
        );
        Self {
            registry,
            upstream,
            packages,
            calls,
            eval,
            run,
            sessions_open,
            warm_pool,
            warm_sessions,
            uids_in_use,
            sandbox_level,
            http_connections,
            scrape: Mutex::new(()),
        }
    }

    /// A tool call ended with `status`.
    pub fn call(&self, tool: &str, status: &str) {
        self.calls
            .get_or_create(&CallLabels {
                tool: tool.to_string(),
                status: status.to_string(),
            })
            .inc();
    }

    /// An evaluation of a `language` session took `seconds`.
    pub fn eval(&self, language: &str, seconds: f64) {
        self.eval
            .get_or_create(&LanguageLabel {
                language: language.to_string(),
            })
            .observe(seconds);
    }

    /// A `language` run took `seconds`.
    pub fn run(&self, language: &str, seconds: f64) {
        self.run
            .get_or_create(&LanguageLabel {
                language: language.to_string(),
            })
            .observe(seconds);
    }

    /// Where packages on demand records its installations.
    pub fn packages(&self) -> PackageMetrics {
        self.packages.clone()
    }

    /// Where code mode records its calls.
    pub fn upstream(&self) -> UpstreamMetrics {
        self.upstream.clone()
    }

    /// The number of open HTTP connections.
    pub fn set_http_connections(&self, n: usize) {
        self.http_connections.set(n as i64);
    }

    /// Everything, in the Prometheus text format (version 0.0.4), with the gauges set to
    /// `now`.
    pub fn encode(&self, now: Gauges<'_>) -> String {
        let _one = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.sessions_open.set(now.sessions_open as i64);
        for (language, ready) in now.warm_pool {
            self.warm_pool
                .get_or_create(&LanguageLabel { language })
                .set(ready as i64);
        }
        for (language, ready) in now.warm_sessions {
            self.warm_sessions
                .get_or_create(&LanguageLabel { language })
                .set(ready as i64);
        }
        self.uids_in_use.set(now.uids_in_use as i64);
        for level in LEVELS {
            self.sandbox_level
                .get_or_create(&LevelLabel {
                    level: level.to_string(),
                })
                .set(i64::from(level == now.sandbox_level));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// The `Content-Type` of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_labels_and_values() {
        let m = Metrics::new();
        m.call("run-code", "ok");
        m.call("run-code", "ok");
        m.call("session_eval", "timeout");
        m.run("python", 0.003);
        m.eval("ruby", 2.0);
        m.upstream().upstream_call("everything", "ok", 0.002);
        m.packages().online(3, 2);
        m.packages().offline(3);
        m.packages().cache_bytes(1234);
        m.packages().evicted();
        let text = m.encode(Gauges {
            sessions_open: 3,
            warm_pool: vec![("python".into(), 2)],
            warm_sessions: vec![("python".into(), 1)],
            uids_in_use: 5,
            sandbox_level: "bwrap",
        });
        for line in [
            "# TYPE replbox_tool_calls_total counter",
            "replbox_tool_calls_total{tool=\"run-code\",status=\"ok\"} 2",
            "replbox_package_installs_total{source=\"index\"} 1",
            "replbox_package_installs_total{source=\"cache\"} 1",
            "replbox_package_cache_hits_total 4",
            "replbox_package_cache_misses_total 2",
            "replbox_package_cache_bytes 1234",
            "replbox_package_cache_evictions_total 1",
            "replbox_tool_calls_total{tool=\"session_eval\",status=\"timeout\"} 1",
            "# TYPE replbox_run_duration_seconds histogram",
            "replbox_run_duration_seconds_count{language=\"python\"} 1",
            "replbox_run_duration_seconds_bucket{language=\"python\",le=\"0.005\"} 1",
            "replbox_eval_duration_seconds_sum{language=\"ruby\"} 2.0",
            "replbox_sessions_open 3",
            "replbox_warm_sessions{language=\"python\"} 1",
            "replbox_warm_pool_size{language=\"python\"} 2",
            "replbox_uids_in_use 5",
            "replbox_sandbox_level{level=\"bwrap\"} 1",
            "replbox_sandbox_level{level=\"none\"} 0",
            "replbox_http_connections 0",
            "replbox_upstream_tool_calls_total{server=\"everything\",status=\"ok\"} 1",
            "replbox_upstream_call_duration_seconds_count{server=\"everything\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
        assert!(!text.contains("# EOF"), "Prometheus text, not OpenMetrics");
    }
}
