//! The client of the store of shared layers (`shared`): a request whose set is known is
//! taken from the store, read-only, without running the installer; one not there yet is
//! installed into a layer of the store's `building/`, sealed and put in the store, then
//! taken. The layer that takes a shared one holds it (and its packages) while it lives, so
//! that no server's eviction removes it.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::answer::{Installed, PackageError};
use super::layer::{Layer, layer_is_empty};
use super::python::{self, Unmet};
use super::resolved::resolved_key;
use super::{Eco, Packages, cache, npm, shared, spec};

/// What building a set's shared layer came to.
enum Built {
    /// Sealed, put in the store and taken by the layer.
    Taken(Installed),
    /// npm said nothing of what it installed: nothing to key a layer by.
    Unkeyed,
    /// A package has no wheel, and the operator allows source builds.
    NoWheel,
}

impl Packages {
    /// Install a run's or session's `packages` (checked here) into its `layer` before its
    /// program starts (or into a warm session that has run nothing of its caller's): a set
    /// whose exact pins are known (resolved lately, or exact pins themselves; npm's: the
    /// whole tree it resolved to lately) is taken from the store of shared layers,
    /// read-only, without running the installer; one not there yet is built there (see
    /// `shared`) and taken. Otherwise (nothing shared at this level, a layer that holds
    /// packages already) as [`install`](Self::install).
    pub async fn provide(
        self: &Arc<Self>,
        exe: &Path,
        specs: &[String],
        layer: &Layer,
        principal: &str,
        cancel: &CancellationToken,
    ) -> Result<Installed, PackageError> {
        if layer.store.is_none() || layer.shared_dir().is_some() || !layer_is_empty(&layer.dir) {
            return self.install(exe, specs, layer, principal, cancel).await;
        }
        let started = Instant::now();
        let checked = spec::check(layer.eco, specs)?;
        if checked.is_empty() {
            return self.install(exe, specs, layer, principal, cancel).await;
        }
        let Some(tag) = self.store.tag(exe, layer.eco).await else {
            return self.install(exe, specs, layer, principal, cancel).await;
        };
        let index = self.index_url(layer.eco).to_string();
        let texts: Vec<String> = checked.iter().map(|s| s.text.clone()).collect();
        let asked = resolved_key(exe, &index, &texts);
        let gate = self.upkeep.gate.read().await;
        if let Some(out) = self.take_known(layer, &asked, &checked, (&index, &tag), started)? {
            return Ok(out);
        }
        let built = self
            .build_shared(
                exe,
                &checked,
                layer,
                asked,
                (&index, &tag),
                (principal, cancel),
                started,
            )
            .await;
        drop(gate);
        match built {
            // Built from source: into this run's or session's own layer, never the store
            // (what is there is only what the index served, verified by its hashes).
            Ok(Built::NoWheel) => {
                self.build_python(exe, &checked, layer, (principal, cancel), started)
                    .await
            }
            Ok(Built::Taken(out)) => {
                // The store grew (and the cache, when it downloaded): measured, kept in the
                // cap.
                self.upkeep_in_background();
                Ok(out)
            }
            // npm said nothing of what it installed: nothing to key a layer by, so into the
            // run's or session's own.
            Ok(Built::Unkeyed) => {
                tracing::warn!("packages: npm left no lockfile; installing into the layer");
                self.install(exe, specs, layer, principal, cancel).await
            }
            Err(e) => Err(e),
        }
    }

    /// Known pins for the request `asked`, and their layer in the store: `layer` takes it,
    /// nothing runs. Held first (so that no server evicts it once found), then looked for.
    fn take_known(
        &self,
        layer: &Layer,
        asked: &str,
        checked: &[spec::Spec],
        (index, tag): (&str, &str),
        started: Instant,
    ) -> Result<Option<Installed>, PackageError> {
        let Some(pins) = self.resolved.get(asked).filter(|p| !p.is_empty()) else {
            return Ok(None);
        };
        let key = self.store.key(layer.eco, &pins, index, tag);
        let hold = self.store.hold(&key).map_err(|e| {
            PackageError::Failed(format!("packages: cannot hold a shared layer: {e}"))
        })?;
        if !self.store.path(&key).is_dir() {
            return Ok(None);
        }
        let mut out = match layer.eco {
            Eco::Python => python::of_pins(pins),
            Eco::Npm => npm::of_layout(&pins, checked),
        };
        out.duration_ms = started.elapsed().as_millis() as u64;
        self.attach(layer, &key, &out, hold);
        self.metrics.offline(out.installed.len());
        Ok(Some(out))
    }

    /// Build the layer of `checked` (the request `asked`): the installer fills a directory
    /// of its own in `building/` (offline from the pins when known), the server seals it
    /// and puts it in the store, and `layer` takes it.
    #[allow(clippy::too_many_arguments)]
    async fn build_shared(
        &self,
        exe: &Path,
        checked: &[spec::Spec],
        layer: &Layer,
        asked: String,
        (index, tag): (&str, &str),
        ask: (&str, &CancellationToken),
        started: Instant,
    ) -> Result<Built, PackageError> {
        let building = self
            .store
            .build(self.installer)
            .map_err(|e| PackageError::Failed(format!("cannot make a package layer: {e}")))?;
        let build = Layer::new(building.dir.clone(), layer.eco, false, None, None);
        let r = match layer.eco {
            Eco::Python => {
                self.install_wheels(exe, checked, &build, ask, started)
                    .await
            }
            Eco::Npm => {
                self.upkeep.saw_node(exe);
                self.install_npm(exe, checked, &build, ask, started)
                    .await
                    .map_err(Unmet::from)
            }
        };
        let r = match r {
            Err(u) if u.no_wheel && self.builds => Ok(Built::NoWheel),
            Err(u) => Err(u.error),
            Ok(out) => match set_of(layer.eco, &out, &build.dir).await {
                Some(set) => self
                    .publish(layer, &build.dir, &set, (index, tag), &out)
                    .await
                    .map(|()| {
                        if layer.eco == Eco::Npm {
                            self.resolved.put(asked, set);
                        }
                        Built::Taken(out)
                    }),
                None => Ok(Built::Unkeyed),
            },
        };
        // What is left of the build (nothing once published) goes, with its lock.
        let _ = tokio::task::spawn_blocking(move || drop(building)).await;
        r
    }

    /// Seal the layer built in `built` (holding `out`, the set `set`) and put it in the
    /// store under the key of `set` for `(index, tag)`; `layer` takes it.
    async fn publish(
        &self,
        layer: &Layer,
        built: &Path,
        set: &[String],
        (index, tag): (&str, &str),
        out: &Installed,
    ) -> Result<(), PackageError> {
        let key = self.store.key(layer.eco, set, index, tag);
        // Held before it is in the store: another server's eviction never sees it there
        // unheld.
        let hold = self.store.hold(&key).map_err(|e| {
            PackageError::Failed(format!("packages: cannot hold a shared layer: {e}"))
        })?;
        let (store, built, k) = (self.store.dir.clone(), built.to_path_buf(), key.clone());
        tokio::task::spawn_blocking(move || shared::publish(&store, &built, &k))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            .map_err(|e| {
                PackageError::Failed(format!(
                    "packages: cannot put the installed packages in place: {e}"
                ))
            })?;
        self.attach(layer, &key, out, hold);
        Ok(())
    }

    /// `layer` takes the shared layer `key` (which holds `out`'s packages), held by `hold`:
    /// on its search path, and held (with its packages) while it lives. Called with the gate
    /// shared, so that no eviction of this server's runs between finding the layer and
    /// holding it.
    fn attach(&self, layer: &Layer, key: &str, out: &Installed, hold: shared::Hold) {
        *layer.shared.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.store.path(key));
        *layer.shared_set.lock().unwrap_or_else(|e| e.into_inner()) = Some(out.clone());
        *layer.hold.lock().unwrap_or_else(|e| e.into_inner()) = Some(hold);
        let mut held = layer.held.lock().unwrap_or_else(|e| e.into_inner());
        self.upkeep.book.used(layer.eco, &out.installed, &mut held);
        self.upkeep.book.hold(&cache::layer_key(key), &mut held);
    }
}

/// What the shared layer built in `dir`, holding `out`, is keyed by: Python's pins; npm's
/// whole tree, as its lockfile says (the requested packages' versions do not fix their
/// dependencies'). None when there is nothing to key it by.
async fn set_of(eco: Eco, out: &Installed, dir: &Path) -> Option<Vec<String>> {
    let set = match eco {
        Eco::Python => Some(out.pins.clone()),
        Eco::Npm => {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || npm::layout(&dir))
                .await
                .ok()
                .flatten()
        }
    };
    set.filter(|s| !s.is_empty())
}
