//! Bearer tokens: where they come from, what principal each one is, and the check.
//!
//! Tokens are kept only as SHA-256 digests. A presented token is hashed and compared with
//! every configured digest in constant time (no early exit, no length leak), so the time
//! a check takes says nothing about how close a guess was. Tokens are never logged; a
//! principal's name (from a tokens file, or `token-N`) is what logs and ownership use.

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::identity::Caller;

/// Longest token accepted (it has to fit in a header line).
const MAX_TOKEN_LEN: usize = 4096;
/// Shorter tokens work but are warned about.
const MIN_RECOMMENDED_LEN: usize = 16;

struct Entry {
    digest: [u8; 32],
    caller: Caller,
}

/// The configured tokens. Empty means the server runs without authentication (allowed on
/// loopback addresses only; see `http::serve`).
#[derive(Default)]
pub struct Tokens {
    entries: Vec<Entry>,
}

/// What the `Authorization` header said.
#[derive(Debug, PartialEq, Eq)]
pub enum Presented<'a> {
    Missing,
    /// A header that is not `Bearer <token>`.
    Malformed,
    Bearer(&'a [u8]),
}

fn digest(token: &[u8]) -> [u8; 32] {
    let d = Sha256::digest(token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_slice());
    out
}

/// A principal name: short, printable, safe in logs.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'))
}

fn reserved_name(name: &str) -> bool {
    name.strip_prefix("token-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A name an internal principal has: the local one (stdio, or HTTP without tokens), which
/// may copy host files into a session. A token must never become it, whatever the case.
fn internal_name(name: &str) -> bool {
    name.eq_ignore_ascii_case(&Caller::local().principal)
}

fn check_token(token: &str, whence: &str) -> anyhow::Result<()> {
    if token.is_empty() {
        anyhow::bail!("{whence}: empty token");
    }
    if token.len() > MAX_TOKEN_LEN {
        anyhow::bail!("{whence}: token longer than {MAX_TOKEN_LEN} bytes");
    }
    if token.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
        anyhow::bail!("{whence}: a token must be printable ASCII without spaces");
    }
    Ok(())
}

impl Tokens {
    /// Tokens from the command line or `REPLBOX_TOKENS` (named `token-1`, ... in order),
    /// then from the tokens file (`NAME:TOKEN`, or `TOKEN` named like the others).
    pub fn load(listed: &[String], file: Option<&Path>) -> anyhow::Result<Self> {
        let mut named: Vec<(Option<String>, String, String)> = Vec::new();
        for (i, t) in listed.iter().enumerate() {
            let t = t.trim();
            if t.is_empty() {
                continue; // a trailing comma in REPLBOX_TOKENS
            }
            let whence = format!("token #{} of --token/REPLBOX_TOKENS", i + 1);
            check_token(t, &whence)?;
            named.push((None, t.to_string(), whence));
        }
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("tokens file {}: {e}", path.display()))?;
            warn_if_readable_by_others(path);
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let whence = format!("{} line {}", path.display(), n + 1);
                let (name, token) = match line.split_once(':') {
                    Some((name, token)) => {
                        let name = name.trim();
                        if !valid_name(name) {
                            anyhow::bail!(
                                "{whence}: a principal name is 1-64 characters of A-Z a-z 0-9 - _ . @"
                            );
                        }
                        if reserved_name(name) {
                            anyhow::bail!(
                                "{whence}: names token-N are reserved for unnamed tokens"
                            );
                        }
                        if internal_name(name) {
                            anyhow::bail!(
                                "{whence}: the name {name:?} is reserved for the local principal \
                                 (the stdio client), which has rights no token may have; \
                                 choose another name"
                            );
                        }
                        (Some(name.to_string()), token.trim())
                    }
                    None => (None, line),
                };
                check_token(token, &whence)?;
                named.push((name, token.to_string(), whence));
            }
        }
        let mut entries: Vec<Entry> = Vec::new();
        let mut unnamed = 0;
        for (name, token, whence) in named {
            let d = digest(token.as_bytes());
            if entries.iter().any(|e| e.digest == d) {
                anyhow::bail!("{whence}: this token is given twice");
            }
            if token.len() < MIN_RECOMMENDED_LEN {
                tracing::warn!(
                    "{whence}: token shorter than {MIN_RECOMMENDED_LEN} characters; use a long random one"
                );
            }
            let principal = match name {
                Some(n) => n,
                None => {
                    unnamed += 1;
                    format!("token-{unnamed}")
                }
            };
            entries.push(Entry {
                digest: d,
                caller: Caller { principal },
            });
        }
        Ok(Self { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Distinct principals (several tokens may share a name, e.g. while rotating).
    pub fn principals(&self) -> usize {
        let mut names: Vec<&str> = self
            .entries
            .iter()
            .map(|e| e.caller.principal.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    }

    /// The principal of a presented token, comparing against every configured token in
    /// constant time.
    pub fn verify(&self, presented: &[u8]) -> Option<Caller> {
        let d = digest(presented);
        let mut hit = u32::MAX;
        for (i, e) in self.entries.iter().enumerate() {
            hit.conditional_assign(&(i as u32), e.digest.ct_eq(&d));
        }
        self.entries.get(hit as usize).map(|e| e.caller.clone())
    }
}

/// Parse an `Authorization` header value: `Bearer <token>` (scheme case-insensitive).
pub fn presented(value: Option<&[u8]>) -> Presented<'_> {
    let Some(v) = value else {
        return Presented::Missing;
    };
    let Some(space) = v.iter().position(|&b| b == b' ') else {
        return Presented::Malformed;
    };
    let (scheme, rest) = v.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Presented::Malformed;
    }
    let token = rest.trim_ascii();
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Presented::Malformed;
    }
    Presented::Bearer(token)
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            "tokens file {} can be read by other users; chmod 600 it",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(listed: &[&str], file: Option<&str>) -> anyhow::Result<Tokens> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        if let Some(f) = file {
            std::fs::write(&path, f).unwrap();
        }
        let listed: Vec<String> = listed.iter().map(|s| s.to_string()).collect();
        Tokens::load(&listed, file.map(|_| path.as_path()))
    }

    #[test]
    fn names_and_verification() {
        let t = tokens(
            &["first-token-aaaaaaaa", "second-token-bbbbbbb", ""],
            Some("# comment\n\nalice:alice-token-1234567\n  bob : bob-token-12345678 \nthird-token-ccccccc\nalice:alice-rotated-7654321\n"),
        )
        .unwrap();
        let who = |tok: &str| t.verify(tok.as_bytes()).map(|c| c.principal);
        assert_eq!(who("first-token-aaaaaaaa").as_deref(), Some("token-1"));
        assert_eq!(who("second-token-bbbbbbb").as_deref(), Some("token-2"));
        assert_eq!(who("third-token-ccccccc").as_deref(), Some("token-3"));
        assert_eq!(who("alice-token-1234567").as_deref(), Some("alice"));
        assert_eq!(who("alice-rotated-7654321").as_deref(), Some("alice"));
        assert_eq!(who("bob-token-12345678").as_deref(), Some("bob"));
        assert_eq!(who("bob-token-1234567"), None);
        assert_eq!(who(""), None);
        assert_eq!(t.principals(), 5);
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(tokens(&[], Some("a b c\n")).is_err(), "spaces");
        assert!(tokens(&[], Some("bad name:tok\n")).is_err(), "name");
        assert!(tokens(&[], Some("token-3:tok\n")).is_err(), "reserved");
        for name in ["local", "LOCAL", "Local"] {
            let e = tokens(&[], Some(&format!("{name}:tok-of-{name}\n"))).err();
            assert!(
                e.is_some_and(|e| e.to_string().contains("reserved")),
                "{name}"
            );
        }
        assert!(tokens(&[], Some("locale:tok\n")).is_ok());
        assert!(tokens(&[], Some("x:\n")).is_err(), "empty token");
        assert!(tokens(&["dup"], Some("dup\n")).is_err(), "duplicate");
        assert!(Tokens::load(&[], Some(Path::new("/nonexistent/tokens"))).is_err());
        assert!(tokens(&[], Some("# only a comment\n")).unwrap().is_empty());
    }

    #[test]
    fn authorization_header() {
        assert_eq!(presented(None), Presented::Missing);
        assert_eq!(presented(Some(b"Bearer abc")), Presented::Bearer(b"abc"));
        assert_eq!(presented(Some(b"bearer   abc ")), Presented::Bearer(b"abc"));
        assert_eq!(presented(Some(b"Basic abc")), Presented::Malformed);
        assert_eq!(presented(Some(b"Bearer")), Presented::Malformed);
        assert_eq!(presented(Some(b"Bearer ")), Presented::Malformed);
    }
}
