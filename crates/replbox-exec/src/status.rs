//! The status record: one line the helper writes on its status descriptor before it exits,
//! `exit N clean|left` or `signal N clean|left`. bwrap turns a death by signal into an exit
//! code, and a pid namespace's first process cannot re-raise a signal, so the server reads
//! the program's exact end here; `clean` says the helper saw the whole tree gone (the server
//! then need not sweep the uid for leftovers).

/// How the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signaled(i32),
}

/// What the helper reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub end: End,
    /// Every process of the tree was seen gone.
    pub clean: bool,
}

impl Record {
    /// The line written on the status descriptor.
    pub fn line(&self) -> String {
        let tree = if self.clean { "clean" } else { "left" };
        match self.end {
            End::Exited(code) => format!("exit {code} {tree}\n"),
            End::Signaled(sig) => format!("signal {sig} {tree}\n"),
        }
    }

    /// Parse a line written by [`line`](Self::line).
    pub fn parse(record: &str) -> Option<Self> {
        let mut it = record.split_whitespace();
        let (kind, n, tree) = (it.next()?, it.next()?, it.next()?);
        if it.next().is_some() {
            return None;
        }
        let n: i32 = n.parse().ok()?;
        let end = match kind {
            "exit" if (0..=255).contains(&n) => End::Exited(n),
            "signal" if (1..128).contains(&n) => End::Signaled(n),
            _ => return None,
        };
        let clean = match tree {
            "clean" => true,
            "left" => false,
            _ => return None,
        };
        Some(Self { end, clean })
    }

    /// The raw wait status this record stands for (as `ExitStatusExt::from_raw` takes it).
    pub fn wait_status(&self) -> i32 {
        match self.end {
            End::Exited(code) => code << 8,
            End::Signaled(sig) => sig,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        use std::os::unix::process::ExitStatusExt;
        for r in [
            Record {
                end: End::Exited(3),
                clean: true,
            },
            Record {
                end: End::Signaled(9),
                clean: false,
            },
        ] {
            assert_eq!(Record::parse(&r.line()), Some(r));
        }
        let r = Record::parse("exit 3 clean\n").expect("exit");
        assert_eq!(
            std::process::ExitStatus::from_raw(r.wait_status()).code(),
            Some(3)
        );
        let r = Record::parse("signal 11 left").expect("signal");
        assert_eq!(
            std::process::ExitStatus::from_raw(r.wait_status()).signal(),
            Some(11)
        );
        assert!(!r.clean);
        for bad in [
            "exit 300 clean",
            "exit 3",
            "signal 0 clean",
            "exit 3 maybe",
            "exit 3 clean extra",
            "garbage",
            "",
        ] {
            assert_eq!(Record::parse(bad), None, "{bad:?}");
        }
    }
}
