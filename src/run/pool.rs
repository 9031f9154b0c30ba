//! The warm pool's books: per language, a few interpreters started ahead of time, each used
//! for one run and then gone, and replaced in the background after that run.
//!
//! The pool is generic over what a ready interpreter is ([`Ready`]) and over how one is
//! started (the future given to [`Pool::refill`]), so its bookkeeping is tested without
//! spawning anything. What `run-code` keeps in it, and how it starts and uses one, is in
//! `run::warm`.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Refilling stops after this many consecutive failed starts of a language's interpreter.
const MAX_FAILURES: u32 = 3;

struct Slot<W> {
    ready: VecDeque<W>,
    /// Interpreters being started for this language.
    starting: usize,
    /// Consecutive failures to start one: refilling stops after a few, until a start works.
    failures: u32,
}

impl<W> Default for Slot<W> {
    fn default() -> Self {
        Self {
            ready: VecDeque::new(),
            starting: 0,
            failures: 0,
        }
    }
}

struct State<W> {
    slots: HashMap<String, Slot<W>>,
    /// Filling has begun (`serve` fills; a one-shot `replbox run` never does).
    active: bool,
    closed: bool,
}

/// The pools of every language, each holding up to `size` interpreters.
pub struct Pool<W> {
    size: usize,
    state: Mutex<State<W>>,
}

impl<W: Ready> Pool<W> {
    pub fn new(size: usize) -> Self {
        Self {
            size,
            state: Mutex::new(State {
                slots: HashMap::new(),
                active: false,
                closed: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<W>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn enabled(&self) -> bool {
        self.size > 0
    }

    /// Let refills happen from now on (until [`close`](Self::close)).
    pub fn activate(&self) {
        let mut st = self.lock();
        if !st.closed {
            st.active = true;
        }
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
    /// long are dropped on the way.
    pub fn take(&self, lang: &str) -> Option<W> {
        self.take_at(lang, Instant::now())
    }

    /// [`take`](Self::take) as of `now`.
    fn take_at(&self, lang: &str, now: Instant) -> Option<W> {
        let mut discarded = Vec::new();
        let taken = {
            let mut st = self.lock();
            let slot = st.slots.get_mut(lang)?;
            loop {
                let mut w = slot.ready.pop_front()?;
                if w.ended() {
                    tracing::warn!(lang, pid = w.pid(), "a pooled interpreter ended unused");
                    discarded.push(w);
                } else if now.saturating_duration_since(w.born()) > MAX_IDLE {
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
    /// background; each joins the pool when its start has finished.
    pub fn refill<F, Fut>(self: &Arc<Self>, lang: &str, start: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<W, String>> + Send + 'static,
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

    /// How many interpreters of `lang` to start now to bring it back to full; they count as
    /// starting until [`started`](Self::started) is called once for each.
    fn reserve(&self, lang: &str) -> usize {
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
    fn started(&self, lang: &str, warm: Result<W, String>) {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A ready interpreter that is only books: a number, whether it ended, when it was
    /// born, and a count of the ones dropped (killed).
    struct Fake {
        n: u32,
        ended: bool,
        born: Instant,
        dropped: Arc<AtomicUsize>,
    }

    impl Ready for Fake {
        fn ended(&mut self) -> bool {
            self.ended
        }
        fn born(&self) -> Instant {
            self.born
        }
        fn pid(&self) -> u32 {
            self.n
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn fake(n: u32, born: Instant, dropped: &Arc<AtomicUsize>) -> Fake {
        Fake {
            n,
            ended: false,
            born,
            dropped: dropped.clone(),
        }
    }

    #[test]
    fn books() {
        let pool: Pool<Fake> = Pool::new(2);
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

    #[test]
    fn takes_the_oldest_and_drops_the_ended_and_the_expired() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let pool = Pool::new(4);
        pool.activate();
        assert_eq!(pool.reserve("python"), 4);
        let t0 = Instant::now();
        let mut ended = fake(1, t0, &dropped);
        ended.ended = true;
        pool.started("python", Ok(ended));
        pool.started("python", Ok(fake(2, t0, &dropped)));
        pool.started("python", Ok(fake(3, t0 + MAX_IDLE, &dropped)));
        pool.started("python", Ok(fake(4, t0 + MAX_IDLE, &dropped)));
        assert!(pool.take_at("ruby", t0).is_none(), "pools are per language");
        // 1 has ended: killed on the way; 2, idle for exactly MAX_IDLE, is still good.
        let w = pool.take_at("python", t0 + MAX_IDLE).expect("one is ready");
        assert_eq!(w.n, 2);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        drop(w);
        // A second past their MAX_IDLE, 3 and 4 are killed rather than used.
        let later = t0 + MAX_IDLE * 2 + Duration::from_secs(1);
        assert!(pool.take_at("python", later).is_none());
        assert_eq!(dropped.load(Ordering::SeqCst), 4, "all killed");
        assert_eq!(pool.reserve("python"), 4, "and all to replace");
    }

    #[test]
    fn take_any_takes_the_oldest_of_any_language() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let pool = Pool::new(2);
        pool.activate();
        assert!(pool.take_any().is_none());
        let t0 = Instant::now();
        assert_eq!(pool.reserve("python"), 2);
        assert_eq!(pool.reserve("ruby"), 2);
        let mut ended = fake(1, t0, &dropped);
        ended.ended = true;
        pool.started("python", Ok(ended));
        pool.started("python", Ok(fake(3, t0 + Duration::from_secs(2), &dropped)));
        pool.started("ruby", Ok(fake(2, t0 + Duration::from_secs(1), &dropped)));
        assert_eq!(pool.take_any().map(|w| w.n), Some(2), "the oldest alive");
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            2,
            "1 ended, dropped; 2 taken"
        );
        assert_eq!(pool.take_any().map(|w| w.n), Some(3));
        assert!(pool.take_any().is_none());
    }

    #[test]
    fn a_closed_pool_kills_what_it_had_and_what_arrives() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let pool = Pool::new(2);
        pool.activate();
        assert_eq!(pool.reserve("python"), 2);
        let t0 = Instant::now();
        pool.started("python", Ok(fake(1, t0, &dropped)));
        pool.close();
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        pool.started("python", Ok(fake(2, t0, &dropped)));
        assert_eq!(dropped.load(Ordering::SeqCst), 2, "a late start is killed");
        pool.activate();
        assert_eq!(pool.reserve("python"), 0, "closed for good");
    }

    #[test]
    fn refilling_stops_after_repeated_failures_until_a_start_works() {
        let pool: Pool<Fake> = Pool::new(1);
        pool.activate();
        for _ in 0..MAX_FAILURES {
            assert_eq!(pool.reserve("python"), 1);
            pool.started("python", Err("no interpreter".into()));
        }
        assert_eq!(pool.reserve("python"), 0, "given up");
        assert_eq!(pool.reserve("ruby"), 1, "other languages are not affected");
    }

    #[tokio::test]
    async fn refill_starts_what_is_missing() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let starts = Arc::new(AtomicUsize::new(0));
        let pool = Arc::new(Pool::new(3));
        pool.activate();
        let refill = |pool: &Arc<Pool<Fake>>| {
            pool.refill("python", || {
                let n = starts.fetch_add(1, Ordering::SeqCst) as u32;
                let dropped = dropped.clone();
                async move { Ok(fake(n, Instant::now(), &dropped)) }
            });
        };
        let ready = |pool: &Pool<Fake>| pool.lock().slots["python"].ready.len();
        refill(&pool);
        assert_eq!(starts.load(Ordering::SeqCst), 3);
        // The starts join the pool from their tasks: let them run.
        for _ in 0..100 {
            if ready(&pool) == 3 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(ready(&pool), 3);
        refill(&pool);
        assert_eq!(starts.load(Ordering::SeqCst), 3, "full: nothing started");
        assert_eq!(pool.take("python").map(|w| w.n), Some(0), "the oldest");
        refill(&pool);
        assert_eq!(
            starts.load(Ordering::SeqCst),
            4,
            "the one taken is replaced"
        );
    }
}
