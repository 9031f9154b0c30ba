use super::*;

fn limits() -> Limits {
    Limits {
        per_principal: 2,
        total: 3,
        streams_per_principal: 3,
        idle: Duration::from_secs(100),
        unused: Duration::from_secs(10),
    }
}

fn who(name: &str) -> Caller {
    Caller {
        principal: name.into(),
    }
}

/// A session of `owner` last used `ago` before `now`.
fn put(s: &McpSessions, id: &str, owner: &str, now: Instant, ago: u64) -> SessionId {
    let id: SessionId = Arc::from(id);
    lock(&s.table).entries.insert(
        id.clone(),
        Entry {
            owner: who(owner),
            busy: 0,
            streams: 0,
            used: false,
            last: now - Duration::from_secs(ago),
        },
    );
    id
}

#[test]
fn at_the_principals_cap_its_least_recently_used_idle_session_gives_way() {
    let s = McpSessions::new(limits());
    let now = Instant::now() + Duration::from_secs(1000);
    let a = who("a");
    assert_eq!(lock(&s.table).admit(&a, &s.limits), Ok(None));
    put(&s, "a1", "a", now, 5);
    let a2 = put(&s, "a2", "a", now, 9);
    assert_eq!(lock(&s.table).admit(&a, &s.limits), Ok(Some(a2.clone())));
    // Busy sessions never give way.
    let _busy = s.enter("a2", &a, Use::Call).ok().expect("a2");
    let a1: SessionId = Arc::from("a1");
    assert_eq!(lock(&s.table).admit(&a, &s.limits), Ok(Some(a1)));
    let _busy1 = s.enter("a1", &a, Use::Call).ok().expect("a1");
    assert_eq!(
        lock(&s.table).admit(&a, &s.limits),
        Err(Refusal::PrincipalSessions(2))
    );
    assert_eq!(s.would_refuse(&a), Some(Refusal::PrincipalSessions(2)));
    // Another principal is not at its cap.
    assert_eq!(lock(&s.table).admit(&who("b"), &s.limits), Ok(None));
}

#[test]
fn at_the_servers_cap_any_idle_session_gives_way_and_busy_ones_refuse() {
    let s = McpSessions::new(limits());
    let now = Instant::now() + Duration::from_secs(1000);
    put(&s, "a1", "a", now, 5);
    put(&s, "b1", "b", now, 50);
    put(&s, "b2", "b", now, 1);
    let c = who("c");
    let b1: SessionId = Arc::from("b1");
    assert_eq!(lock(&s.table).admit(&c, &s.limits), Ok(Some(b1)));
    let guards = [
        s.enter("a1", &who("a"), Use::Call).ok().expect("a1"),
        s.enter("b1", &who("b"), Use::Call).ok().expect("b1"),
        s.enter("b2", &who("b"), Use::Call).ok().expect("b2"),
    ];
    assert_eq!(
        lock(&s.table).admit(&c, &s.limits),
        Err(Refusal::ServerSessions(3))
    );
    // Sessions being created count too.
    drop(guards);
    lock(&s.table).entries.clear();
    lock(&s.table).pending.insert(c.clone(), 2);
    lock(&s.table).pending_total = 2;
    assert_eq!(
        lock(&s.table).admit(&c, &s.limits),
        Err(Refusal::PrincipalSessions(2))
    );
}

#[test]
fn a_session_is_found_only_by_its_owner_and_streams_are_capped() {
    let s = McpSessions::new(limits());
    let now = Instant::now();
    put(&s, "a1", "a", now, 0);
    put(&s, "a2", "a", now, 0);
    let a = who("a");
    assert!(matches!(
        s.enter("a1", &who("b"), Use::Call),
        Err(Denied::Unknown)
    ));
    assert!(matches!(
        s.enter("nope", &a, Use::Call),
        Err(Denied::Unknown)
    ));
    let one = s.enter("a1", &a, Use::Stream).ok().expect("first stream");
    let two = s.enter("a1", &a, Use::Stream).ok().expect("second stream");
    assert!(matches!(
        s.enter("a1", &a, Use::Stream),
        Err(Denied::Refused(Refusal::SessionStreams(2)))
    ));
    // A call still goes through a session with its streams open.
    assert!(s.enter("a1", &a, Use::Call).is_ok());
    let three = s.enter("a2", &a, Use::Stream).ok().expect("third stream");
    assert!(matches!(
        s.enter("a2", &a, Use::Stream),
        Err(Denied::Refused(Refusal::PrincipalStreams(3)))
    ));
    drop(one);
    assert!(s.enter("a2", &a, Use::Stream).is_ok());
    drop((two, three));
    let t = lock(&s.table);
    assert!(t.entries.values().all(|e| e.busy == 0 && e.streams == 0));
    assert!(t.entries.values().all(|e| e.used));
}

#[test]
fn unused_sessions_expire_first_and_busy_ones_never() {
    let s = McpSessions::new(limits());
    let now = Instant::now() + Duration::from_secs(1000);
    let unused = put(&s, "unused", "a", now, 11);
    put(&s, "fresh", "a", now, 9);
    put(&s, "used", "a", now, 50);
    if let Some(e) = lock(&s.table).entries.get_mut("used") {
        e.used = true;
    }
    let busy = put(&s, "busy", "a", now, 500);
    let _g = s.enter("busy", &who("a"), Use::Call).ok().expect("busy");
    assert_eq!(s.expired(now), vec![unused]);
    assert_eq!(s.count(), 3);
    // An hour later: everything idle is gone, the busy one stays.
    let later = now + Duration::from_secs(3600);
    let mut gone = s.expired(later);
    gone.sort();
    assert_eq!(gone.len(), 2);
    assert_eq!(s.count(), 1);
    assert!(lock(&s.table).entries.contains_key(&busy));
}

#[test]
fn a_reservation_dropped_before_its_session_exists_counts_no_more() {
    let s = McpSessions::new(limits());
    let a = who("a");
    {
        let mut t = lock(&s.table);
        *t.pending.entry(a.clone()).or_default() += 1;
        t.pending_total += 1;
    }
    let r = Reservation {
        table: &s.table,
        caller: a.clone(),
        done: false,
    };
    assert_eq!(lock(&s.table).held_by(&a), 1);
    drop(r);
    assert_eq!(lock(&s.table).held_by(&a), 0);
    assert_eq!(lock(&s.table).total(), 0);
}
