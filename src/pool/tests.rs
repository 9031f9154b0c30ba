//! The pool's books, with a fake interpreter: nothing is spawned.

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
    pool.started::<String>("python", Err("no".into()));
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
    assert_eq!(pool.reserve("python"), START);
    let t0 = Instant::now();
    let mut ended = fake(1, t0, &dropped);
    ended.ended = true;
    pool.started::<String>("python", Ok(Some(ended)));
    pool.started::<String>("python", Ok(Some(fake(2, t0, &dropped))));
    pool.started::<String>("python", Ok(Some(fake(3, t0 + MAX_IDLE, &dropped))));
    pool.started::<String>("python", Ok(Some(fake(4, t0 + MAX_IDLE, &dropped))));
    assert!(
        pool.take_at("ruby", t0, true).is_none(),
        "pools are per language"
    );
    // 1 has ended: killed on the way; 2, idle for exactly MAX_IDLE, is still good.
    let w = pool
        .take_at("python", t0 + MAX_IDLE, true)
        .expect("one is ready");
    assert_eq!(w.n, 2);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    drop(w);
    // A second past their MAX_IDLE, 3 and 4 are killed rather than used.
    let later = t0 + MAX_IDLE * 2 + Duration::from_secs(1);
    assert!(pool.take_at("python", later, true).is_none());
    assert_eq!(dropped.load(Ordering::SeqCst), 4, "all killed");
    assert_eq!(pool.reserve("python"), 4, "emptied: it grew to the cap");
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
    pool.started::<String>("python", Ok(Some(ended)));
    pool.started::<String>(
        "python",
        Ok(Some(fake(3, t0 + Duration::from_secs(2), &dropped))),
    );
    pool.started::<String>(
        "ruby",
        Ok(Some(fake(2, t0 + Duration::from_secs(1), &dropped))),
    );
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
    pool.started::<String>("python", Ok(Some(fake(1, t0, &dropped))));
    pool.close();
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    pool.started::<String>("python", Ok(Some(fake(2, t0, &dropped))));
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
        pool.started::<String>("python", Err("no interpreter".into()));
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
            async move { Ok::<_, String>(Some(fake(n, Instant::now(), &dropped))) }
        });
    };
    refill(&pool);
    assert_eq!(starts.load(Ordering::SeqCst), START);
    // The starts join the pool from their tasks: let them run.
    for _ in 0..100 {
        if pool.ready_of("python") == START {
            break;
        }
        tokio::task::yield_now().await;
    }
    let first = pool.take_or_wait("python", Duration::from_secs(5)).await;
    assert_eq!(first.map(|w| w.n), Some(0), "the oldest");
    refill(&pool);
    assert_eq!(
        starts.load(Ordering::SeqCst),
        START + 1,
        "the one taken is replaced"
    );
    let late = pool.take_or_wait("ruby", Duration::from_secs(5)).await;
    assert!(late.is_none(), "nothing starting: no wait");
}

#[test]
fn sizes_follow_demand_within_the_cap() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let pool: Pool<Fake> = Pool::new(5);
    pool.activate();
    let t0 = Instant::now();
    let fill = |n: usize| {
        for i in 0..n {
            pool.started::<String>("python", Ok(Some(fake(i as u32, t0, &dropped))));
        }
    };
    assert_eq!(pool.reserve("python"), 2);
    fill(2);
    assert!(pool.take_at("python", t0, true).is_some());
    assert_eq!(
        pool.reserve("python"),
        1,
        "one left: no growth, the one taken replaced"
    );
    pool.started::<String>("python", Err("not this time".into()));
    // Back-to-back runs empty it: it doubles each time, up to the cap.
    assert!(pool.take_at("python", t0, true).is_some());
    assert_eq!(pool.reserve("python"), 4, "emptied: 2 -> 4");
    assert!(pool.take_at("python", t0, true).is_none());
    assert_eq!(pool.reserve("python"), 1, "found empty: 4 -> 5 (the cap)");
    fill(5);
    // Idle: it halves every SHRINK_AFTER, the oldest going, down to the floor.
    pool.trim_at(t0 + SHRINK_AFTER);
    assert_eq!(pool.ready_of("python"), 2);
    pool.trim_at(t0 + SHRINK_AFTER + SHRINK_AFTER / 2);
    assert_eq!(pool.ready_of("python"), 2, "not idle long enough again");
    pool.trim_at(t0 + SHRINK_AFTER * 2);
    assert_eq!(pool.ready_of("python"), FLOOR);
    pool.trim_at(t0 + SHRINK_AFTER * 4);
    assert_eq!(pool.ready_of("python"), FLOOR, "never below the floor");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        2 + 4,
        "the two runs, then 3 and 1"
    );
}

#[test]
fn trimming_replaces_the_expired() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let pool: Pool<Fake> = Pool::new(2);
    pool.activate();
    let t0 = Instant::now();
    assert_eq!(pool.reserve("python"), 2);
    pool.started::<String>("python", Ok(Some(fake(1, t0, &dropped))));
    pool.started::<String>(
        "python",
        Ok(Some(fake(2, t0 + Duration::from_secs(1), &dropped))),
    );
    let refill = pool.trim_at(t0 + MAX_IDLE + Duration::from_secs(2));
    assert_eq!(refill, ["python"]);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        2,
        "idle: shrunk to 1, and 1 expired"
    );
    assert_eq!(pool.ready_of("python"), 0);
    assert_eq!(pool.reserve("python"), FLOOR);
}

#[test]
fn the_pool_gives_up_interpreters_and_holds_off_when_uids_run_short() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let pool: Pool<Fake> = Pool::new(2);
    pool.activate();
    let t0 = Instant::now();
    assert_eq!(pool.reserve("ruby"), 2);
    assert_eq!(pool.reserve("python"), 2);
    pool.started::<String>(
        "ruby",
        Ok(Some(fake(1, t0 + Duration::from_secs(1), &dropped))),
    );
    pool.started::<String>("python", Ok(Some(fake(2, t0, &dropped))));
    pool.started::<String>("python", Ok(None));
    pool.hold(true);
    assert_eq!(pool.reserve("python"), 0, "held");
    assert_eq!(
        pool.take_any().map(|w| w.n),
        Some(2),
        "the oldest of any language"
    );
    assert_eq!(pool.take_any().map(|w| w.n), Some(1));
    assert!(pool.take_any().is_none());
    pool.hold(false);
    // `Ok(None)` (not started, uids short) is no failure.
    assert_eq!(pool.reserve("python"), 2);
    assert_eq!(pool.reserve("ruby"), 1);
}

#[test]
fn a_language_starts_at_its_own_size_and_grows_when_asked_for() {
    let pool: Pool<Fake> = Pool::with_start(4, |lang| usize::from(lang == "python"));
    pool.activate();
    assert_eq!(pool.reserve("python"), 1);
    assert_eq!(pool.reserve("ruby"), 0, "none until asked for");
    assert!(pool.take("ruby").is_none());
    assert_eq!(pool.reserve("ruby"), 1, "asked for once: one");
}
