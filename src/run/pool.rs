//! The warm pool for `run-code`: per language (those whose file has a `[run.pool]` section) a
//! few interpreters started ahead of time, each in its own private run directory, each used
//! for one run and then gone, and replaced in the background after that run.
//!
//! A pooled interpreter is an ordinary child: it is spawned through `exec::spawn` (so under
//! the helper, with the run's environment and directory, like any cold run) running the
//! language's loader, which waits on stdin for one request and then runs the program the
//! way the language's `run.command` would (see [`request`] for the format). This module
//! only keeps the books: which interpreters are ready, how many are starting, and when the
//! pool is closed. Spawning and running are `run::Runner`'s.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::exec::Proc;
use crate::run::Place;

/// A pooled interpreter waiting for its program. Dropping it kills its tree (the helper
/// tears it down on SIGTERM) and removes its directory.
pub struct Warm {
    pub proc: Proc,
    /// Where it runs: its private directory (the run's directory once it is used) and its
    /// uid. Dropped after `proc`, so the uid is returned once its processes are gone.
    pub place: Place,
    pub born: Instant,
}

impl Warm {
    /// Whether the interpreter has ended (it cannot run anything any more).
    fn ended(&mut self) -> bool {
        !matches!(self.proc.child.try_wait(), Ok(None))
    }
}

/// An interpreter idle for longer than this is replaced rather than used, so that a run never
/// sees a machine older than a few minutes (files installed meanwhile, a changed time zone).
pub const MAX_IDLE: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Slot {
    ready: VecDeque<Warm>,
    /// Interpreters being started for this language.
    starting: usize,
    /// Consecutive failures to start one: refilling stops after a few, until a start works.
    failures: u32,
}

/// The pools of every language, each holding up to `size` interpreters.
pub struct Pool {
    size: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    slots: HashMap<String, Slot>,
    /// Filling has begun (`serve` fills; a one-shot `replbox run` never does).
    active: bool,
    closed: bool,
}

/// Refilling stops after this many consecutive failed starts of a language's interpreter.
const MAX_FAILURES: u32 = 3;

impl Pool {
    pub fn new(size: usize) -> Self {
        Self {
            size,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn enabled(&self) -> bool {
        self.size > 0
    }

    /// Interpreters kept ready per language.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Let refills happen from now on (until [`close`](Self::close)).
    pub fn activate(&self) {
        let mut st = self.lock();
        if !st.closed {
            st.active = true;
        }
    }

    /// Take a ready interpreter of `lang`, the oldest first; ones that ended or idled too
    /// long are dropped on the way.
    pub fn take(&self, lang: &str) -> Option<Warm> {
        let mut discarded = Vec::new();
        let taken = {
            let mut st = self.lock();
            let slot = st.slots.get_mut(lang)?;
            loop {
                let mut w = slot.ready.pop_front()?;
                if w.ended() {
                    tracing::warn!(lang, pid = w.proc.pid, "a pooled interpreter ended unused");
                    discarded.push(w);
                } else if w.born.elapsed() > MAX_IDLE {
                    discarded.push(w);
                } else {
                    break Some(w);
                }
            }
        };
        // Killed outside the lock.
        drop(discarded);
        taken
    }

    /// How many interpreters of `lang` to start now to bring it back to full; they count as
    /// starting until [`started`](Self::started) is called once for each.
    pub fn reserve(&self, lang: &str) -> usize {
        let size = self.size;
        let mut st = self.lock();
        if !st.active || st.closed {
            return 0;
        }
        let slot = st.slots.entry(lang.to_string()).or_default();
        if slot.failures >= MAX_FAILURES {
            return 0;
        }
        let n = size.saturating_sub(slot.ready.len() + slot.starting);
        slot.starting += n;
        n
    }

    /// One reserved start has finished: its interpreter joins the pool (unless the pool was
    /// closed meanwhile, when it is dropped, which kills it).
    pub fn started(&self, lang: &str, warm: Result<Warm, String>) {
        let mut rejected = None;
        {
            let mut st = self.lock();
            let closed = st.closed;
            let slot = st.slots.entry(lang.to_string()).or_default();
            slot.starting = slot.starting.saturating_sub(1);
            match warm {
                Ok(w) if !closed => {
                    slot.failures = 0;
                    slot.ready.push_back(w);
                }
                Ok(w) => rejected = Some(w),
                Err(e) => {
                    slot.failures += 1;
                    tracing::warn!(lang, error = %e, failures = slot.failures, "cannot start a pooled interpreter");
                }
            }
        }
        drop(rejected);
    }

    /// Interpreters of `lang` ready now.
    pub fn ready(&self, lang: &str) -> usize {
        self.lock().slots.get(lang).map_or(0, |s| s.ready.len())
    }

    /// Stop refilling and kill every pooled interpreter.
    pub fn close(&self) {
        let drained: Vec<Warm> = {
            let mut st = self.lock();
            st.closed = true;
            st.active = false;
            st.slots
                .values_mut()
                .flat_map(|s| s.ready.drain(..))
                .collect()
        };
        drop(drained);
    }
}

/// The request a pooled interpreter reads on stdin: the decimal length of the payload and a
/// newline, then the payload, NUL-separated UTF-8 fields:
///
/// 1. the program's file name, as `run.command` names it (relative to the directory);
/// 2. the run's CPU limit in seconds (the interpreter was started with the largest a run
///    can have, and lowers it to this, soft and hard, as the helper would have set it);
/// 3. K, the number of the caller's arguments;
/// 4. M, the length of the cold command line, then its M words (`run.command` expanded,
///    the caller's arguments being its last K words);
/// 5. the run's whole environment, `NAME=VALUE` each, in the order a cold run's process
///    gets it (sorted by name).
///
/// What follows the payload on stdin is the program's own input; then stdin is closed.
pub fn request(
    file: &str,
    cpu_s: u64,
    nargs: usize,
    argv: &[String],
    env: &[(String, String)],
) -> Vec<u8> {
    let mut fields: Vec<String> = Vec::with_capacity(4 + argv.len() + env.len());
    fields.push(file.to_string());
    fields.push(cpu_s.to_string());
    fields.push(nargs.to_string());
    fields.push(argv.len().to_string());
    fields.extend(argv.iter().cloned());
    let mut env: Vec<&(String, String)> = env.iter().collect();
    env.sort_by(|a, b| a.0.cmp(&b.0));
    fields.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    let payload = fields.join("\0");
    let mut out = format!("{}\n", payload.len()).into_bytes();
    out.extend_from_slice(payload.as_bytes());
    out
}

/// Whether a caller's variable changes how an interpreter starts (so a pooled interpreter,
/// started without it, cannot honour it): the dynamic loader's and libc's, the locale, the
/// time zone, and the variables the run itself sets (HOME, TMPDIR, PATH, TERM), plus the
/// language's own list (`run.pool.cold_env`). A pattern ending in `*` matches a prefix.
pub fn starts_differently(name: &str, language_patterns: &[String]) -> bool {
    const ALWAYS: &[&str] = &[
        "LD_*",
        "MALLOC_*",
        "GLIBC_TUNABLES",
        "LANG",
        "LANGUAGE",
        "LC_*",
        "TZ",
        "HOME",
        "TMPDIR",
        "PATH",
        "TERM",
    ];
    let matches = |p: &str| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == p,
    };
    ALWAYS.iter().copied().any(matches) || language_patterns.iter().any(|p| matches(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_format() {
        let argv: Vec<String> = ["/py", "-u", "main.py", "a b", ""]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let env = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("HOME".to_string(), "/h=x".to_string()),
        ];
        let r = request("main.py", 31, 2, &argv, &env);
        let text = String::from_utf8(r).expect("utf-8");
        let (len, payload) = text.split_once('\n').expect("length line");
        assert_eq!(len.parse::<usize>().expect("number"), payload.len());
        let fields: Vec<&str> = payload.split('\0').collect();
        assert_eq!(
            fields,
            [
                "main.py",
                "31",
                "2",
                "5",
                "/py",
                "-u",
                "main.py",
                "a b",
                "",
                "HOME=/h=x",
                "PATH=/bin"
            ]
        );
    }

    #[test]
    fn cold_variables() {
        let py = vec!["PYTHON*".to_string()];
        for name in [
            "PYTHONPATH",
            "LD_PRELOAD",
            "LC_ALL",
            "LANG",
            "TZ",
            "HOME",
            "PATH",
        ] {
            assert!(starts_differently(name, &py), "{name}");
        }
        for name in ["GREETING", "PYTHO", "MY_PYTHONPATH", "LANGX", "DEBUG"] {
            assert!(!starts_differently(name, &py), "{name}");
        }
    }

    #[test]
    fn books() {
        let pool = Pool::new(2);
        assert_eq!(pool.reserve("python"), 0, "inactive until activated");
        pool.activate();
        assert_eq!(pool.reserve("python"), 2);
        assert_eq!(pool.reserve("python"), 0, "both are starting");
        pool.started("python", Err("no".into()));
        assert_eq!(pool.reserve("python"), 1);
        pool.close();
        assert_eq!(pool.reserve("python"), 0);
        assert!(pool.take("python").is_none());
    }
}
