//! A bounded memory of recent entries, keyed by id: past its cap the oldest is forgotten
//! first. Plain data, no lock of its own: its owner keeps it under one lock, so no guard on
//! it is alive while it changes.

use std::collections::{HashMap, VecDeque};

pub(super) struct Recent<V> {
    cap: usize,
    /// The entries, each with the number it was inserted as.
    entries: HashMap<String, (u64, V)>,
    /// Ids in insertion order (oldest first), with their numbers: an id removed or inserted
    /// again since leaves a stale pair here, skipped when it comes up.
    order: VecDeque<(u64, String)>,
    next: u64,
}

impl<V> Recent<V> {
    /// At most `cap` entries (0: none are kept).
    pub(super) fn new(cap: usize) -> Self {
        Self {
            cap,
            entries: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
        }
    }

    pub(super) fn get(&self, id: &str) -> Option<&V> {
        self.entries.get(id).map(|(_, v)| v)
    }

    /// Insert (or replace, as the newest) `id`; past the cap the oldest entries go.
    pub(super) fn insert(&mut self, id: String, value: V) {
        if self.cap == 0 {
            return;
        }
        let n = self.next;
        self.next += 1;
        self.order.push_back((n, id.clone()));
        self.entries.insert(id, (n, value));
        while self.entries.len() > self.cap {
            let Some((n, old)) = self.order.pop_front() else {
                break;
            };
            if self.entries.get(&old).is_some_and(|(m, _)| *m == n) {
                self.entries.remove(&old);
            }
        }
        // Stale pairs never outnumber the live ones by much.
        if self.order.len() > self.cap.max(self.entries.len()).saturating_mul(2) {
            let entries = &self.entries;
            self.order
                .retain(|(n, id)| entries.get(id).is_some_and(|(m, _)| m == n));
        }
    }

    pub(super) fn remove(&mut self, id: &str) -> Option<V> {
        self.entries.remove(id).map(|(_, v)| v)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_goes_first_and_the_order_stays_bounded() {
        let mut r = Recent::new(3);
        for i in 0..10 {
            r.insert(format!("s{i}"), i);
        }
        assert_eq!(r.len(), 3);
        assert!(r.get("s6").is_none());
        assert_eq!(r.get("s7"), Some(&7));
        assert_eq!(r.get("s9"), Some(&9));
        // Inserted again: the newest now, so s8 is the oldest.
        r.insert("s7".into(), 70);
        r.insert("s10".into(), 10);
        assert!(r.get("s8").is_none());
        assert_eq!(r.get("s7"), Some(&70));
        // A removed id does not count, and its stale place is skipped.
        assert_eq!(r.remove("s9"), Some(9));
        r.insert("s11".into(), 11);
        assert_eq!(r.len(), 3);
        assert!(r.get("s7").is_some() && r.get("s10").is_some() && r.get("s11").is_some());
        for i in 0..1000 {
            r.insert("same".into(), i);
            r.remove("same");
        }
        assert!(r.order.len() <= 2 * 3 + 1, "{}", r.order.len());
    }

    #[test]
    fn a_cap_of_zero_keeps_nothing() {
        let mut r = Recent::new(0);
        r.insert("a".into(), 1);
        assert!(r.get("a").is_none());
    }
}
