//! The etcd registry, over etcd's JSON gateway (`/v3/...`, keys and values in base64) with
//! the HTTP client the server already has: no gRPC stack, no protoc. Each call goes to the
//! endpoint that answered last, else to the next one that answers (a dead member costs
//! one failed call, not one per call).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use super::{Fut, Kv, Registry};

/// Longest one registry call may take on one endpoint.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Etcd {
    endpoints: Vec<String>,
    /// The endpoint that answered last: tried first.
    preferred: AtomicUsize,
    http: reqwest::Client,
}

impl Etcd {
    pub fn new(endpoints: &[String]) -> anyhow::Result<Self> {
        let mut out = Vec::new();
        for e in endpoints {
            let e = e.trim().trim_end_matches('/');
            if !e.starts_with("http://") && !e.starts_with("https://") {
                anyhow::bail!("--cluster {e:?}: an etcd client URL, such as http://127.0.0.1:2379");
            }
            out.push(e.to_string());
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(CALL_TIMEOUT)
            .build()?;
        Ok(Self {
            endpoints: out,
            preferred: AtomicUsize::new(0),
            http,
        })
    }

    /// POST `body` to `path` on the first endpoint that answers, from the one that answered
    /// last; etcd's error as an error.
    async fn call(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let body = serde_json::to_vec(&body)?;
        let mut last = None;
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed);
        for i in (0..n).map(|k| (first + k) % n) {
            let e = &self.endpoints[i];
            let sent = self
                .http
                .post(format!("{e}{path}"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            let resp = match sent {
                Ok(r) => r,
                Err(err) => {
                    last = Some(anyhow::anyhow!("etcd {e}: {err}"));
                    continue;
                }
            };
            self.preferred.store(i, Ordering::Relaxed);
            let bytes = resp.bytes().await?;
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|err| anyhow::anyhow!("etcd {e}{path}: not JSON ({err})"))?;
            if let Some(msg) = v.get("error").and_then(Value::as_str) {
                anyhow::bail!("etcd {e}{path}: {msg}");
            }
            return Ok(v);
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no etcd endpoint")))
    }

    /// Put `key` under `lease` in one transaction, only where `compare` holds: the revision
    /// of the write, or `None` when it did not hold (creation and compare-and-swap).
    fn put_if(
        &self,
        compare: Value,
        key: String,
        value: Vec<u8>,
        lease: i64,
    ) -> Fut<'_, Option<i64>> {
        Box::pin(async move {
            let k = b64(key.as_bytes());
            let v = self
                .call(
                    "/v3/kv/txn",
                    json!({
                        "compare": [compare],
                        "success": [{"request_put": {"key": k, "value": b64(&value), "lease": lease.to_string()}}],
                    }),
                )
                .await?;
            // proto3 JSON leaves a false `succeeded` out.
            if v["succeeded"].as_bool() == Some(true) {
                Ok(Some(int(&v["header"]["revision"])))
            } else {
                Ok(None)
            }
        })
    }
}

/// An int64 of the gateway's JSON (a string), 0 when absent.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn b64(s: &[u8]) -> String {
    B64.encode(s)
}

impl Registry for Etcd {
    fn grant(&self, ttl: Duration) -> Fut<'_, i64> {
        Box::pin(async move {
            let v = self
                .call("/v3/lease/grant", json!({"TTL": ttl.as_secs().to_string()}))
                .await?;
            match int(&v["ID"]) {
                0 => anyhow::bail!("etcd granted no lease"),
                id => Ok(id),
            }
        })
    }

    fn keep_alive(&self, lease: i64) -> Fut<'_, bool> {
        Box::pin(async move {
            let v = self
                .call("/v3/lease/keepalive", json!({"ID": lease.to_string()}))
                .await?;
            // A lease that is gone is renewed with no TTL.
            Ok(int(&v["result"]["TTL"]) > 0)
        })
    }

    fn revoke(&self, lease: i64) -> Fut<'_, ()> {
        Box::pin(async move {
            self.call("/v3/lease/revoke", json!({"ID": lease.to_string()}))
                .await?;
            Ok(())
        })
    }

    fn put(&self, key: String, value: Vec<u8>, lease: i64) -> Fut<'_, ()> {
        Box::pin(async move {
            self.call(
                "/v3/kv/put",
                json!({"key": b64(key.as_bytes()), "value": b64(&value), "lease": lease.to_string()}),
            )
            .await?;
            Ok(())
        })
    }

    fn get(&self, key: String) -> Fut<'_, Option<Kv>> {
        Box::pin(async move {
            let v = self
                .call("/v3/kv/range", json!({"key": b64(key.as_bytes())}))
                .await?;
            let Some(kv) = v["kvs"].as_array().and_then(|a| a.first()) else {
                return Ok(None);
            };
            let value = kv["value"].as_str().unwrap_or("");
            Ok(Some(Kv {
                value: B64.decode(value)?,
                create_revision: int(&kv["create_revision"]),
                mod_revision: int(&kv["mod_revision"]),
                lease: int(&kv["lease"]),
            }))
        })
    }

    fn create(&self, key: String, value: Vec<u8>, lease: i64) -> Fut<'_, Option<i64>> {
        let compare = json!({"target": "CREATE", "key": b64(key.as_bytes()), "create_revision": "0", "result": "EQUAL"});
        self.put_if(compare, key, value, lease)
    }

    fn delete_held(&self, key: String, lease: i64) -> Fut<'_, ()> {
        Box::pin(async move {
            let k = b64(key.as_bytes());
            self.call(
                "/v3/kv/txn",
                json!({
                    "compare": [{"target": "LEASE", "key": k, "lease": lease.to_string(), "result": "EQUAL"}],
                    "success": [{"request_delete_range": {"key": k}}],
                }),
            )
            .await?;
            Ok(())
        })
    }

    fn replace(
        &self,
        key: String,
        value: Vec<u8>,
        lease: i64,
        revision: i64,
    ) -> Fut<'_, Option<i64>> {
        let compare = json!({"target": "MOD", "key": b64(key.as_bytes()), "mod_revision": revision.to_string(), "result": "EQUAL"});
        self.put_if(compare, key, value, lease)
    }

    fn keys(&self, prefix: String) -> Fut<'_, Vec<String>> {
        Box::pin(async move {
            let v = self
                .call(
                    "/v3/kv/range",
                    json!({
                        "key": b64(prefix.as_bytes()),
                        "range_end": b64(&prefix_end(prefix.as_bytes())),
                        "keys_only": true,
                    }),
                )
                .await?;
            let mut out = Vec::new();
            for kv in v["kvs"].as_array().into_iter().flatten() {
                let key = B64.decode(kv["key"].as_str().unwrap_or(""))?;
                if let Ok(key) = String::from_utf8(key) {
                    out.push(key);
                }
            }
            Ok(out)
        })
    }
}

/// The end of the range of keys starting with `prefix` (etcd's convention: the prefix with
/// its last byte that is not 0xff incremented).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key: etcd's "\0".
    vec![0]
}
