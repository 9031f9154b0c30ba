//! The files of a session's directory: which ones an evaluation created, changed or removed
//! (from [`snapshot`]s), which ones `resources/list` shows, the `replbox://` URIs that name
//! them, and the files `session_start` brings in.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Serialize;

use rustix::fs::{AtFlags, FileType};

pub use super::snapshot::{Snapshot, Stamp, snapshot};
pub(super) use super::snapshot::{enters, join, snapshot_with, walk_into, walk_of};
use crate::hostfs::{self, CwdPolicy, HostfsError, Walk};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Created,
    Modified,
    Deleted,
}

/// A file an evaluation created, modified or deleted.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileChange {
    /// Path relative to the session's directory.
    pub path: String,
    /// Size in bytes (for a deleted file, its last known size).
    pub size: u64,
    pub change: Change,
    /// The MCP resource to read it with `resources/read` (absent for a deleted file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

/// What changed from `old` to `new`, in path order.
pub fn diff(session_id: &str, old: &Snapshot, new: &Snapshot) -> Vec<FileChange> {
    let mut out = Vec::new();
    for (path, stamp) in &new.files {
        let change = match old.files.get(path) {
            None => Change::Created,
            Some(before) if before != stamp => Change::Modified,
            Some(_) => continue,
        };
        out.push(FileChange {
            path: path.clone(),
            size: stamp.size,
            change,
            uri: Some(file_uri(session_id, path)),
        });
    }
    for (path, stamp) in &old.files {
        if !new.files.contains_key(path) {
            out.push(FileChange {
                path: path.clone(),
                size: stamp.size,
                change: Change::Deleted,
                uri: None,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

const URI_PREFIX: &str = "replbox://sessions/";

/// The URI template clients can fill in.
pub const URI_TEMPLATE: &str = "replbox://sessions/{session_id}/files/{path}";

/// `replbox://sessions/{id}/files/{path}`, each path segment percent-encoded.
pub fn file_uri(session_id: &str, path: &str) -> String {
    let segments: Vec<String> = path.split('/').map(encode_segment).collect();
    format!(
        "{URI_PREFIX}{}/files/{}",
        encode_segment(session_id),
        segments.join("/")
    )
}

/// Why a URI given to `resources/read` is not one of a session's files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    #[error("{uri:?} is not a session file URI (expected {URI_TEMPLATE})")]
    NotFileUri { uri: String },
    #[error("{uri:?}: a path segment contains an encoded '/'")]
    EncodedSlash { uri: String },
    #[error("bad percent-encoding in {segment:?}")]
    Percent { segment: String },
    #[error("{segment:?} does not decode to UTF-8")]
    Utf8 { segment: String },
}

/// The session id and the (decoded) relative path of a file URI.
pub fn parse_uri(uri: &str) -> Result<(String, String), UriError> {
    let not_file_uri = || UriError::NotFileUri { uri: uri.into() };
    let rest = uri.strip_prefix(URI_PREFIX).ok_or_else(not_file_uri)?;
    let (id, path) = rest.split_once("/files/").ok_or_else(not_file_uri)?;
    // Decoded per segment: an encoded '/' (%2F) would otherwise smuggle in a separator.
    let id = decode(id)?;
    let mut segments = Vec::new();
    for s in path.split('/') {
        let d = decode(s)?;
        if d.contains('/') {
            return Err(UriError::EncodedSlash { uri: uri.into() });
        }
        segments.push(d);
    }
    Ok((id, segments.join("/")))
}

/// The URI templates of what cells showed, kept with the history to be read again.
pub const SHOWN_TEMPLATES: [&str; 2] = [
    "replbox://sessions/{session_id}/figures/{name}",
    "replbox://sessions/{session_id}/displays/{name}",
];

/// `replbox://sessions/{id}/{kind}/{eval}-{n}.{ext}`: the `n`th figure or display part an
/// evaluation returned.
pub fn shown_uri(session_id: &str, kind: &str, eval: u64, n: u64, ext: &str) -> String {
    format!(
        "{URI_PREFIX}{}/{kind}/{eval}-{n}.{ext}",
        encode_segment(session_id)
    )
}

/// The session id of a URI with the shape of [`shown_uri`]'s; the whole URI is then only
/// compared with the ones the session's history holds, never made into a path.
pub fn parse_shown_uri(uri: &str) -> Option<String> {
    let rest = uri.strip_prefix(URI_PREFIX)?;
    let (id, tail) = rest.split_once('/')?;
    let name = tail
        .strip_prefix("figures/")
        .or_else(|| tail.strip_prefix("displays/"))?;
    let (stem, ext) = name.split_once('.')?;
    let (eval, n) = stem.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    let ok = digits(eval)
        && digits(n)
        && (2..=4).contains(&ext.len())
        && ext.bytes().all(|b| b.is_ascii_lowercase());
    ok.then(|| decode(id).ok())?
}

/// The URI template of an evaluation's whole output (kept when its result had to cut it).
pub const OUTPUT_TEMPLATE: &str = "replbox://sessions/{session_id}/outputs/{eval_id}.txt";

/// Bytes in one `?page=N` of a whole output.
pub const OUTPUT_PAGE: usize = 64 * 1024;

/// `replbox://sessions/{id}/outputs/{eval}.txt`.
pub fn output_uri(session_id: &str, eval: u64) -> String {
    format!(
        "{URI_PREFIX}{}/outputs/{eval}.txt",
        encode_segment(session_id)
    )
}

/// A URI with the shape of [`output_uri`]'s, optionally with `?page=N` (from 1): the
/// session id, the URI without the page, and the page. The URI is then only compared with
/// the ones the session's history holds, never made into a path.
pub fn parse_output_uri(uri: &str) -> Option<(String, String, Option<u64>)> {
    let (base, page) = match uri.split_once('?') {
        None => (uri, None),
        Some((base, query)) => {
            let n = query.strip_prefix("page=")?;
            let ok = !n.is_empty() && n.len() <= 9 && n.bytes().all(|b| b.is_ascii_digit());
            (base, Some(n.parse::<u64>().ok().filter(|&p| ok && p > 0)?))
        }
    };
    let rest = base.strip_prefix(URI_PREFIX)?;
    let (id, tail) = rest.split_once('/')?;
    let eval = tail.strip_prefix("outputs/")?.strip_suffix(".txt")?;
    let ok = !eval.is_empty() && eval.len() <= 20 && eval.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| decode(id).ok().map(|id| (id, base.to_string(), page)))?
}

/// The URI templates of a session's exports.
pub const EXPORT_TEMPLATES: [&str; 2] = [
    "replbox://sessions/{session_id}/export.ipynb",
    "replbox://sessions/{session_id}/export.{ext}",
];

/// `replbox://sessions/{id}/export.{ext}`.
pub fn export_uri(session_id: &str, ext: &str) -> String {
    format!("{URI_PREFIX}{}/export.{ext}", encode_segment(session_id))
}

/// The session id and extension of an export URI.
pub fn parse_export_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix(URI_PREFIX)?;
    let (id, ext) = rest.split_once("/export.")?;
    let ok = !id.contains('/')
        && !ext.is_empty()
        && ext.len() <= 16
        && ext.bytes().all(|b| b.is_ascii_alphanumeric());
    ok.then(|| decode(id).ok().map(|id| (id, ext.to_string())))?
}

fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(s: &str) -> Result<String, UriError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| UriError::Percent { segment: s.into() })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UriError::Utf8 { segment: s.into() })
}

/// The MIME type a file's name suggests (None when it suggests nothing).
pub fn mime_for(path: &str) -> Option<&'static str> {
    let ext = path.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "txt" | "log" | "out" => "text/plain",
        "md" => "text/markdown",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "html" | "htm" => "text/html",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "py" => "text/x-python",
        "js" | "mjs" => "text/javascript",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "parquet" => "application/vnd.apache.parquet",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        _ => return None,
    })
}

/// A size for people: `532 B`, `1.2 KiB`, `3.4 MiB`.
pub fn human_size(n: u64) -> String {
    const K: f64 = 1024.0;
    let f = n as f64;
    if f < K {
        format!("{n} B")
    } else if f < K * K {
        format!("{:.1} KiB", f / K)
    } else if f < K * K * K {
        format!("{:.1} MiB", f / K / K)
    } else {
        format!("{:.1} GiB", f / K / K / K)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::DirId;

    #[test]
    fn shown_uris_have_one_shape() {
        let u = shown_uri("a b", "figures", 3, 2, "png");
        assert_eq!(u, "replbox://sessions/a%20b/figures/3-2.png");
        assert_eq!(parse_shown_uri(&u).as_deref(), Some("a b"));
        for bad in [
            "replbox://sessions/s/figures/../files/x",
            "replbox://sessions/s/displays/1-1.png/x",
            "replbox://sessions/s/displays/1-1.PNG",
            "replbox://sessions/s/displays/1-1.html?x",
            "replbox://sessions/s/displays/-1.png",
            "replbox://sessions/s/files/1-1.png",
            "replbox://sessions/s/x/displays/1-1.png",
        ] {
            assert_eq!(parse_shown_uri(bad), None, "{bad}");
        }
    }

    #[test]
    fn output_uris_have_one_shape() {
        let u = output_uri("a b", 7);
        assert_eq!(u, "replbox://sessions/a%20b/outputs/7.txt");
        assert_eq!(parse_output_uri(&u), Some(("a b".into(), u.clone(), None)));
        let p = format!("{u}?page=12");
        assert_eq!(parse_output_uri(&p), Some(("a b".into(), u, Some(12))));
        for bad in [
            "replbox://sessions/s/outputs/1.txt?page=0",
            "replbox://sessions/s/outputs/1.txt?page=-1",
            "replbox://sessions/s/outputs/1.txt?page=1&page=2",
            "replbox://sessions/s/outputs/1.txt?page=1234567890",
            "replbox://sessions/s/outputs/1.txt?x=1",
            "replbox://sessions/s/outputs/1.txt?",
            "replbox://sessions/s/outputs/../files/x.txt",
            "replbox://sessions/s/outputs/1.txt/x",
            "replbox://sessions/s/outputs/1.TXT",
            "replbox://sessions/s/outputs/.txt",
            "replbox://sessions/s/x/outputs/1.txt",
            "replbox://sessions/s/files/1.txt",
        ] {
            assert_eq!(parse_output_uri(bad), None, "{bad}");
        }
    }

    #[test]
    fn uris_round_trip_and_refuse_smuggled_separators() {
        let uri = file_uri("abc-1", "out dir/ré sult%.csv");
        assert_eq!(
            uri,
            "replbox://sessions/abc-1/files/out%20dir/r%C3%A9%20sult%25.csv"
        );
        assert_eq!(
            parse_uri(&uri).unwrap(),
            ("abc-1".into(), "out dir/ré sult%.csv".into())
        );
        assert!(parse_uri("replbox://sessions/x/files/a%2F..%2Fb").is_err());
        assert!(parse_uri("file:///etc/passwd").is_err());
        assert!(parse_uri("replbox://sessions/x/files/%zz").is_err());
        assert_eq!(
            parse_export_uri(&export_uri("abc-1", "ipynb")),
            Some(("abc-1".into(), "ipynb".into()))
        );
        assert_eq!(
            parse_export_uri("replbox://sessions/x/export.py/../a"),
            None
        );
        assert_eq!(
            parse_export_uri("replbox://sessions/x/files/export.py"),
            None
        );
    }

    #[test]
    fn snapshot_diff_sees_created_modified_deleted_and_skips_hidden() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::write(p.join("keep.txt"), "a").unwrap();
        std::fs::write(p.join("change.txt"), "a").unwrap();
        std::fs::write(p.join("gone.txt"), "a").unwrap();
        std::fs::create_dir(p.join(".cache")).unwrap();
        std::fs::create_dir(p.join("ctl")).unwrap();
        let skip = [DirId::of(&p.join("ctl")).unwrap()];
        let fd = hostfs::open_dir_path(&std::fs::canonicalize(p).unwrap()).unwrap();
        let snapshot = |p: &std::path::Path, max, skip: &[DirId]| {
            assert!(p.is_dir());
            super::snapshot(fd.as_fd(), max, skip)
        };
        let before = snapshot(p, 100, &skip);
        assert!(before.complete);
        std::fs::write(p.join("change.txt"), "bb").unwrap();
        std::fs::remove_file(p.join("gone.txt")).unwrap();
        std::fs::create_dir(p.join("sub")).unwrap();
        std::fs::write(p.join("sub/new.csv"), "x,y\n").unwrap();
        std::fs::write(p.join(".cache/noise"), "n").unwrap();
        std::fs::write(p.join("ctl/cell.py"), "n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", p.join("link")).unwrap();
        let after = snapshot(p, 100, &skip);
        let changes = diff("s", &before, &after);
        let got: Vec<(&str, Change)> = changes
            .iter()
            .map(|c| (c.path.as_str(), c.change))
            .collect();
        assert_eq!(
            got,
            vec![
                ("change.txt", Change::Modified),
                ("gone.txt", Change::Deleted),
                ("sub/new.csv", Change::Created),
            ]
        );
        assert_eq!(changes[2].size, 4);
        let partial = snapshot(p, 2, &skip);
        assert!(!partial.complete);
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_size(532), "532 B");
        assert_eq!(human_size(1229), "1.2 KiB");
        assert_eq!(human_size(3 * 1024 * 1024 + 400_000), "3.4 MiB");
    }
}

/// A file `session_start` puts into the session's directory.
#[derive(Debug, Clone, Default)]
pub struct InFile {
    /// Where to put it, relative to the session's directory (default: the source's name).
    pub name: Option<String>,
    /// A file on the server's machine to copy.
    pub path: Option<PathBuf>,
    /// Text to write.
    pub content: Option<String>,
}

/// Most files one `session_start` may bring in.
pub const MAX_IN_FILES: usize = 100;

enum Source {
    /// Opened (as the session's user) while checking.
    Host(PathBuf, std::fs::File),
    Text(String),
}

/// Files brought in, to take away again if the session does not start.
#[derive(Debug, Default)]
pub struct Written {
    /// The files, relative to the directory.
    pub names: Vec<String>,
    /// Directories made for them, in the order they were made.
    dirs: Vec<String>,
}

impl Written {
    /// Remove what was brought in (as the session's user, beneath the directory).
    pub fn remove(&self, dest: BorrowedFd<'_>) {
        for name in &self.names {
            let parts: Vec<&str> = name.split('/').collect();
            let _ = hostfs::remove_beneath(dest, &parts, false);
        }
        for d in self.dirs.iter().rev() {
            let parts: Vec<&str> = d.split('/').collect();
            let _ = hostfs::remove_beneath(dest, &parts, true);
        }
    }
}

/// Bring the files `session_start` was asked for into the directory `dest`, as the calling
/// thread's user (run it through [`as_uid`](crate::hostfs::as_uid)): everything is checked
/// first (names, sources, that nothing is overwritten or reached through a link, that the
/// user may write there), then written beneath `dest`. On any failure nothing stays.
/// `host_paths`: the policy for files of the server's machine (a cwd's: see
/// [`check_caller_path`](hostfs::check_caller_path)), when this caller may copy them; `user` names
/// the session's user in messages.
pub fn bring_in(
    files: Vec<InFile>,
    dest: BorrowedFd<'_>,
    host_paths: Option<&CwdPolicy>,
    user: &str,
) -> Result<Written, InFileError> {
    let items = plan(files, dest, host_paths, user)?;
    let mut done = Written::default();
    for (parts, source) in items {
        let name = parts.join("/");
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let from = match &source {
            Source::Host(p, _) => Some(p.clone()),
            Source::Text(_) => None,
        };
        let res = (|| -> std::io::Result<()> {
            let (mut out, made) = hostfs::create_beneath(dest, &refs)?;
            done.dirs.extend(made);
            done.names.push(name.clone());
            match source {
                Source::Host(_, mut input) => {
                    std::io::copy(&mut input, &mut out)?;
                }
                Source::Text(ref t) => std::io::Write::write_all(&mut out, t.as_bytes())?,
            }
            Ok(())
        })();
        if let Err(e) = res {
            done.remove(dest);
            return Err(InFileError::Write {
                name,
                from,
                source: e,
            });
        }
    }
    Ok(done)
}

/// Check every entry before anything is written.
fn plan(
    files: Vec<InFile>,
    dest: BorrowedFd<'_>,
    host_paths: Option<&CwdPolicy>,
    user: &str,
) -> Result<Vec<(Vec<String>, Source)>, InFileError> {
    if files.len() > MAX_IN_FILES {
        return Err(InFileError::TooMany { count: files.len() });
    }
    let mut items: Vec<(Vec<String>, Source)> = Vec::new();
    for (i, f) in files.into_iter().enumerate() {
        let at = |why: EntryError| InFileError::Entry { index: i, why };
        let (source, default_name) = match (f.path, f.content) {
            (Some(_), Some(_)) | (None, None) => return Err(at(EntryError::Source)),
            (Some(path), None) => {
                let Some(policy) = host_paths else {
                    return Err(at(EntryError::NotLocal));
                };
                // The cwd's policy (masked trees, workspaces, system directories), then
                // opened where it was checked, as the session's user.
                let file = hostfs::open_caller_file(policy, &path, user)
                    .map_err(|e| at(EntryError::Path(e)))?;
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .map(str::to_string);
                (Source::Host(path, file), name)
            }
            (None, Some(text)) => (Source::Text(text), None),
        };
        let name = f
            .name
            .or(default_name)
            .ok_or_else(|| at(EntryError::NoName))?;
        let parts: Vec<String> = crate::workspace::check_relative(&name)
            .map_err(|e| at(EntryError::Name(e)))?
            .into_iter()
            .map(str::to_string)
            .collect();
        if items.iter().any(|(p, _)| *p == parts) {
            return Err(at(EntryError::Twice(name)));
        }
        check_target(dest, &parts, user).map_err(|e| at(EntryError::Target(e)))?;
        items.push((parts, source));
    }
    Ok(items)
}

/// The target must be new, reached through real directories only, in a directory the
/// user may write.
fn check_target(dest: BorrowedFd<'_>, parts: &[String], user: &str) -> Result<(), TargetError> {
    let walk = Walk::default();
    let shown = || parts.join("/");
    let mut held: Option<OwnedFd> = None;
    let mut depth = 0;
    for (k, part) in parts.iter().enumerate() {
        let dir = held.as_ref().map_or(dest, |f| f.as_fd());
        let last = k + 1 == parts.len();
        let at = || parts[..=k].join("/");
        match rustix::fs::statat(dir, part.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Err(rustix::io::Errno::NOENT) => break,
            Err(e) => {
                return Err(TargetError::Stat {
                    name: shown(),
                    source: e.into(),
                });
            }
            Ok(_) if last => return Err(TargetError::Exists { name: shown() }),
            Ok(st) => match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    let sub = hostfs::open_subdir(dir, part, &walk).map_err(|source| {
                        TargetError::Open {
                            name: shown(),
                            at: at(),
                            source,
                        }
                    })?;
                    held = Some(sub);
                    depth = k + 1;
                }
                FileType::Symlink => {
                    return Err(TargetError::Link {
                        name: shown(),
                        at: at(),
                    });
                }
                _ => {
                    return Err(TargetError::NotDirectory {
                        name: shown(),
                        at: at(),
                    });
                }
            },
        }
    }
    let dir = held.as_ref().map_or(dest, |f| f.as_fd());
    if !hostfs::may(
        dir,
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    ) {
        let place = if depth == 0 {
            "the session's directory".to_string()
        } else {
            parts[..depth].join("/")
        };
        return Err(TargetError::ReadOnly {
            user: user.into(),
            place,
            name: shown(),
        });
    }
    Ok(())
}

/// Why the files asked for at start were not brought in (nothing of them stays).
#[derive(Debug, thiserror::Error)]
pub enum InFileError {
    #[error(
        "files: {count} entries; at most {MAX_IN_FILES} can be brought in at start (put many \
         files in a folder and pass it as cwd instead)"
    )]
    TooMany { count: usize },
    /// `files[index]` is refused.
    #[error("files[{index}]: {why}")]
    Entry { index: usize, why: EntryError },
    /// Writing one failed (`from`: the host file it copies).
    #[error("cannot bring in {name}{}: {source}", from_shown(.from.as_deref()))]
    Write {
        name: String,
        from: Option<PathBuf>,
        source: std::io::Error,
    },
}

fn from_shown(from: Option<&Path>) -> String {
    from.map(|p| format!(" from {}", p.display()))
        .unwrap_or_default()
}

/// Why one entry of `files` is refused.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error(
        "give either path (a file on the server's machine to copy) or content (the text to \
         write), not both or neither"
    )]
    Source,
    #[error(
        "copying a file of the server's machine (path) is only allowed to the local client; \
         send the data as content instead"
    )]
    NotLocal,
    #[error(transparent)]
    Path(HostfsError),
    #[error("name is required with content (where to write it, e.g. \"data.csv\")")]
    NoName,
    /// The name is not a relative path.
    #[error("name: {0}")]
    Name(crate::workspace::RelPathError),
    #[error("name: {0:?} is given twice")]
    Twice(String),
    #[error(transparent)]
    Target(TargetError),
}

/// Why an entry's target in the session's directory is refused (`name`: the whole name).
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("{name}: {source}")]
    Stat {
        name: String,
        source: std::io::Error,
    },
    #[error("{name} already exists in the session's directory; it is not overwritten")]
    Exists { name: String },
    #[error("{name}: {at}: {source}")]
    Open {
        name: String,
        at: String,
        source: std::io::Error,
    },
    #[error("{name} goes through a symbolic link ({at}); links are not followed")]
    Link { name: String, at: String },
    #[error("{name}: {at} is not a directory")]
    NotDirectory { name: String, at: String },
    #[error(
        "{user} may not write in {place}, so {name} cannot be brought in (the directory is \
         read-only for the session: give it write permission for that user, or leave cwd out \
         to use a private directory)"
    )]
    ReadOnly {
        user: String,
        place: String,
        name: String,
    },
}
