//! Which `Host` and `Origin` headers the HTTP transport serves (DNS-rebinding and browser
//! protection), and whether an address is loopback.

use std::net::{IpAddr, SocketAddr};

use axum::http::{HeaderMap, header};

use crate::sandbox::Level;

/// Without a token every request is the local principal, which may copy host files into a
/// session: a server without tokens refuses to start where user code could reach this host's
/// loopback, since it could call the server back: at level none, and at landlock with any
/// network (the egress proxy listens on the host's loopback there, and Landlock's network
/// rules depend on the kernel). bwrap's network namespace has only its own loopback.
pub(super) fn check_tokenless(level: Level, network: bool) -> anyhow::Result<()> {
    if level == Level::Bwrap || (level == Level::Landlock && !network) {
        return Ok(());
    }
    anyhow::bail!(
        "refusing to serve HTTP without a token at sandbox level {level}{}: user code can \
         reach this host's loopback there, call this server back as the local principal \
         and have it copy files only the server may read. Give tokens with --token, \
         REPLBOX_TOKENS or --tokens-file (user code never sees them), or use a level that \
         keeps user code off the host's loopback (bwrap, or landlock without network)",
        if network { " with network" } else { "" }
    )
}

pub(super) fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Which `Host` header values are served (DNS-rebinding protection).
pub(super) enum HostPolicy {
    Any,
    List {
        raw: Vec<String>,
        parsed: Vec<(String, Option<u16>)>,
    },
}

fn normalize_host(h: &str) -> String {
    h.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// `host` or `host:port` (IPv6 in brackets, or bare without a port).
fn parse_authority(s: &str) -> Option<(String, Option<u16>)> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    match axum::http::uri::Authority::try_from(s) {
        Ok(a) => Some((normalize_host(a.host()), a.port_u16())),
        Err(_) if s.parse::<std::net::Ipv6Addr>().is_ok() => Some((s.to_ascii_lowercase(), None)),
        Err(_) => None,
    }
}

impl HostPolicy {
    pub(super) fn new(configured: &[String], bound: IpAddr) -> anyhow::Result<Self> {
        let configured: Vec<String> = configured
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if configured.iter().any(|h| h == "*") {
            return Ok(Self::Any);
        }
        let raw = if configured.is_empty() {
            let mut d: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
            if !bound.is_unspecified() && !is_loopback(bound) {
                d.push(bound.to_string());
            }
            d
        } else {
            configured
        };
        let parsed = raw
            .iter()
            .map(|h| {
                parse_authority(h).ok_or_else(|| {
                    anyhow::anyhow!("--allowed-host {h:?}: expected HOST or HOST:PORT")
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self::List { raw, parsed })
    }

    pub(super) fn allows(&self, headers: &HeaderMap) -> bool {
        let Self::List { parsed, .. } = self else {
            return true;
        };
        let Some((host, port)) = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_authority)
        else {
            return false;
        };
        parsed
            .iter()
            .any(|(h, p)| *h == host && p.is_none_or(|p| Some(p) == port))
    }
}

/// Which browser `Origin`s are served. Requests without an Origin header (every
/// non-browser MCP client) always pass.
pub(super) struct OriginPolicy {
    allow_null: bool,
    /// (scheme, host, port; None = any port)
    allowed: Vec<(String, String, Option<u16>)>,
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// `scheme://host[:port]` as (scheme, host, port with the scheme's default filled in).
fn parse_origin(s: &str) -> Option<(String, String, Option<u16>)> {
    let uri = axum::http::Uri::try_from(s.trim()).ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let auth = uri.authority()?;
    if uri.path() != "/" && !uri.path().is_empty() {
        return None;
    }
    let port = auth.port_u16().or_else(|| default_port(&scheme));
    Some((scheme, normalize_host(auth.host()), port))
}

/// The origins of a page served from this very listener when it is bound to a loopback
/// address (`http://localhost:PORT`, `http://127.0.0.1:PORT`, `http://[::1]:PORT`): the
/// same origin as the server, which no other site can claim, so a DNS-rebinding page (its
/// own name in `Origin`) is still refused.
pub(super) fn loopback_origins(bound: SocketAddr) -> Vec<String> {
    if !is_loopback(bound.ip()) {
        return Vec::new();
    }
    let port = bound.port();
    ["localhost", "127.0.0.1", "[::1]"]
        .iter()
        .map(|h| format!("http://{h}:{port}"))
        .collect()
}

impl OriginPolicy {
    pub(super) fn new(configured: &[String]) -> anyhow::Result<Self> {
        let mut p = Self {
            allow_null: false,
            allowed: Vec::new(),
        };
        for o in configured
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
        {
            if o.eq_ignore_ascii_case("null") {
                p.allow_null = true;
                continue;
            }
            let bad = || {
                anyhow::anyhow!(
                    "--allowed-origin {o:?}: expected SCHEME://HOST[:PORT] or SCHEME://HOST:*"
                )
            };
            let entry = match o.strip_suffix(":*") {
                Some(base) => {
                    let (scheme, host, _) = parse_origin(base).ok_or_else(bad)?;
                    (scheme, host, None)
                }
                None => parse_origin(o).ok_or_else(bad)?,
            };
            p.allowed.push(entry);
        }
        Ok(p)
    }

    pub(super) fn allows(&self, headers: &HeaderMap) -> bool {
        let Some(v) = headers.get(header::ORIGIN) else {
            return true;
        };
        let Ok(v) = v.to_str() else {
            return false;
        };
        if v.trim().eq_ignore_ascii_case("null") {
            return self.allow_null;
        }
        let Some((scheme, host, port)) = parse_origin(v) else {
            return false;
        };
        self.allowed
            .iter()
            .any(|(s, h, p)| *s == scheme && *h == host && p.is_none_or(|p| Some(p) == port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn host_policy() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let p = HostPolicy::new(&[], lo).unwrap();
        for ok in ["127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:9"] {
            assert!(p.allows(&headers(&[(header::HOST, ok)])), "{ok}");
        }
        for bad in ["evil.example", "127.0.0.2:80", "localhost.evil.example"] {
            assert!(!p.allows(&headers(&[(header::HOST, bad)])), "{bad}");
        }
        assert!(!p.allows(&HeaderMap::new()), "no Host header");
        let ext: IpAddr = "192.0.2.7".parse().unwrap();
        let p = HostPolicy::new(&[], ext).unwrap();
        assert!(p.allows(&headers(&[(header::HOST, "192.0.2.7:8765")])));
        let p = HostPolicy::new(&["mcp.example:443".into()], lo).unwrap();
        assert!(p.allows(&headers(&[(header::HOST, "mcp.example:443")])));
        assert!(!p.allows(&headers(&[(header::HOST, "mcp.example:80")])));
        assert!(!p.allows(&headers(&[(header::HOST, "localhost")])));
        let p = HostPolicy::new(&["*".into()], lo).unwrap();
        assert!(p.allows(&headers(&[(header::HOST, "anything")])));
        assert!(HostPolicy::new(&["a b".into()], lo).is_err());
    }

    #[test]
    fn origin_policy() {
        let p = OriginPolicy::new(&[]).unwrap();
        assert!(p.allows(&HeaderMap::new()), "no Origin passes");
        assert!(!p.allows(&headers(&[(header::ORIGIN, "http://localhost:3000")])));
        assert!(!p.allows(&headers(&[(header::ORIGIN, "null")])));
        let p = OriginPolicy::new(&[
            "https://app.example".into(),
            "http://localhost:*".into(),
            "null".into(),
        ])
        .unwrap();
        assert!(p.allows(&headers(&[(header::ORIGIN, "https://app.example")])));
        assert!(p.allows(&headers(&[(header::ORIGIN, "https://app.example:443")])));
        assert!(!p.allows(&headers(&[(header::ORIGIN, "https://app.example:8443")])));
        assert!(!p.allows(&headers(&[(header::ORIGIN, "http://app.example")])));
        assert!(p.allows(&headers(&[(header::ORIGIN, "http://localhost:5173")])));
        assert!(p.allows(&headers(&[(header::ORIGIN, "null")])));
        assert!(OriginPolicy::new(&["app.example".into()]).is_err());
    }

    #[test]
    fn a_loopback_listener_serves_its_own_origins_only() {
        let bound: SocketAddr = "127.0.0.1:8765".parse().unwrap();
        let p = OriginPolicy::new(&loopback_origins(bound)).unwrap();
        for ok in [
            "http://127.0.0.1:8765",
            "http://localhost:8765",
            "http://LOCALHOST:8765",
            "http://[::1]:8765",
        ] {
            assert!(p.allows(&headers(&[(header::ORIGIN, ok)])), "{ok}");
        }
        for bad in [
            "http://127.0.0.1:8766",
            "http://localhost",
            "https://localhost:8765",
            "http://evil.example.com:8765",
            "http://localhost.evil.example:8765",
            "null",
        ] {
            assert!(!p.allows(&headers(&[(header::ORIGIN, bad)])), "{bad}");
        }
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(loopback_origins(v6).len(), 3);
        for open in ["0.0.0.0:8765", "192.0.2.7:8765", "[::]:8765"] {
            assert!(loopback_origins(open.parse().unwrap()).is_empty(), "{open}");
        }
    }

    #[test]
    fn loopback() {
        for a in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(a.parse().unwrap()), "{a}");
        }
        for a in ["0.0.0.0", "::", "192.0.2.1", "::ffff:192.0.2.1"] {
            assert!(!is_loopback(a.parse().unwrap()), "{a}");
        }
    }
}
