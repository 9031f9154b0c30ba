//! The memory of resolutions: what a request (its interpreter, index and specifiers)
//! resolved to lately, so that the same request installs the same versions from the cache,
//! offline, and a warm session can tell that it needs no network. In this server's memory
//! only, for [`RESOLVED_FRESH`].

use std::path::Path;
use std::time::{Duration, Instant};

use super::{Eco, Packages, spec};

impl Packages {
    /// Whether `specs` would be installed from the cache alone for the interpreter `exe`:
    /// the same request was resolved lately (see [`RESOLVED_FRESH`]).
    pub fn cached(&self, eco: Eco, exe: &Path, specs: &[String]) -> bool {
        let Ok(specs) = spec::check(eco, specs) else {
            return false;
        };
        let texts: Vec<String> = specs.iter().map(|s| s.text.clone()).collect();
        let index = match eco {
            Eco::Python => &self.index.url,
            Eco::Npm => &self.registry.url,
        };
        self.resolved
            .get(&resolved_key(exe, index, &texts))
            .is_some()
    }
}

/// What a request resolved to is kept under: the interpreter, the index and the request.
pub(super) fn resolved_key(python: &Path, index: &str, specs: &[String]) -> String {
    format!("{}\n{index}\n{}", python.display(), specs.join("\n"))
}

/// How long what a request resolved to stands in for asking the index again: a request
/// within it gets the same versions, from the cache, without the network.
const RESOLVED_FRESH: Duration = Duration::from_secs(3600);
/// Most requests whose resolution is kept (the oldest goes first).
const RESOLVED_MAX: usize = 512;

/// Recent resolutions: a request's specifiers to the exact pins it installed (the
/// installer's own output, from the index; npm's: the tree of its shared layer, see
/// `npm::layout`, or none when only asked), for [`RESOLVED_FRESH`].
#[derive(Default)]
pub(super) struct Resolved(
    std::sync::Mutex<std::collections::HashMap<String, (Vec<String>, Instant)>>,
);

impl Resolved {
    pub(super) fn get(&self, key: &str) -> Option<Vec<String>> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key)
            .filter(|(_, at)| at.elapsed() < RESOLVED_FRESH)
            .map(|(pins, _)| pins.clone())
    }

    /// `key` was asked lately, what it resolved to unknown (none): kept as it is when known.
    pub(super) fn mark(&self, key: String) {
        if self.get(&key).is_none() {
            self.put(key, Vec::new());
        }
    }

    pub(super) fn put(&self, key: String, pins: Vec<String>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, (_, at)| at.elapsed() < RESOLVED_FRESH);
        if map.len() >= RESOLVED_MAX
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(key, (pins, Instant::now()));
    }
}
