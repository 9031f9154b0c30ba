//! The fair share of one principal: how many sessions and `run-code` calls it may hold at
//! once, together. Each holds a sandbox uid (when the server is root) and processes, so
//! without it one principal could take every uid and leave every other caller refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;

/// What a share is held for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// A session, open or starting.
    Session,
    /// A `run-code` call in progress.
    Run,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub sessions: usize,
    pub runs: usize,
}

impl Held {
    fn total(&self) -> usize {
        self.sessions + self.runs
    }

    fn of(&mut self, what: Use) -> &mut usize {
        match what {
            Use::Session => &mut self.sessions,
            Use::Run => &mut self.runs,
        }
    }
}

/// Every principal's shares, shared by sessions and runs.
#[derive(Debug)]
pub struct Shares {
    /// Most sessions and runs one principal holds at once; 0: no limit.
    cap: usize,
    held: Mutex<HashMap<Caller, Held>>,
}

/// One share held by a caller; given back when dropped.
#[derive(Debug)]
pub struct Share {
    shares: Arc<Shares>,
    caller: Caller,
    what: Use,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.shares.lock();
        if let Some(h) = held.get_mut(&self.caller) {
            let n = h.of(self.what);
            *n = n.saturating_sub(1);
            if h.total() == 0 {
                held.remove(&self.caller);
            }
        }
    }
}

impl Shares {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            held: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Caller, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What `caller` holds now.
    #[cfg(test)]
    pub fn held(&self, caller: &Caller) -> Held {
        self.lock().get(caller).copied().unwrap_or_default()
    }

    /// Take a share for `what`, or refuse when `caller` already holds its cap.
    pub fn take(self: &Arc<Self>, caller: &Caller, what: Use) -> Result<Share, ToolError> {
        let mut held = self.lock();
        // cap > 0 here, so a refused caller's entry is not left empty.
        let h = held.entry(caller.clone()).or_default();
        if self.cap > 0 && h.total() >= self.cap {
            return Err(ToolError::new(
                ErrorKind::Limit,
                refusal(self.cap, *h, what),
            ));
        }
        *h.of(what) += 1;
        Ok(Share {
            shares: self.clone(),
            caller: caller.clone(),
            what,
        })
    }
}

fn refusal(cap: usize, h: Held, what: Use) -> String {
    let asked = match what {
        Use::Session => "start a session",
        Use::Run => "run code",
    };
    format!(
        "cannot {asked}: per-client limit reached. You already hold {} of the {cap} sessions and \
run-code calls one client may have at once ({} session(s) open or starting, {} run-code call(s) \
running; --max-active-per-principal). Close a session you no longer need with session_close \
(session_list shows them), or wait for your run-code calls to finish, then try again.",
        h.total(),
        h.sessions,
        h.runs
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(name: &str) -> Caller {
        Caller {
            principal: name.into(),
        }
    }

    #[test]
    fn a_principal_is_capped_and_others_are_not() {
        let shares = Shares::new(3);
        let a = who("a");
        let s1 = shares.take(&a, Use::Session).unwrap();
        let _r1 = shares.take(&a, Use::Run).unwrap();
        let _r2 = shares.take(&a, Use::Run).unwrap();
        let e = shares.take(&a, Use::Run).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Limit);
        assert!(e.message.contains("3 of the 3"), "{}", e.message);
        assert!(e.message.contains("1 session(s)"), "{}", e.message);
        assert!(e.message.contains("2 run-code call(s)"), "{}", e.message);
        assert!(
            e.message.contains("--max-active-per-principal"),
            "{}",
            e.message
        );
        // Another principal has its own share.
        let b = who("b");
        let _b: Vec<Share> = (0..3)
            .map(|_| shares.take(&b, Use::Session).unwrap())
            .collect();
        // A share given back can be taken again.
        drop(s1);
        assert_eq!(
            shares.held(&a),
            Held {
                sessions: 0,
                runs: 2
            }
        );
        shares.take(&a, Use::Session).unwrap();
    }

    #[test]
    fn zero_is_no_limit_and_the_books_empty() {
        let shares = Shares::new(0);
        let a = who("a");
        let all: Vec<Share> = (0..100)
            .map(|_| shares.take(&a, Use::Run).unwrap())
            .collect();
        drop(all);
        assert!(shares.lock().is_empty());
    }
}
