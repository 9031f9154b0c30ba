//! What `run-code` shows (and `replbox run` prints on failure): a run's text.

use crate::run::{Phase, RunReport};

impl RunReport {
    /// The text content: exactly stdout on a clean success (as mcp-server-code-runner
    /// returns it), else stdout, stderr and a trailer saying how it ended.
    pub fn text(&self) -> String {
        let mut t = self.text_of_run();
        if let Some(p) = &self.packages {
            end_line(&mut t);
            t.push_str(&format!("[{}]", p.line()));
        }
        t
    }

    fn text_of_run(&self) -> String {
        if self.success() && self.stderr.is_empty() {
            return self.stdout.clone();
        }
        let mut t = self.stdout.clone();
        if !self.stderr.is_empty() {
            end_line(&mut t);
            t.push_str("[stderr]\n");
            t.push_str(&self.stderr);
        }
        end_line(&mut t);
        t.push_str(&self.trailer());
        t
    }

    fn trailer(&self) -> String {
        let during = if self.phase == Phase::Compile {
            " while compiling"
        } else {
            ""
        };
        if self.timed_out {
            return format!("[timed out after {} ms{during}]", self.duration_ms);
        }
        if let Some(e) = &self.error {
            return format!("[{e}]");
        }
        let how = match (&self.exit_code, &self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by {s}"),
            (None, None) => "ended".to_string(),
        };
        if self.phase == Phase::Compile {
            format!("[compile error: {how}]")
        } else {
            format!("[{how}]")
        }
    }
}

fn end_line(t: &mut String) {
    if !t.is_empty() && !t.ends_with('\n') {
        t.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Level;

    fn report() -> RunReport {
        RunReport {
            language: "python".into(),
            stdout: "out\n".into(),
            stderr: String::new(),
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            duration_ms: 12,
            truncated: false,
            phase: Phase::Run,
            error: None,
            sandbox: Level::Bwrap,
            interpreter: None,
            mcp_servers: Vec::new(),
            tool_calls: Vec::new(),
            packages: None,
        }
    }

    #[test]
    fn clean_success_is_exactly_stdout() {
        assert_eq!(report().text(), "out\n");
        let mut r = report();
        r.stdout = "no newline".into();
        assert_eq!(r.text(), "no newline");
    }

    #[test]
    fn stderr_and_exit_code_are_kept() {
        let mut r = report();
        r.stderr = "warn".into();
        assert!(r.success());
        assert_eq!(r.text(), "out\n[stderr]\nwarn\n[exit code 0]");
        r.exit_code = Some(3);
        r.stdout = "partial".into();
        r.stderr.clear();
        assert!(!r.success());
        assert_eq!(r.text(), "partial\n[exit code 3]");
    }

    #[test]
    fn trailers() {
        let mut r = report();
        r.timed_out = true;
        r.exit_code = None;
        r.signal = Some("SIGKILL".into());
        r.duration_ms = 2003;
        assert!(r.text().ends_with("[timed out after 2003 ms]"));
        let mut r = report();
        r.phase = Phase::Compile;
        r.exit_code = Some(1);
        r.stdout.clear();
        r.stderr = "main.c:1: error".into();
        assert_eq!(
            r.text(),
            "[stderr]\nmain.c:1: error\n[compile error: exit code 1]"
        );
        let mut r = report();
        r.exit_code = None;
        r.signal = Some("SIGSEGV".into());
        assert!(r.text().ends_with("[killed by SIGSEGV]"));
    }
}
