//! A run's or session's packages: its layer (a directory on its search path), what the
//! program is shown of it and of the shared layer it uses, what it holds in the cache's
//! books while it lives, and for a warm session, whose interpreter started before its layer
//! was filled, the code that makes the interpreter look again ([`warm_check`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::answer::Installed;
use super::{Eco, Packages, cache, shared};

/// One run's or session's packages: a directory on its PYTHONPATH (npm's: its
/// `node_modules/` on NODE_PATH). A run's is in the cache's `layers/` and removed when
/// dropped; a session's is in the session's own directory and goes with it.
#[derive(Debug)]
pub struct Layer {
    pub dir: PathBuf,
    pub eco: Eco,
    remove: bool,
    /// The packages installed into it, which eviction leaves in the cache while it lives
    /// (and the shared layer it uses, `layer:KEY`, which eviction leaves in the store).
    pub(super) held: std::sync::Mutex<Vec<String>>,
    book: Option<Arc<cache::Book>>,
    /// The store of shared layers, read-only to the layer's program from its start (a warm
    /// session takes one later, by its path); None where nothing is shared.
    pub(super) store: Option<PathBuf>,
    /// The shared layer (sealed, in the store) on its search path after `dir`.
    pub(super) shared: std::sync::Mutex<Option<PathBuf>>,
    /// What the shared layer holds (npm: a first installation into `dir` takes its
    /// requested packages along, see [`Packages::install`]).
    pub(super) shared_set: std::sync::Mutex<Option<Installed>>,
    /// The hold on that shared layer, which every server sharing the cache sees (its
    /// evictions leave the layer while it lives).
    pub(super) hold: std::sync::Mutex<Option<shared::Hold>>,
    /// A source build's code has had it writable (see `build_python`): it may hold links
    /// that uv would follow, so no installation with the shared cache goes into it again.
    pub(super) built: std::sync::atomic::AtomicBool,
}

impl Drop for Layer {
    fn drop(&mut self) {
        if let Some(book) = &self.book {
            book.release(&self.held.lock().unwrap_or_else(|e| e.into_inner()));
        }
        if !self.remove {
            return;
        }
        let dir = std::mem::take(&mut self.dir);
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(move || crate::workspace::remove_tree(&dir));
            }
            Err(_) => crate::workspace::remove_tree(&dir),
        }
    }
}

/// A Python or JavaScript session's packages: its layer (on its search path from the start,
/// so `%pip install` or `replbox.install` can fill it while it runs) and the operator's
/// interpreter the installs are for.
pub struct SessionPackages {
    /// The installer `%pip` runs.
    pub service: Arc<Packages>,
    pub layer: Layer,
    /// The interpreter (python, or the node that runs npm).
    pub exe: PathBuf,
}

impl Layer {
    /// A layer over `dir` (made): removed when dropped if `remove`; what it holds recorded in
    /// `book`; `store` the shared layers' store it reads, if any.
    pub(super) fn new(
        dir: PathBuf,
        eco: Eco,
        remove: bool,
        book: Option<Arc<cache::Book>>,
        store: Option<PathBuf>,
    ) -> Self {
        Self {
            dir,
            eco,
            remove,
            held: std::sync::Mutex::default(),
            book,
            store,
            shared: std::sync::Mutex::default(),
            shared_set: std::sync::Mutex::default(),
            hold: std::sync::Mutex::default(),
            built: Default::default(),
        }
    }

    /// What a child is given to import its packages: the directories it reads (its own
    /// layer, and the store of shared layers), and the variables naming them (its own
    /// first, so that what `%pip` puts there wins).
    pub fn view(&self) -> (Vec<PathBuf>, Vec<(String, String)>) {
        let mut dirs = vec![self.dir.clone()];
        dirs.extend(self.store.clone());
        let var = match self.eco {
            Eco::Python => {
                let mut path = self.dir.display().to_string();
                if let Some(s) = self.shared_dir() {
                    path = format!("{path}:{}", s.display());
                }
                ("PYTHONPATH".into(), path)
            }
            // node looks in it at every require: what is installed later is found at once.
            Eco::Npm => {
                let mut path = self.dir.join("node_modules").display().to_string();
                if let Some(s) = self.shared_dir() {
                    path = format!("{path}:{}", s.join("node_modules").display());
                }
                ("NODE_PATH".into(), path)
            }
        };
        (dirs, vec![var])
    }

    /// Whether a source build's code has had it writable.
    pub(super) fn was_built(&self) -> bool {
        self.built.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// [`view`](Self::view)'s variables for a program whose variables `env` were made
    /// before it was given its shared layer (a warm session's): each one's value as the
    /// view says it, then whatever followed the layer's own directory in it.
    pub fn update_view(&self, env: &mut Vec<(String, String)>) {
        let own = match self.eco {
            Eco::Python => self.dir.display().to_string(),
            Eco::Npm => self.dir.join("node_modules").display().to_string(),
        };
        for (k, v) in self.view().1 {
            let rest = env
                .iter()
                .find(|(n, _)| *n == k)
                .and_then(|(_, old)| old.strip_prefix(&own))
                .unwrap_or("")
                .to_string();
            crate::exec::env::set(env, &k, format!("{v}{rest}"));
        }
    }

    /// What the shared layer it uses holds, if any.
    pub(super) fn shared_set(&self) -> Option<Installed> {
        self.shared_set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The shared layer it uses, if any.
    pub fn shared_dir(&self) -> Option<PathBuf> {
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What [`warm_check`]'s code prints when the session can take its layer as it is.
pub const WARM_CLEAR: &str = "replbox-layer-clear";

/// Most top-level names of a layer [`warm_check`] asks about.
const WARM_CHECK_NAMES: usize = 2000;

/// For a Python layer filled after its interpreter started (a warm session's): code that
/// makes the import system look at the layer again and prints [`WARM_CLEAR`] unless a
/// module of the same name as one the layer now holds at its top level is already
/// imported (that one, not the layer's, would be what `import` gives). For npm, code that
/// puts the shared layer's `node_modules/` on node's search path after the layer's own, as
/// NODE_PATH would have at a cold start (node's `require` looks in it at every call, and
/// nothing is preloaded); None without a shared layer.
pub fn warm_check(layer: &Layer) -> Option<String> {
    let shared = layer.shared_dir();
    if layer.eco == Eco::Npm {
        let path = format!(
            "{}:{}",
            layer.dir.join("node_modules").display(),
            shared?.join("node_modules").display()
        );
        let path = serde_json::to_string(&path).ok()?;
        // The warm session has run nothing of its caller's: node's own module loader.
        return Some(format!(
            "void ((m) => {{ process.env.NODE_PATH = {path}; m._initPaths(); \
             console.log({WARM_CLEAR:?}); }})(require('module'))"
        ));
    }
    let mut names: Vec<String> = [Some(layer.dir.clone()), shared.clone()]
        .into_iter()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter_map(|e| {
            let n = e.file_name().to_str()?.to_string();
            let stem = n.split('.').next()?.to_string();
            let ident = stem
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            (ident && !n.ends_with(".dist-info") && !n.ends_with(".data")).then_some(stem)
        })
        .take(WARM_CHECK_NAMES)
        .collect();
    names.sort();
    names.dedup();
    let list = serde_json::to_string(&names).ok()?;
    // The shared layer goes on sys.path right after the session's own (as PYTHONPATH
    // would have put it at a cold start): the store is visible to the session from its
    // start, the layer's path is known to it only now.
    let add = match &shared {
        Some(sh) => {
            let (own, sh) = (
                serde_json::to_string(&layer.dir.display().to_string()).ok()?,
                serde_json::to_string(&sh.display().to_string()).ok()?,
            );
            format!(
                "s.path.insert(s.path.index({own}) + 1 if {own} in s.path else 0, {sh}) \
                 if {sh} not in s.path else None, "
            )
        }
        None => String::new(),
    };
    // One expression that leaves no name behind and whose value (None) is not shown.
    Some(format!(
        "(lambda i, s: [{add}i.invalidate_caches(), print({WARM_CLEAR:?} if not \
         [n for n in {list} if n in s.modules] else 'replbox-layer-shadowed')] and None)\
         (__import__('importlib'), __import__('sys'))"
    ))
}

/// Whether `dir` holds nothing yet.
pub(super) fn layer_is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}
