//! The helper's reading of /proc: the process tree it kills. A process that is gone (or
//! unreadable) simply yields nothing: this races with processes ending. (The server reads
//! /proc through its own module, `exec::proc`.)

/// The most processes a tree walk returns (a fork bomb must not make it unbounded).
pub const MAX_TREE: usize = 4096;

/// The thread ids of a process.
fn threads(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The children of a process (every thread's, as each thread's children are listed under it).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for tid in threads(pid) {
        if let Ok(list) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|s| s.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// The descendants of `pid` (not `pid` itself), at most [`MAX_TREE`].
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for child in children(p) {
            if out.len() < MAX_TREE {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_and_its_child_are_descendants() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let sh = child.id();
        // The shell's own child appears once it has forked.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut tree = descendants(sh);
        while tree.is_empty() && std::time::Instant::now() < deadline {
            std::thread::yield_now();
            tree = descendants(sh);
        }
        assert!(threads(std::process::id()).contains(&std::process::id()));
        assert!(children(std::process::id()).contains(&sh));
        assert_eq!(tree.len(), 1, "{tree:?}");
        let _ = child.kill();
        let _ = child.wait();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(tree[0] as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
