//! The warm pools' books: per language, interpreters started ahead of time, each used once
//! (for one run, or as one session) and then gone, and replaced in the background.
//!
//! Sizes follow demand: each language's pool starts at [`START`] interpreters (or its own
//! start size, see [`Pool::with_start`]; at most the cap, `--pool`), doubles (up to the cap) whenever a run finds it empty or empties it, and
//! halves (down to [`FLOOR`]) for every [`SHRINK_AFTER`] without a run. A run that finds it
//! empty while interpreters are starting waits for one of them rather than starting its own.
//!
//! The pool is generic over what a ready interpreter is ([`Ready`]) and over how one is
//! started (the future given to [`Pool::refill`]), so its bookkeeping is tested without
//! spawning anything. What `run-code` keeps in it, and how it starts and uses one, is in
//! `run::warm`; the warm sessions of `session_start` are `session::launch::warm`'s.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// An interpreter waiting for its program. Dropping it kills it.
pub trait Ready: Send + 'static {
    /// Whether it has ended (it cannot run anything any more).
    fn ended(&mut self) -> bool;
    /// When it was started.
    fn born(&self) -> Instant;
    /// Its process id, for logs.
    fn pid(&self) -> u32;
}

/// An interpreter idle for longer than this is replaced rather than used, so that a run never
/// sees a machine older than a few minutes (files installed meanwhile, a changed time zone).
pub const MAX_IDLE: Duration = Duration::from_secs(300);

/// A language's pool size as the server starts (at most the cap).
pub const START: usize = 2;
/// The smallest a language's pool shrinks to when idle (when the cap is not 0).
pub const FLOOR: usize = 1;
/// A pool without a run for this long halves (down to [`FLOOR`]), and again after as long.
pub const SHRINK_AFTER: Duration = Duration::from_secs(60);

/// Refilling stops after this many consecutive failed starts of a language's interpreter.
const MAX_FAILURES: u32 = 3;

struct Slot<W> {
    ready: VecDeque<W>,
    /// Interpreters being started for this language.
    starting: usize,
    /// Consecutive failures to start one: refilling stops after a few, until a start works.
    failures: u32,
    /// How many it should hold now: between the floor and the cap, following demand.
    target: usize,
    /// The last run that took one, or the last time it shrank (idleness counts from it).
    last_busy: Instant,
}

impl<W> Slot<W> {
    fn new(target: usize, now: Instant) -> Self {
        Self {
            ready: VecDeque::new(),
            starting: 0,
            failures: 0,
            target,
            last_busy: now,
        }
    }
}

struct State<W> {
    slots: HashMap<String, Slot<W>>,
    /// Filling has begun (`serve` fills; a one-shot `replbox run` never does).
    active: bool,
    closed: bool,
    /// Refills stop while this is set: user ids run short (see [`Pool::hold`]).
    held: bool,
}

/// The pools of every language, each holding up to `cap` interpreters.
pub struct Pool<W> {
    cap: usize,
    /// Each language's size before any demand (at most `cap`).
    start: fn(&str) -> usize,
    state: Mutex<State<W>>,
    /// Signalled whenever a start finishes (for runs waiting on one).
    arrived: Notify,
}

impl<W: Ready> Pool<W> {
    pub fn new(cap: usize) -> Self {
        Self::with_start(cap, |_| START)
    }

    /// Pools whose size before any demand is `start(language)` (0: none until one is
    /// asked for).
    pub fn with_start(cap: usize, start: fn(&str) -> usize) -> Self {
        Self {
            cap,
            start,
            state: Mutex::new(State {
                slots: HashMap::new(),
                active: false,
                closed: false,
                held: false,
            }),
            arrived: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<W>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    fn slot<'a>(&self, st: &'a mut State<W>, lang: &str, now: Instant) -> &'a mut Slot<W> {
        let start = (self.start)(lang).min(self.cap);
        st.slots
            .entry(lang.to_string())
            .or_insert_with(|| Slot::new(start, now))
    }

    /// Let refills happen from now on (until [`close`](Self::close)).
    pub fn activate(&self) {
        let mut st = self.lock();
        if !st.closed {
            st.active = true;
        }
    }

    /// Stop (`true`) or resume (`false`) refilling: the runner holds the pools while user
    /// ids run short, so that interpreters waiting for a run never keep callers from one.
    pub fn hold(&self, held: bool) {
        self.lock().held = held;
    }

    /// How many interpreters are ready, per language (for metrics).
    pub fn ready(&self) -> Vec<(String, usize)> {
        let st = self.lock();
        let mut v: Vec<(String, usize)> = st
            .slots
            .iter()
            .map(|(lang, slot)| (lang.clone(), slot.ready.len()))
            .collect();
        v.sort();
        v
    }

    /// Take a ready interpreter of `lang`, the oldest first; ones that ended or idled too
    /// long are dropped on the way. This is demand: an empty pool, or one this empties,
    /// grows.
    pub fn take(&self, lang: &str) -> Option<W> {
        self.take_at(lang, Instant::now(), true)
    }

    /// [`take`](Self::take) as of `now`; `demand` counts the take towards the pool's size.
    fn take_at(&self, lang: &str, now: Instant, demand: bool) -> Option<W> {
        let mut discarded = Vec::new();
        let taken = {
            let cap = self.cap;
            let mut st = self.lock();
            let slot = self.slot(&mut st, lang, now);
            let taken = loop {
                let Some(mut w) = slot.ready.pop_front() else {
                    break None;
                };
                if w.ended() {
                    tracing::warn!(lang, pid = w.pid(), "a pooled interpreter ended unused");
                    discarded.push(w);
                } else if now.saturating_duration_since(w.born()) > MAX_IDLE {
                    discarded.push(w);
                } else {
                    break Some(w);
                }
            };
            if demand {
                slot.last_busy = now;
                if slot.ready.is_empty() {
                    slot.target = (slot.target * 2).max(1).min(cap);
                }
            }
            taken
        };
        // Killed outside the lock.
        drop(discarded);
        taken
    }

    /// [`take`](Self::take), or when the pool is empty but interpreters of `lang` are
    /// starting, the first of them to be ready (waiting at most `patience`): it is further
    /// along than a cold start begun now would be.
    pub async fn take_or_wait(&self, lang: &str, patience: Duration) -> Option<W> {
        if let Some(w) = self.take(lang) {
            return Some(w);
        }
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if let Some(w) = self.take_at(lang, Instant::now(), false) {
                return Some(w);
            }
            if self.starting(lang) == 0 {
                return None;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return None;
            }
        }
    }

    fn starting(&self, lang: &str) -> usize {
        self.lock().slots.get(lang).map_or(0, |s| s.starting)
    }

    /// Take the oldest ready interpreter of any language (to stop it: its uid is needed);
    /// ones that ended are dropped on the way. Not refilled here: the next run refills.
    pub fn take_any(&self) -> Option<W> {
        let mut discarded = Vec::new();
        let taken = {
            let mut st = self.lock();
            let mut oldest: Option<(&String, Instant)> = None;
            for (lang, slot) in st.slots.iter_mut() {
                while let Some(w) = slot.ready.front_mut() {
                    if !w.ended() {
                        break;
                    }
                    discarded.extend(slot.ready.pop_front());
                }
                if let Some(w) = slot.ready.front()
                    && oldest.is_none_or(|(_, born)| w.born() < born)
                {
                    oldest = Some((lang, w.born()));
                }
            }
            let lang = oldest.map(|(l, _)| l.clone());
            lang.and_then(|l| st.slots.get_mut(&l)?.ready.pop_front())
        };
        drop(discarded);
        taken
    }

    /// Start as many interpreters of `lang` as it lacks, each with `start`, in the
    /// background; each joins the pool when its start has finished (a failed start is
    /// logged with its error).
    pub fn refill<F, Fut, E>(self: &Arc<Self>, lang: &str, start: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Option<W>, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        for _ in 0..self.reserve(lang) {
            let pool = self.clone();
            let lang = lang.to_string();
            let starting = start();
            tokio::spawn(async move {
                let warm = starting.await;
                pool.started(&lang, warm);
            });
        }
    }

    /// How many interpreters of `lang` to start now to bring it back to its size; they count
    /// as starting until [`started`](Self::started) is called once for each.
    fn reserve(&self, lang: &str) -> usize {
        let mut st = self.lock();
        if !st.active || st.closed || st.held || self.cap == 0 {
            return 0;
        }
        let slot = self.slot(&mut st, lang, Instant::now());
        if slot.failures >= MAX_FAILURES {
            return 0;
        }
        let n = slot.target.saturating_sub(slot.ready.len() + slot.starting);
        slot.starting += n;
        n
    }

    /// One reserved start has finished: its interpreter joins the pool (unless the pool was
    /// closed meanwhile, when it is dropped, which kills it). `Ok(None)`: it was not started,
    /// for a reason that is no failure (user ids ran short).
    fn started<E: std::fmt::Display>(&self, lang: &str, warm: Result<Option<W>, E>) {
        let mut rejected = None;
        {
            let mut st = self.lock();
            let closed = st.closed;
            let slot = self.slot(&mut st, lang, Instant::now());
            slot.starting = slot.starting.saturating_sub(1);
            match warm {
                Ok(Some(w)) if !closed => {
                    slot.failures = 0;
                    slot.ready.push_back(w);
                }
                Ok(w) => rejected = w,
                Err(e) => {
                    slot.failures += 1;
                    tracing::warn!(lang, error = %e, failures = slot.failures, "cannot start a pooled interpreter");
                }
            }
        }
        drop(rejected);
        self.arrived.notify_waiters();
    }

    /// The periodic upkeep: pools idle for [`SHRINK_AFTER`] halve (the oldest interpreters
    /// go), and interpreters idle past [`MAX_IDLE`] are dropped. Returns the languages to
    /// refill (those that dropped expired ones).
    pub fn trim(&self) -> Vec<String> {
        self.trim_at(Instant::now())
    }

    fn trim_at(&self, now: Instant) -> Vec<String> {
        let mut dropped = Vec::new();
        let mut refill = Vec::new();
        {
            let floor = FLOOR.min(self.cap);
            let mut st = self.lock();
            for (lang, slot) in st.slots.iter_mut() {
                if now.saturating_duration_since(slot.last_busy) >= SHRINK_AFTER
                    && slot.target > floor
                {
                    slot.target = (slot.target / 2).max(floor);
                    slot.last_busy = now;
                }
                while slot.ready.len() > slot.target {
                    dropped.extend(slot.ready.pop_front());
                }
                let expired = slot
                    .ready
                    .iter()
                    .take_while(|w| now.saturating_duration_since(w.born()) > MAX_IDLE)
                    .count();
                dropped.extend(slot.ready.drain(..expired));
                if expired > 0 {
                    refill.push(lang.clone());
                }
            }
        }
        drop(dropped);
        refill
    }

    /// Interpreters of `lang` ready now.
    pub fn ready_of(&self, lang: &str) -> usize {
        self.lock().slots.get(lang).map_or(0, |s| s.ready.len())
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Stop refilling and kill every pooled interpreter.
    pub fn close(&self) {
        let drained: Vec<W> = {
            let mut st = self.lock();
            st.closed = true;
            st.active = false;
            st.slots
                .values_mut()
                .flat_map(|s| s.ready.drain(..))
                .collect()
        };
        drop(drained);
        self.arrived.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
