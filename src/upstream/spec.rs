//! The operator's files: the MCP servers code may call (`--mcp-servers`, the `mcpServers`
//! JSON format MCP clients use) and which principals may call which of them
//! (`--mcp-grants`). Both are the operator's, so trusted; both are checked when the server
//! starts, and a mistake stops it with the file and the entry named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

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

/// A mistake in the operator's files (`--mcp-servers`, `--mcp-grants`), naming the file and
/// the entry. No variant has a `source`: each message already holds its cause, and the
/// server's start prints an error's chain after it (`{:#}`), which would say it twice.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// One of the files (`flag`: `--mcp-servers` or `--mcp-grants`) and what is wrong in it.
    #[error("{flag} {}: {error}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        error: Box<ConfigError>,
    },
    #[error("{0}")]
    Read(std::io::Error),
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("expected an object {{\"mcpServers\": {{\"NAME\": {{...}}}}}}")]
    ServersShape,
    #[error(
        "server {0:?}: a name is 1-{MAX_NAME} characters of A-Z a-z 0-9 _ - (code calls it as \
         tools.<name>)"
    )]
    Name(String),
    /// One server's entry and what is wrong in it.
    #[error("server {name:?}: {error}")]
    Server {
        name: String,
        error: Box<ConfigError>,
    },
    #[error("expected an object with `command` (stdio) or `url` (HTTP)")]
    EntryShape,
    #[error(
        "unknown key {0:?} (known: {known}, and perPrincipal)",
        known = KNOWN_KEYS[..7].join(", ")
    )]
    UnknownKey(String),
    /// A key's value of the wrong kind (`be`: what it must be).
    #[error("{key} must be {be}")]
    Must { key: String, be: &'static str },
    #[error("give either command (stdio) or url (HTTP), not both")]
    Both,
    #[error("give command (stdio) or url (HTTP)")]
    Neither,
    #[error(
        "type {0:?} does not go with command: a server with a command is a stdio server \
         (type \"stdio\", or no type); an HTTP server has a url instead"
    )]
    TypeNotCommand(String),
    #[error(
        "type {0:?} does not go with url: a server with a url is an HTTP server (type \
         \"http\", or no type); a stdio server has a command instead"
    )]
    TypeNotUrl(String),
    #[error("env.{0}: not a valid variable")]
    EnvVar(String),
    /// A key of the other transport's (`headers` for command, `args`, `env`, `cwd` for url).
    #[error("headers are for url (HTTP) servers")]
    HeadersNotStdio,
    #[error("{0} is for command (stdio) servers")]
    NotHttp(&'static str),
    #[error(
        "the old SSE transport is not supported: give the server's streamable HTTP endpoint \
         (type \"http\")"
    )]
    Sse,
    #[error(
        "url {0:?}: only http:// URLs are supported by this build (no TLS); put a local \
         TLS-terminating proxy in front of an https:// server"
    )]
    NoTls(String),
    #[error("headers.{0}: not a valid HTTP header")]
    Header(String),
    #[error("expected an object {{\"PRINCIPAL\": [\"server\", ...]}}")]
    GrantsShape,
    /// A grant names a server the servers file does not have (`servers`: those it has).
    #[error(
        "{principal:?}: no server {server:?} in --mcp-servers (servers: {})",
        .servers.join(", ")
    )]
    NoServer {
        principal: String,
        server: String,
        servers: Vec<String>,
    },
    #[error("{0:?}: a list of server names")]
    ServerNames(String),
    #[error("{0:?}: a list of servers, or an object of server: tools")]
    Grant(String),
    #[error("{principal:?}.{server}: a list of tool names")]
    ToolNames { principal: String, server: String },
    #[error("{principal:?}.{server}: \"*\" (every tool) or a list of tool names")]
    Tools { principal: String, server: String },
}

impl ConfigError {
    fn must(key: impl Into<String>, be: &'static str) -> Self {
        Self::Must {
            key: key.into(),
            be,
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
pub fn load_servers(path: &Path) -> Result<Vec<ServerSpec>, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(ConfigError::Read)
        .and_then(|text| parse_servers(&text))
        .map_err(|e| ConfigError::File {
            flag: "--mcp-servers",
            path: path.into(),
            error: Box::new(e),
        })
}

/// Parse the servers file's text.
pub fn parse_servers(text: &str) -> Result<Vec<ServerSpec>, ConfigError> {
    let doc: Value = serde_json::from_str(text).map_err(ConfigError::NotJson)?;
    let map = match doc.get("mcpServers") {
        Some(m) => m,
        None => &doc,
    };
    let Some(map) = map.as_object() else {
        return Err(ConfigError::ServersShape);
    };
    let mut out = Vec::new();
    for (name, entry) in map {
        if !valid_server_name(name) {
            return Err(ConfigError::Name(name.clone()));
        }
        let spec = parse_entry(name, entry).map_err(|e| ConfigError::Server {
            name: name.clone(),
            error: Box::new(e),
        })?;
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

/// The keys of an entry (the first seven are named when a key is unknown).
const KNOWN_KEYS: &[&str] = &[
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

fn parse_entry(name: &str, entry: &Value) -> Result<Option<ServerSpec>, ConfigError> {
    let Some(obj) = entry.as_object() else {
        return Err(ConfigError::EntryShape);
    };
    for key in obj.keys() {
        if !KNOWN_KEYS.contains(&key.as_str()) && !IGNORED_KEYS.contains(&key.as_str()) {
            return Err(ConfigError::UnknownKey(key.clone()));
        }
    }
    if obj.get("disabled").and_then(Value::as_bool) == Some(true) {
        tracing::info!(server = %name, "MCP server disabled in --mcp-servers");
        return Ok(None);
    }
    let per_principal = match obj.get("perPrincipal") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ConfigError::must("perPrincipal", "true or false")),
    };
    let kind = match obj.get("type") {
        None => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(ConfigError::must("type", "a string")),
    };
    let transport = match (obj.get("command"), obj.get("url")) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::Both);
        }
        (None, None) => return Err(ConfigError::Neither),
        (Some(c), None) => stdio_transport(obj, kind, c)?,
        (None, Some(u)) => http_transport(obj, kind, u)?,
    };
    Ok(Some(ServerSpec {
        name: name.to_string(),
        transport,
        per_principal,
    }))
}

/// The transport of an entry with `command` (`c`): the program, its arguments, the
/// variables added to its environment and its directory.
fn stdio_transport(
    obj: &Map<String, Value>,
    kind: Option<&str>,
    c: &Value,
) -> Result<Transport, ConfigError> {
    if let Some(k) = kind.filter(|k| *k != "stdio") {
        return Err(ConfigError::TypeNotCommand(k.to_string()));
    }
    let Some(command) = c.as_str().filter(|c| !c.is_empty()) else {
        return Err(ConfigError::must("command", "a non-empty string"));
    };
    let not_strings = || ConfigError::must("args", "a list of strings");
    let args = match obj.get("args") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(not_strings)?,
        Some(_) => return Err(not_strings()),
    };
    let env = strings(obj, "env")?;
    for (k, v) in &env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(ConfigError::EnvVar(k.clone()));
        }
    }
    let cwd = match obj.get("cwd") {
        None => None,
        Some(Value::String(s)) if Path::new(s).is_absolute() => Some(PathBuf::from(s)),
        Some(_) => return Err(ConfigError::must("cwd", "an absolute path")),
    };
    if obj.contains_key("headers") {
        return Err(ConfigError::HeadersNotStdio);
    }
    Ok(Transport::Stdio {
        command: command.to_string(),
        args,
        env,
        cwd,
    })
}

/// The transport of an entry with `url` (`u`): streamable HTTP, with its headers.
fn http_transport(
    obj: &Map<String, Value>,
    kind: Option<&str>,
    u: &Value,
) -> Result<Transport, ConfigError> {
    match kind {
        None | Some("http" | "streamable-http" | "streamableHttp" | "streamable_http") => {}
        Some("sse") => return Err(ConfigError::Sse),
        Some(k) => return Err(ConfigError::TypeNotUrl(k.to_string())),
    }
    let Some(url) = u.as_str() else {
        return Err(ConfigError::must("url", "a string"));
    };
    if !url.starts_with("http://") {
        return Err(ConfigError::NoTls(url.to_string()));
    }
    for key in ["args", "env", "cwd"] {
        if obj.contains_key(key) {
            return Err(ConfigError::NotHttp(key));
        }
    }
    let headers = strings(obj, "headers")?;
    for (k, v) in &headers {
        if http::HeaderName::from_bytes(k.as_bytes()).is_err()
            || http::HeaderValue::from_str(v).is_err()
        {
            return Err(ConfigError::Header(k.clone()));
        }
    }
    Ok(Transport::Http {
        url: url.to_string(),
        headers,
    })
}

/// An entry's object of strings at `key` (`env`, `headers`); empty when it has none.
fn strings(obj: &Map<String, Value>, key: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    match obj.get(key) {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(ConfigError::must(format!("{key}.{k}"), "a string")),
            })
            .collect(),
        Some(_) => Err(ConfigError::must(key, "an object of strings")),
    }
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
    pub fn load(path: &Path, servers: &[ServerSpec]) -> Result<Self, ConfigError> {
        std::fs::read_to_string(path)
            .map_err(ConfigError::Read)
            .and_then(|text| Self::parse(&text, servers))
            .map_err(|e| ConfigError::File {
                flag: "--mcp-grants",
                path: path.into(),
                error: Box::new(e),
            })
    }

    /// `{"PRINCIPAL": ["server", ...] | {"server": "*" | ["tool", ...]}}`.
    pub fn parse(text: &str, servers: &[ServerSpec]) -> Result<Self, ConfigError> {
        let doc: Value = serde_json::from_str(text).map_err(ConfigError::NotJson)?;
        let Some(map) = doc.as_object() else {
            return Err(ConfigError::GrantsShape);
        };
        let known = |s: &str| servers.iter().any(|x| x.name == s);
        let mut named = BTreeMap::new();
        for (principal, v) in map {
            let mut grant = Grant::new();
            let server = |s: &str| -> Result<(), ConfigError> {
                if known(s) {
                    Ok(())
                } else {
                    Err(ConfigError::NoServer {
                        principal: principal.clone(),
                        server: s.to_string(),
                        servers: servers.iter().map(|x| x.name.clone()).collect(),
                    })
                }
            };
            match v {
                Value::Array(list) => {
                    for s in list {
                        let Some(s) = s.as_str() else {
                            return Err(ConfigError::ServerNames(principal.clone()));
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
                                    .ok_or_else(|| ConfigError::ToolNames {
                                        principal: principal.clone(),
                                        server: s.clone(),
                                    })?,
                            ),
                            _ => {
                                return Err(ConfigError::Tools {
                                    principal: principal.clone(),
                                    server: s.clone(),
                                });
                            }
                        };
                        grant.insert(s.clone(), set);
                    }
                }
                _ => return Err(ConfigError::Grant(principal.clone())),
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
            let e = parse_servers(text).unwrap_err().to_string();
            assert!(e.contains(what), "{text}: {e}");
        }
    }

    /// The longest messages, byte for byte, with the file and the entry around them.
    #[test]
    fn messages_are_pinned() {
        let e = |text: &str| parse_servers(text).unwrap_err().to_string();
        assert_eq!(
            e(r#"{"mcpServers": {"a b": {"command": "x"}}}"#),
            "server \"a b\": a name is 1-64 characters of A-Z a-z 0-9 _ - (code calls it as \
             tools.<name>)"
        );
        assert_eq!(
            e(r#"{"mcpServers": {"a": {"command": "x", "comand": 1}}}"#),
            "server \"a\": unknown key \"comand\" (known: command, args, env, cwd, url, \
             headers, type, and perPrincipal)"
        );
        assert_eq!(
            e(r#"{"mcpServers": {"a": {"url": "http://h", "type": "sse"}}}"#),
            "server \"a\": the old SSE transport is not supported: give the server's \
             streamable HTTP endpoint (type \"http\")"
        );
        assert_eq!(
            e(r#"{"mcpServers": {"a": {"url": "https://h"}}}"#),
            "server \"a\": url \"https://h\": only http:// URLs are supported by this build \
             (no TLS); put a local TLS-terminating proxy in front of an https:// server"
        );
        assert_eq!(
            e(r#"{"mcpServers": {"a": {"command": "x", "type": "http"}}}"#),
            "server \"a\": type \"http\" does not go with command: a server with a command is \
             a stdio server (type \"stdio\", or no type); an HTTP server has a url instead"
        );
        assert_eq!(
            e(r#"{"mcpServers": {"a": {"url": "http://h", "type": "stdio"}}}"#),
            "server \"a\": type \"stdio\" does not go with url: a server with a url is an \
             HTTP server (type \"http\", or no type); a stdio server has a command instead"
        );
        assert_eq!(
            e(r#"{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}"#),
            "server \"a\": env.K must be a string"
        );
        assert_eq!(
            e(r#"{"mcpServers": {"a": {"url": "http://h", "cwd": "/"}}}"#),
            "server \"a\": cwd is for command (stdio) servers"
        );
        assert_eq!(
            e("[]"),
            "expected an object {\"mcpServers\": {\"NAME\": {...}}}"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("servers.json");
        std::fs::write(&file, r#"{"a": {"command": "x", "perPrincipal": 1}}"#).unwrap();
        assert_eq!(
            load_servers(&file).unwrap_err().to_string(),
            format!(
                "--mcp-servers {}: server \"a\": perPrincipal must be true or false",
                file.display()
            )
        );
        let servers = load_servers(&file.with_file_name("absent"))
            .unwrap_err()
            .to_string();
        assert!(
            servers.starts_with("--mcp-servers ")
                && servers.ends_with("absent: No such file or directory (os error 2)"),
            "{servers}"
        );
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
        let e = |text: &str| Grants::parse(text, &servers).unwrap_err().to_string();
        assert_eq!(
            e(r#"{"alice": ["nope"]}"#),
            "\"alice\": no server \"nope\" in --mcp-servers (servers: everything, remote)"
        );
        assert_eq!(
            e(r#"{"alice": {"everything": 3}}"#),
            "\"alice\".everything: \"*\" (every tool) or a list of tool names"
        );
        assert_eq!(
            e(r#"{"alice": {"everything": [3]}}"#),
            "\"alice\".everything: a list of tool names"
        );
        assert_eq!(
            e(r#"{"alice": 3}"#),
            "\"alice\": a list of servers, or an object of server: tools"
        );
        assert_eq!(
            e("[]"),
            "expected an object {\"PRINCIPAL\": [\"server\", ...]}"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("grants.json");
        std::fs::write(&file, "{").unwrap();
        let e = Grants::load(&file, &servers).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("--mcp-grants {}: not JSON: ", file.display())),
            "{e}"
        );
    }
}
