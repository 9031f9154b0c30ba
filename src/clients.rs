//! `replbox install --client`: a stdio server entry for an MCP client, in that client's own
//! configuration format, merged into its file. The file is the operator's: other servers
//! and everything else in it (comments and layout too) stay as they are; the entry named
//! like ours is replaced; a backup of the file as it was is kept beside it.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use jsonc_parser::ParseOptions;
use jsonc_parser::cst::{CstInputValue, CstRootNode};

/// The MCP clients `install` knows the configuration files of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Client {
    /// Claude Code: `mcpServers` in `~/.claude.json` (user scope) or a project's `.mcp.json`.
    ClaudeCode,
    /// Cursor: `mcpServers` in `~/.cursor/mcp.json` or a project's `.cursor/mcp.json`.
    Cursor,
    /// VS Code: `servers` in the user profile's `mcp.json` or a workspace's
    /// `.vscode/mcp.json`.
    Vscode,
    /// Codex: `[mcp_servers.NAME]` in `$CODEX_HOME/config.toml` (`~/.codex/config.toml`).
    Codex,
    /// Claude Desktop (macOS, Windows): `mcpServers` in `claude_desktop_config.json`, on the
    /// machine the app runs on, starting replbox here over SSH.
    ClaudeDesktop,
}

impl Client {
    pub fn name(self) -> &'static str {
        match self {
            Client::ClaudeCode => "claude-code",
            Client::Cursor => "cursor",
            Client::Vscode => "vscode",
            Client::Codex => "codex",
            Client::ClaudeDesktop => "claude-desktop",
        }
    }

    /// Whether the client runs on another machine than replbox (its only form is SSH).
    pub fn runs_elsewhere(self) -> bool {
        self == Client::ClaudeDesktop
    }

    fn toml(self) -> bool {
        self == Client::Codex
    }
}

/// Seconds Codex waits for one tool call (its own default is 60 s): the longest evaluation
/// a caller may ask for (`--max-timeout-ms`, 10 minutes by default) and a margin.
pub const CODEX_TOOL_TIMEOUT_S: i64 = 660;

/// The server entry: what the client starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key in the client's table of servers.
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
}

impl Entry {
    /// `exe serve [--allow-cwd DIR]…`, or over SSH: `ssh -T HOST exe serve …` (stdio goes
    /// through SSH as it is; `-T`: no terminal, which would mangle JSON-RPC).
    pub fn new(name: &str, exe: &Path, projects: &[PathBuf], ssh: Option<&str>) -> Self {
        let mut serve = vec!["serve".to_string()];
        for p in projects {
            serve.push("--allow-cwd".into());
            serve.push(p.display().to_string());
        }
        let exe = exe.display().to_string();
        match ssh {
            None => Entry {
                name: name.into(),
                command: exe,
                args: serve,
            },
            Some(host) => {
                let mut args = vec!["-T".to_string(), host.to_string(), exe];
                args.extend(serve);
                Entry {
                    name: name.into(),
                    command: "ssh".into(),
                    args,
                }
            }
        }
    }

    /// The entry as the client's JSON holds it.
    fn json(&self, client: Client) -> serde_json::Value {
        let mut v = serde_json::Map::new();
        // Claude Code's files and VS Code's say which transport; Cursor's and Claude
        // Desktop's documented stdio entries have no `type`.
        if matches!(client, Client::ClaudeCode | Client::Vscode) {
            v.insert("type".into(), "stdio".into());
        }
        v.insert("command".into(), self.command.clone().into());
        v.insert("args".into(), self.args.clone().into());
        serde_json::Value::Object(v)
    }

    fn cst(&self, client: Client) -> CstInputValue {
        let mut props = Vec::new();
        if matches!(client, Client::ClaudeCode | Client::Vscode) {
            props.push(("type".to_string(), CstInputValue::String("stdio".into())));
        }
        props.push((
            "command".to_string(),
            CstInputValue::String(self.command.clone()),
        ));
        props.push((
            "args".to_string(),
            CstInputValue::Array(
                self.args
                    .iter()
                    .map(|a| CstInputValue::String(a.clone()))
                    .collect(),
            ),
        ));
        CstInputValue::Object(props)
    }
}

/// The key holding the servers in the client's JSON file.
fn servers_key(client: Client) -> &'static str {
    match client {
        Client::Vscode => "servers",
        _ => "mcpServers",
    }
}

/// Where the client's user-wide file is, from the environment (`HOME`, `XDG_CONFIG_HOME`,
/// `CODEX_HOME`); `None` for a client whose file is on another machine.
pub fn default_file(client: Client, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let home = env("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    match client {
        Client::ClaudeCode => Some(home?.join(".claude.json")),
        Client::Cursor => Some(home?.join(".cursor/mcp.json")),
        Client::Vscode => {
            let config = env("XDG_CONFIG_HOME")
                .filter(|c| c.starts_with('/'))
                .map(PathBuf::from)
                .or_else(|| home.map(|h| h.join(".config")))?;
            Some(config.join("Code/User/mcp.json"))
        }
        Client::Codex => {
            let dir = env("CODEX_HOME")
                .filter(|c| !c.is_empty())
                .map(PathBuf::from)
                .or_else(|| home.map(|h| h.join(".codex")))?;
            Some(dir.join("config.toml"))
        }
        Client::ClaudeDesktop => None,
    }
}

/// What the merge did to the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Added,
    Replaced,
    Unchanged,
}

/// `existing` (the file's text, or `None` when there is none) with `entry` in it; the
/// other servers and the rest of the file as they were.
pub fn merge(
    client: Client,
    existing: Option<&str>,
    entry: &Entry,
) -> Result<(String, Change), MergeError> {
    if client.toml() {
        merge_toml(existing.unwrap_or(""), entry)
    } else {
        merge_json(client, existing.unwrap_or(""), entry)
    }
}

/// Why a client's configuration cannot take the entry.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("it is not JSON (nor JSON with comments): {0}")]
    Json(#[source] jsonc_parser::errors::ParseError),
    #[error("its top level is not an object")]
    TopLevel,
    /// The client's key of its servers (`mcpServers`, `servers`).
    #[error("its `{0}` is not an object")]
    Servers(&'static str),
    #[error("it is not TOML: {0}")]
    Toml(#[source] toml_edit::TomlError),
    #[error("its `mcp_servers` is not a table")]
    TomlServers,
}

/// Why [`install`] changed nothing, or could not finish (the file is then as it was).
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{file}: {why}; nothing was changed (fix the file, or add the entry printed by --print \
         by hand)"
    )]
    Merge { file: PathBuf, why: MergeError },
    #[error("cannot create {dir}: {source}")]
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the backup {backup}: {source}")]
    Backup {
        backup: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot find a free name for a backup of {file}")]
    NoBackupName { file: PathBuf },
    #[error("cannot write {file}: {source}")]
    Write {
        file: PathBuf,
        source: std::io::Error,
    },
}

/// The configuration as a file of its own holding only this entry (`--print`).
pub fn render(client: Client, entry: &Entry) -> String {
    // Merging into nothing cannot fail: no text to parse.
    merge(client, None, entry)
        .map(|(text, _)| text)
        .unwrap_or_default()
}

fn merge_json(client: Client, text: &str, entry: &Entry) -> Result<(String, Change), MergeError> {
    let text = if text.trim().is_empty() { "{}\n" } else { text };
    let root = CstRootNode::parse(text, &ParseOptions::default()).map_err(MergeError::Json)?;
    let top = root.object_value_or_create().ok_or(MergeError::TopLevel)?;
    let key = servers_key(client);
    let servers = top
        .object_value_or_create(key)
        .ok_or(MergeError::Servers(key))?;
    let want = entry.json(client);
    let change = match servers.get(&entry.name) {
        Some(prop) => {
            if prop.value().and_then(|v| v.to_serde_value()).as_ref() == Some(&want) {
                Change::Unchanged
            } else {
                prop.set_value(entry.cst(client));
                Change::Replaced
            }
        }
        None => {
            servers.append(&entry.name, entry.cst(client));
            Change::Added
        }
    };
    let mut out = root.to_string();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok((out, change))
}

fn merge_toml(text: &str, entry: &Entry) -> Result<(String, Change), MergeError> {
    use toml_edit::{Array, DocumentMut, Item, Table, value};
    let mut doc: DocumentMut = text.parse().map_err(MergeError::Toml)?;
    let servers = doc
        .entry("mcp_servers")
        .or_insert_with(|| {
            let mut t = Table::new();
            t.set_implicit(true);
            Item::Table(t)
        })
        .as_table_like_mut()
        .ok_or(MergeError::TomlServers)?;
    let mut args = Array::new();
    for a in &entry.args {
        args.push(a.as_str());
    }
    let mut table = Table::new();
    table.insert("command", value(entry.command.as_str()));
    table.insert("args", value(args));
    table.insert("tool_timeout_sec", value(CODEX_TOOL_TIMEOUT_S));
    let same = |old: &Item| {
        let t = old.as_table_like();
        let s = |k: &str| t.and_then(|t| t.get(k)).and_then(|v| v.as_str());
        let old_args: Option<Vec<&str>> = t
            .and_then(|t| t.get("args"))
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect());
        s("command") == Some(entry.command.as_str())
            && old_args.as_deref()
                == Some(&entry.args.iter().map(String::as_str).collect::<Vec<_>>()[..])
            && t.and_then(|t| t.get("tool_timeout_sec"))
                .and_then(|v| v.as_integer())
                == Some(CODEX_TOOL_TIMEOUT_S)
    };
    let change = match servers.get(&entry.name) {
        Some(old) if same(old) => Change::Unchanged,
        Some(_) => Change::Replaced,
        None => Change::Added,
    };
    if change != Change::Unchanged {
        servers.insert(&entry.name, Item::Table(table));
    }
    Ok((doc.to_string(), change))
}

/// The result of [`install`].
#[derive(Debug)]
pub struct Installed {
    pub file: PathBuf,
    pub change: Change,
    /// The file as it was, kept here (none when there was no file or nothing changed).
    pub backup: Option<PathBuf>,
}

/// Merge `entry` into `file`: its text is read, merged, and written back by a rename of a
/// new file beside it (same permissions; a new file is `0600`, as it may later hold
/// tokens), after a copy of the old one is kept as `FILE.replbox-backup-SECONDS`. A link is
/// followed, so the file it names is updated and the link stays.
pub fn install(client: Client, file: &Path, entry: &Entry) -> Result<Installed, InstallError> {
    let file = match std::fs::canonicalize(file) {
        Ok(real) => real,
        Err(_) => file.to_path_buf(),
    };
    let existing = match std::fs::read_to_string(&file) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(InstallError::Read { file, source }),
    };
    let (text, change) = match merge(client, existing.as_deref(), entry) {
        Ok(merged) => merged,
        Err(why) => return Err(InstallError::Merge { file, why }),
    };
    if change == Change::Unchanged {
        return Ok(Installed {
            file,
            change,
            backup: None,
        });
    }
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|source| InstallError::CreateDir {
        dir: dir.into(),
        source,
    })?;
    let mode = std::fs::metadata(&file)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o600);
    let backup = match &existing {
        Some(old) => Some(keep_backup(&file, old, mode)?),
        None => None,
    };
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "config".into());
    let tmp = dir.join(format!(".{name}.replbox-{}", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&tmp, &file)
    })();
    if let Err(source) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(InstallError::Write { file, source });
    }
    Ok(Installed {
        file,
        change,
        backup,
    })
}

/// A copy of the file as it was, under a name no earlier backup has.
fn keep_backup(file: &Path, old: &str, mode: u32) -> Result<PathBuf, InstallError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = format!("{}.replbox-backup-{secs}", file.display());
    for n in 0..100 {
        let path = PathBuf::from(if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(old.as_bytes())
                    .and_then(|_| f.sync_all())
                    .map_err(|source| InstallError::Backup {
                        backup: path.clone(),
                        source,
                    })?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => {
                return Err(InstallError::Backup {
                    backup: path,
                    source,
                });
            }
        }
    }
    Err(InstallError::NoBackupName { file: file.into() })
}

/// Why a configuration naming `exe` would break later, if it would: a launcher's cache
/// (`uvx`, `npx`) is removed when the cache is cleaned.
pub fn transient_exe(exe: &Path) -> Option<&'static str> {
    let s = exe.to_string_lossy();
    if s.contains("/uv/archive-v") || s.contains("/uv/builds-v") {
        Some("uvx")
    } else if s.contains("/_npx/") {
        Some("npx")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry::new(
            "replbox",
            Path::new("/opt/replbox/bin/replbox"),
            &[PathBuf::from("/home/me/proj")],
            None,
        )
    }

    #[test]
    fn json_merge_keeps_others_comments_and_order() {
        let old = "{\n  // mine\n  \"zeta\": 1,\n  \"mcpServers\": {\n    \"other\": { \"command\": \"x\" }\n  },\n  \"alpha\": [1, 2]\n}\n";
        let (text, change) = merge(Client::Cursor, Some(old), &entry()).expect("merge");
        assert_eq!(change, Change::Added);
        assert!(text.contains("// mine"), "{text}");
        assert!(text.contains("\"other\": { \"command\": \"x\" }"), "{text}");
        let z = text.find("zeta").expect("zeta");
        let a = text.find("alpha").expect("alpha");
        assert!(z < a, "{text}");
        let v: serde_json::Value =
            serde_json::from_str(&text.replace("// mine\n", "")).expect("json");
        assert_eq!(v["mcpServers"]["replbox"]["args"][2], "/home/me/proj");
        // Again: nothing to change.
        let (again, change) = merge(Client::Cursor, Some(&text), &entry()).expect("merge");
        assert_eq!(change, Change::Unchanged);
        assert_eq!(again, text);
    }

    #[test]
    fn json_refuses_what_it_cannot_merge_into() {
        let bad = [
            ("[1]", "top level"),
            ("{\"mcpServers\": 3}", "mcpServers"),
            ("{\"mcpServers\": {", "not JSON"),
        ];
        for (text, why) in bad {
            let e = merge(Client::ClaudeCode, Some(text), &entry()).expect_err(text);
            assert!(e.to_string().contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn toml_merge_replaces_ours_only() {
        let old = "# my settings\nmodel = \"o3\"\n\n[mcp_servers.other]\ncommand = \"x\"\n\n[mcp_servers.replbox]\ncommand = \"/old/replbox\"\nargs = [\"serve\"]\n";
        let (text, change) = merge(Client::Codex, Some(old), &entry()).expect("merge");
        assert_eq!(change, Change::Replaced);
        assert!(
            text.starts_with("# my settings\nmodel = \"o3\"\n"),
            "{text}"
        );
        assert!(
            text.contains("[mcp_servers.other]\ncommand = \"x\""),
            "{text}"
        );
        assert!(!text.contains("/old/replbox"), "{text}");
        let (_, change) = merge(Client::Codex, Some(&text), &entry()).expect("merge");
        assert_eq!(change, Change::Unchanged);
    }

    #[test]
    fn ssh_form() {
        let e = Entry::new(
            "replbox",
            Path::new("/usr/bin/replbox"),
            &[],
            Some("me@box"),
        );
        assert_eq!(e.command, "ssh");
        assert_eq!(e.args, ["-T", "me@box", "/usr/bin/replbox", "serve"]);
    }

    #[test]
    fn default_files() {
        let env = |k: &str| match k {
            "HOME" => Some("/h".to_string()),
            _ => None,
        };
        let f = |c| default_file(c, &env).map(|p| p.display().to_string());
        assert_eq!(f(Client::ClaudeCode).as_deref(), Some("/h/.claude.json"));
        assert_eq!(f(Client::Cursor).as_deref(), Some("/h/.cursor/mcp.json"));
        assert_eq!(
            f(Client::Vscode).as_deref(),
            Some("/h/.config/Code/User/mcp.json")
        );
        assert_eq!(f(Client::Codex).as_deref(), Some("/h/.codex/config.toml"));
        assert_eq!(f(Client::ClaudeDesktop), None);
    }
}
