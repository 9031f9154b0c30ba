//! A small MCP server for code mode's tests and benchmark: tools that add, echo, fail,
//! take their time, return large or binary results, count the calls this process served,
//! and end the process. Over stdio by default; `--http 127.0.0.1:0` serves streamable HTTP
//! and prints `listening on http://ADDR/mcp` on stdout. `--require-header NAME:VALUE` (HTTP)
//! refuses requests without that header.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ErrorData, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

#[derive(Deserialize, JsonSchema)]
struct AddParams {
    /// First addend
    a: i64,
    /// Second addend
    b: i64,
}

#[derive(Serialize, JsonSchema)]
struct Sum {
    sum: i64,
}

#[derive(Deserialize, JsonSchema)]
struct TextParams {
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct SlowParams {
    /// How long to take, in ms
    ms: u64,
}

#[derive(Deserialize, JsonSchema)]
struct BigParams {
    /// Bytes of text to return
    bytes: usize,
}

#[derive(Serialize, JsonSchema)]
struct Count {
    calls: u64,
    pid: u32,
}

#[derive(Deserialize, JsonSchema)]
struct CityParams {
    city: String,
}

/// A made-up weather report: a realistic record (what a chain of calls gathers).
#[derive(Serialize, JsonSchema)]
struct Weather {
    city: String,
    temperature: f64,
    conditions: String,
    humidity: u32,
    wind_kmh: u32,
    forecast: Vec<Day>,
}

#[derive(Serialize, JsonSchema)]
struct Day {
    day: u32,
    high: f64,
    low: f64,
    conditions: String,
}

#[derive(Clone)]
struct Probe {
    tool_router: ToolRouter<Probe>,
    calls: Arc<AtomicU64>,
}

#[tool_router]
impl Probe {
    fn new() -> Self {
        Self {
            tool_router: Self::tool_router(),
            calls: Arc::new(AtomicU64::new(0)),
        }
    }

    fn served(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::SeqCst) + 1
    }

    #[tool(description = "Add two integers")]
    async fn add(&self, Parameters(p): Parameters<AddParams>) -> Json<Sum> {
        self.served();
        Json(Sum { sum: p.a + p.b })
    }

    #[tool(description = "Return the text as given")]
    async fn echo(&self, Parameters(p): Parameters<TextParams>) -> String {
        self.served();
        p.text
    }

    #[tool(description = "Report an error with the text (isError)")]
    async fn fail(&self, Parameters(p): Parameters<TextParams>) -> CallToolResult {
        self.served();
        CallToolResult::error(vec![ContentBlock::text(p.text)])
    }

    #[tool(description = "Answer after ms milliseconds (stops when cancelled)")]
    async fn slow(&self, Parameters(p): Parameters<SlowParams>, ct: CancellationToken) -> String {
        self.served();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(p.ms)) => format!("slept {} ms", p.ms),
            _ = ct.cancelled() => {
                eprintln!("upstream_probe: slow cancelled");
                "cancelled".into()
            }
        }
    }

    #[tool(description = "Return that many bytes of text")]
    async fn big(&self, Parameters(p): Parameters<BigParams>) -> String {
        self.served();
        "x".repeat(p.bytes.min(64 << 20))
    }

    #[tool(description = "The weather in a city, with a five-day forecast (made up)")]
    async fn weather(&self, Parameters(p): Parameters<CityParams>) -> Json<Weather> {
        self.served();
        let seed = p
            .city
            .bytes()
            .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
        let sky = ["sunny", "cloudy", "rain", "snow", "fog"];
        let t = (seed % 35) as f64 - 5.0;
        Json(Weather {
            conditions: sky[(seed % 5) as usize].into(),
            temperature: t,
            humidity: 30 + seed % 60,
            wind_kmh: seed % 40,
            forecast: (1..=5)
                .map(|d| Day {
                    day: d,
                    high: t + d as f64,
                    low: t - 8.0 + d as f64,
                    conditions: sky[((seed + d) % 5) as usize].into(),
                })
                .collect(),
            city: p.city,
        })
    }

    #[tool(description = "A 1x1 PNG image")]
    async fn image(&self) -> CallToolResult {
        self.served();
        const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
        CallToolResult::success(vec![ContentBlock::image(PNG, "image/png")])
    }

    #[tool(description = "How many calls this process served, and its pid")]
    async fn count(&self) -> Json<Count> {
        Json(Count {
            calls: self.served(),
            pid: std::process::id(),
        })
    }

    #[tool(description = "End this process at once (exit 3)")]
    async fn crash(&self) -> Result<String, ErrorData> {
        eprintln!("upstream_probe: crashing on request");
        std::process::exit(3)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Probe {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("upstream-probe", "0.1.0"))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    match flag("--http") {
        None => {
            let service = Probe::new().serve(rmcp::transport::stdio()).await?;
            service.waiting().await?;
        }
        Some(addr) => {
            use rmcp::transport::streamable_http_server::{
                StreamableHttpServerConfig, StreamableHttpService,
                session::local::LocalSessionManager,
            };
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            let local = listener.local_addr()?;
            let ct = CancellationToken::new();
            let config =
                StreamableHttpServerConfig::default().with_cancellation_token(ct.child_token());
            // One server state for every MCP session, so `count` counts them all.
            let probe = Probe::new();
            let service: StreamableHttpService<Probe, LocalSessionManager> =
                StreamableHttpService::new(
                    move || Ok(probe.clone()),
                    Arc::new(LocalSessionManager::default()),
                    config,
                );
            let required = flag("--require-header").and_then(|h| {
                h.split_once(':')
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            });
            let app =
                axum::Router::new()
                    .nest_service("/mcp", service)
                    .layer(axum::middleware::from_fn(
                        move |req: axum::extract::Request, next: axum::middleware::Next| {
                            let required = required.clone();
                            async move {
                                if let Some((k, v)) = &required
                                    && req.headers().get(k.as_str()).and_then(|x| x.to_str().ok())
                                        != Some(v.as_str())
                                {
                                    return axum::response::IntoResponse::into_response((
                                        axum::http::StatusCode::UNAUTHORIZED,
                                        "missing header",
                                    ));
                                }
                                next.run(req).await
                            }
                        },
                    ));
            println!("listening on http://{local}/mcp");
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = tokio::signal::ctrl_c().await;
                    ct.cancel();
                })
                .await?;
        }
    }
    Ok(())
}
