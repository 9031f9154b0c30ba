//! The operator's files: the MCP servers code may call (`--mcp-servers`, the `mcpServers`
//! JSON format MCP clients use) and which principals may call which of them
//! (`--mcp-grants`). Both are the operator's, so trusted; both are checked when the server
//! starts, and a mistake stops it with the file and the entry named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Longest server name: it becomes an attribute of `tools` in the sandbox's modules.
const MAX_NAME: usize = 64;

/// One configured upstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    pub name: String,
    pub transport: Transport,
    /// One instance per principal rather than one per replbox server (`"perPrincipal":
    /// true`): for servers that keep state a principal must not share.
    pub per_principal: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A program speaking MCP on its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Added to the few variables every upstream gets (PATH, HOME, ...): credentials
        /// belong here, never in `args` (a command line is readable in /proc).
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP at `url`, with these request headers (credentials).
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

impl ServerSpec {
    /// "stdio" or "http", for messages and logs.
    pub fn kind(&self) -> &'static str {
        match self.transport {
            Transport::Stdio { .. } => "stdio",
            Transport::Http { .. } => "http",
        }
    }
}

/// A server name: what `tools.<name>` and `replbox-tool NAME` take.
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Read the servers file (`{"mcpServers": {NAME: {...}}}`, or the map alone).
pub fn load_servers(path: &Path) -> Result<Vec<ServerSpec>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--mcp-servers {}: {e}", path.display()))?;
    parse_servers(&text).map_err(|e| format!("--mcp-servers {}: {e}", path.display()))
}

/// Parse the servers file's text.
pub fn parse_servers(text: &str) -> Result<Vec<ServerSpec>, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let map = match doc.get("mcpServers") {
        Some(m) => m,
        None => &doc,
    };
    let Some(map) = map.as_object() else {
        return Err("expected an object {\"mcpServers\": {\"NAME\": {...}}}".into());
    };
    let mut out = Vec::new();
    for (name, entry) in map {
        if !valid_server_name(name) {
            return Err(format!(
                "server {name:?}: a name is 1-{MAX_NAME} characters of A-Z a-z 0-9 _ - \
                 (code calls it as tools.<name>)"
            ));
        }
        let spec = parse_entry(name, entry).map_err(|e| format!("server {name:?}: {e}"))?;
        if let Some(spec) = spec {
            out.push(spec);
        }
    }
    Ok(out)
}

/// Keys other clients write into an entry that replbox has no use for; anything else
/// unknown is refused, so a misspelt key is not silently ignored.
const IGNORED_KEYS: &[&str] = &[
    "description",
    "alwaysAllow",
    "autoApprove",
    "timeout",
    "note",
];

fn parse_entry(name: &str, entry: &Value) -> Result<Option<ServerSpec>, String> {
    let Some(obj) = entry.as_object() else {
        return Err("expected an object with `command` (stdio) or `url` (HTTP)".into());
    };
    for key in obj.keys() {
        let known = [
            "command",
            "args",
            "env",
            "cwd",
            "url",
            "headers",
            "type",
            "disabled",
            "perPrincipal",
        ];
        if !known.contains(&key.as_str()) && !IGNORED_KEYS.contains(&key.as_str()) {
            return Err(format!(
                "unknown key {key:?} (known: {}, and perPrincipal)",
                known[..7].join(", ")
            ));
        }
    }
    if obj.get("disabled").and_then(Value::as_bool) == Some(true) {
        tracing::info!(server = %name, "MCP server disabled in --mcp-servers");
        return Ok(None);
    }
    let per_principal = match obj.get("perPrincipal") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("perPrincipal must be true or false".into()),
    };
    let kind = match obj.get("type") {
        None => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err("type must be a string".into()),
    };
    let strings = |key: &str| -> Result<BTreeMap<String, String>, String> {
        match obj.get(key) {
            None => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    _ => Err(format!("{key}.{k} must be a string")),
                })
                .collect(),
            Some(_) => Err(format!("{key} must be an object of strings")),
        }
    };
    let transport = match (obj.get("command"), obj.get("url")) {
        (Some(_), Some(_)) => {
            return Err("give either command (stdio) or url (HTTP), not both".into());
        }
        (None, None) => return Err("give command (stdio) or url (HTTP)".into()),
        (Some(c), None) => {
            if !matches!(kind, None | Some("stdio")) {
                return Err(format!("type {kind:?} does not go with command"));
            }
            let Some(command) = c.as_str().filter(|c| !c.is_empty()) else {
                return Err("command must be a non-empty string".into());
            };
            let args = match obj.get("args") {
                None => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or("args must be a list of strings")?,
                Some(_) => return Err("args must be a list of strings".into()),
            };
            let env = strings("env")?;
            for (k, v) in &env {
                if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                    return Err(format!("env.{k}: not a valid variable"));
                }
            }
            let cwd = match obj.get("cwd") {
                None => None,
                Some(Value::String(s)) if Path::new(s).is_absolute() => Some(PathBuf::from(s)),
                Some(_) => return Err("cwd must be an absolute path".into()),
            };
            if obj.contains_key("headers") {
                return Err("headers are for url (HTTP) servers".into());
            }
            Transport::Stdio {
                command: command.to_string(),
                args,
                env,
                cwd,
            }
        }
        (None, Some(u)) => {
            match kind {
                None | Some("http" | "streamable-http" | "streamableHttp" | "streamable_http") => {}
                Some("sse") => {
                    return Err("the old SSE transport is not supported: give the server's \
                                streamable HTTP endpoint (type \"http\")"
                        .into());
                }
                Some(k) => return Err(format!("type {k:?} does not go with url")),
            }
            let Some(url) = u.as_str() else {
                return Err("url must be a string".into());
            };
            if !url.starts_with("http://") {
                return Err(format!(
                    "url {url:?}: only http:// URLs are supported by this build (no TLS); \
                     put a local TLS-terminating proxy in front of an https:// server"
                ));
            }
            for key in ["args", "env", "cwd"] {
                if obj.contains_key(key) {
                    return Err(format!("{key} is for command (stdio) servers"));
                }
            }
            let headers = strings("headers")?;
            for (k, v) in &headers {
                if http::HeaderName::from_bytes(k.as_bytes()).is_err()
                    || http::HeaderValue::from_str(v).is_err()
                {
                    return Err(format!("headers.{k}: not a valid HTTP header"));
                }
            }
            Transport::Http {
                url: url.to_string(),
                headers,
            }
        }
    };
    Ok(Some(ServerSpec {
        name: name.to_string(),
        transport,
        per_principal,
    }))
}

/// Which tools of one server a principal may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolSet {
    All,
    Only(BTreeSet<String>),
}

impl ToolSet {
    pub fn allows(&self, tool: &str) -> bool {
        match self {
            ToolSet::All => true,
            ToolSet::Only(t) => t.contains(tool),
        }
    }
}

/// A principal's servers and, per server, its tools.
pub type Grant = BTreeMap<String, ToolSet>;

/// Who may use which server (`--mcp-grants`): by default the local principal (stdio, or HTTP
/// without tokens) every server and every tool, a token's principal nothing.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Per principal name; `*` for every token principal not named.
    named: BTreeMap<String, Grant>,
}

/// The principal name the grants file uses for every token principal it does not name.
pub const ANY_TOKEN: &str = "*";

impl Grants {
    /// Read the grants file, checking every server it names against `servers`.
    pub fn load(path: &Path, servers: &[ServerSpec]) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--mcp-grants {}: {e}", path.display()))?;
        Self::parse(&text, servers).map_err(|e| format!("--mcp-grants {}: {e}", path.display()))
    }

    /// `{"PRINCIPAL": ["server", ...] | {"server": "*" | ["tool", ...]}}`.
    pub fn parse(text: &str, servers: &[ServerSpec]) -> Result<Self, String> {
        let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let Some(map) = doc.as_object() else {
            return Err("expected an object {\"PRINCIPAL\": [\"server\", ...]}".into());
        };
        let known = |s: &str| servers.iter().any(|x| x.name == s);
        let mut named = BTreeMap::new();
        for (principal, v) in map {
            let mut grant = Grant::new();
            let server = |s: &str| -> Result<(), String> {
                if known(s) {
                    Ok(())
                } else {
                    Err(format!(
                        "{principal:?}: no server {s:?} in --mcp-servers (servers: {})",
                        servers
                            .iter()
                            .map(|x| x.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                }
            };
            match v {
                Value::Array(list) => {
                    for s in list {
                        let Some(s) = s.as_str() else {
                            return Err(format!("{principal:?}: a list of server names"));
                        };
                        server(s)?;
                        grant.insert(s.to_string(), ToolSet::All);
                    }
                }
                Value::Object(m) => {
                    for (s, tools) in m {
                        server(s)?;
                        let set = match tools {
                            Value::String(w) if w == "*" => ToolSet::All,
                            Value::Array(t) => ToolSet::Only(
                                t.iter()
                                    .map(|x| x.as_str().map(str::to_string))
                                    .collect::<Option<BTreeSet<_>>>()
                                    .ok_or_else(|| {
                                        format!("{principal:?}.{s}: a list of tool names")
                                    })?,
                            ),
                            _ => {
                                return Err(format!(
                                    "{principal:?}.{s}: \"*\" (every tool) or a list of tool names"
                                ));
                            }
                        };
                        grant.insert(s.clone(), set);
                    }
                }
                _ => {
                    return Err(format!(
                        "{principal:?}: a list of servers, or an object of server: tools"
                    ));
                }
            }
            named.insert(principal.clone(), grant);
        }
        Ok(Self { named })
    }

    /// What `principal` may use (`local`: the local principal's default is everything).
    pub fn of(&self, principal: &str, local: bool, servers: &[ServerSpec]) -> Grant {
        if let Some(g) = self.named.get(principal) {
            return g.clone();
        }
        if local {
            return servers
                .iter()
                .map(|s| (s.name.clone(), ToolSet::All))
                .collect();
        }
        self.named.get(ANY_TOKEN).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"mcpServers": {
        "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"],
                       "env": {"API_KEY": "s3cret"}, "autoApprove": []},
        "remote": {"type": "http", "url": "http://127.0.0.1:9/mcp",
                   "headers": {"Authorization": "Bearer t0k"}, "perPrincipal": true},
        "off": {"command": "x", "disabled": true}
    }}"#;

    #[test]
    fn reads_the_common_format() {
        let s = parse_servers(FILE).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "everything");
        let Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } = &s[0].transport
        else {
            panic!()
        };
        assert_eq!(command, "npx");
        assert_eq!(args.len(), 2);
        assert_eq!(env["API_KEY"], "s3cret");
        assert!(cwd.is_none());
        assert!(!s[0].per_principal);
        assert_eq!(s[1].kind(), "http");
        assert!(s[1].per_principal);
    }

    #[test]
    fn mistakes_are_named() {
        for (text, what) in [
            (r#"{"mcpServers": {"a b": {"command": "x"}}}"#, "a name is"),
            (r#"{"mcpServers": {"a": {}}}"#, "give command"),
            (
                r#"{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}"#,
                "not both",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "comand": 1}}}"#,
                "unknown key",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "http://h", "type": "sse"}}}"#,
                "SSE",
            ),
            (r#"{"mcpServers": {"a": {"url": "https://h"}}}"#, "TLS"),
            (
                r#"{"mcpServers": {"a": {"command": "x", "args": [1]}}}"#,
                "args",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "cwd": "rel"}}}"#,
                "absolute",
            ),
            (
                r#"{"mcpServers": {"a": {"url": "http://h", "headers": {"a b": "x"}}}}"#,
                "header",
            ),
            ("[", "not JSON"),
        ] {
            let e = parse_servers(text).unwrap_err();
            assert!(e.contains(what), "{text}: {e}");
        }
    }

    #[test]
    fn grants_default_and_named() {
        let servers = parse_servers(FILE).unwrap();
        let none = Grants::default();
        assert_eq!(none.of("local", true, &servers).len(), 2);
        assert!(none.of("alice", false, &servers).is_empty());
        let g = Grants::parse(
            r#"{"alice": ["everything"], "bob": {"everything": ["echo"], "remote": "*"},
                "*": ["remote"], "local": {"everything": ["echo", "get-sum"]}}"#,
            &servers,
        )
        .unwrap();
        assert_eq!(g.of("alice", false, &servers)["everything"], ToolSet::All);
        let bob = g.of("bob", false, &servers);
        assert!(bob["everything"].allows("echo"));
        assert!(!bob["everything"].allows("get-env"));
        assert!(bob["remote"].allows("anything"));
        assert!(g.of("carol", false, &servers).contains_key("remote"));
        let local = g.of("local", true, &servers);
        assert!(!local.contains_key("remote"));
        assert!(!local["everything"].allows("get-env"));
        let e = Grants::parse(r#"{"alice": ["nope"]}"#, &servers).unwrap_err();
        assert!(e.contains("no server \"nope\""), "{e}");
        assert!(Grants::parse(r#"{"alice": {"everything": 3}}"#, &servers).is_err());
    }
}
