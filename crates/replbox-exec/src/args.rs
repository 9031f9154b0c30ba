//! What the helper is told, in two parts:
//!
//! * [`ExecArgs`], its command line: the confinement the server decided (limits, uid,
//!   Landlock rules, seccomp) and the descriptors it reads and writes. Nothing in it comes
//!   from a caller except the working directory, which is entered only after the uid drop.
//!   The one encoding is [`ExecArgs::to_args`] / [`ExecArgs::from_args`].
//! * [`Program`], on the descriptor `program_fd`: the program's path, argv and complete
//!   environment, which carry the caller's values. The helper holds them as data and hands
//!   them to `execve` only in the confined child, so no process that runs before the
//!   confinement (bwrap, the helper) ever sees them in its own environment, and they are not
//!   in any command line that other users can read in `/proc/PID/cmdline`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

/// The descriptor the server passes the status pipe on (see [`crate::status`]).
pub const STATUS_FD: i32 = 3;
/// The descriptor the server passes the [`Program`] on.
pub const PROGRAM_FD: i32 = 4;
/// The largest [`Program`] the helper reads (argv and environment together): more than the
/// kernel's own limit for `execve`.
pub const MAX_PROGRAM_BYTES: u64 = 8 << 20;

/// Whether the Landlock ruleset must be enforced (level `landlock`) or is defence in depth
/// (inside bwrap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockMode {
    Required,
    BestEffort,
}

/// The resource limits the helper sets, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rlimit {
    Data,
    Nproc,
    Fsize,
    Nofile,
    Cpu,
    /// Bytes of POSIX message queues (0: none can be created).
    Msgqueue,
}

impl Rlimit {
    const ALL: [(Rlimit, &'static str); 6] = [
        (Rlimit::Data, "data"),
        (Rlimit::Nproc, "nproc"),
        (Rlimit::Fsize, "fsize"),
        (Rlimit::Nofile, "nofile"),
        (Rlimit::Cpu, "cpu"),
        (Rlimit::Msgqueue, "msgqueue"),
    ];

    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(r, _)| *r == self)
            .map_or("?", |(_, n)| n)
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(r, _)| *r)
    }
}

/// The helper's command line, typed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecArgs {
    /// stdin is a PTY slave: make it the controlling terminal.
    pub pty: bool,
    /// Descriptor to report the program's end on (see [`crate::status`]).
    pub status_fd: Option<i32>,
    /// Descriptor to read the [`Program`] from.
    pub program_fd: Option<i32>,
    /// Directory to enter, after the uid drop.
    pub chdir: Option<PathBuf>,
    /// Enter the directory of this inherited descriptor instead (one of `write_fds`: a
    /// caller's directory, entered as it was decided, whatever its path leads to now).
    pub chdir_fd: Option<i32>,
    /// Run the program as this (uid, gid).
    pub ids: Option<(u32, u32)>,
    /// (resource, value) pairs, soft = hard (CPU: hard one second later).
    pub rlimits: Vec<(Rlimit, u64)>,
    pub landlock: Option<LandlockMode>,
    /// Landlock: readable trees. Opened without following symbolic links.
    pub read: Vec<PathBuf>,
    /// Landlock: writable trees. Opened without following symbolic links.
    pub write: Vec<PathBuf>,
    /// Landlock: readable trees, as descriptors inherited at these numbers (directories the
    /// server opened as the session's user when it decided them: no path is resolved again).
    pub read_fds: Vec<i32>,
    /// Landlock: writable trees, likewise.
    pub write_fds: Vec<i32>,
    /// Network allowed (no TCP rules in Landlock, IP sockets allowed by seccomp).
    pub net: bool,
    pub seccomp: bool,
    /// Give the program a private /dev/shm of this many bytes, writable, instead of the
    /// host's (which is then not writable): the child enters a mount namespace of its own
    /// (and, when the helper is not root, a user namespace mapping only its own ids) and
    /// mounts a tmpfs there, gone with the last process of the tree. Where the kernel
    /// refuses that, the program has no writable /dev/shm.
    pub private_shm: Option<u64>,
    /// Give the program (when the helper is root) a /proc of its own in that mount
    /// namespace, where only processes it could trace appear (`hidepid=invisible`): the
    /// command lines, environments and descriptors of other users' programs are not there.
    pub private_proc: bool,
    /// The one TCP port the program may connect to (the egress proxy on loopback): Landlock
    /// allows connecting to it alone, and seccomp allows IP stream sockets (no UDP, no raw).
    pub proxy_port: Option<u16>,
    /// Bridge `127.0.0.1:proxy_port`, inside the sandbox's own network namespace, to this
    /// Unix socket (the server's proxy), in a process of the tree (see [`crate::bridge`]).
    pub proxy_socket: Option<PathBuf>,
}

impl ExecArgs {
    /// The command line that [`from_args`](Self::from_args) reads back.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = Vec::new();
        let mut flag = |k: &str, val: Option<OsString>| {
            v.push(k.into());
            v.extend(val);
        };
        if self.pty {
            flag("--pty", None);
        }
        if let Some(fd) = self.status_fd {
            flag("--status-fd", Some(fd.to_string().into()));
        }
        if let Some(fd) = self.program_fd {
            flag("--program-fd", Some(fd.to_string().into()));
        }
        if let Some(d) = &self.chdir {
            flag("--chdir", Some(d.clone().into()));
        }
        if let Some(fd) = self.chdir_fd {
            flag("--chdir-fd", Some(fd.to_string().into()));
        }
        if let Some((uid, gid)) = self.ids {
            flag("--ids", Some(format!("{uid}:{gid}").into()));
        }
        for (r, n) in &self.rlimits {
            flag("--rlimit", Some(format!("{}={n}", r.name()).into()));
        }
        if let Some(mode) = self.landlock {
            let m = match mode {
                LandlockMode::Required => "required",
                LandlockMode::BestEffort => "best-effort",
            };
            flag("--landlock", Some(m.into()));
        }
        for p in &self.read {
            flag("--read", Some(p.clone().into()));
        }
        for p in &self.write {
            flag("--write", Some(p.clone().into()));
        }
        for fd in &self.read_fds {
            flag("--read-fd", Some(fd.to_string().into()));
        }
        for fd in &self.write_fds {
            flag("--write-fd", Some(fd.to_string().into()));
        }
        if self.net {
            flag("--net", None);
        }
        if self.seccomp {
            flag("--seccomp", None);
        }
        if let Some(n) = self.private_shm {
            flag("--private-shm", Some(n.to_string().into()));
        }
        if self.private_proc {
            flag("--private-proc", None);
        }
        if let Some(p) = self.proxy_port {
            flag("--proxy-port", Some(p.to_string().into()));
        }
        if let Some(p) = &self.proxy_socket {
            flag("--proxy-socket", Some(p.clone().into()));
        }
        v
    }

    /// Parse what [`to_args`](Self::to_args) wrote (the arguments after the program name).
    pub fn from_args(args: impl IntoIterator<Item = OsString>) -> Result<Self, String> {
        let mut out = ExecArgs::default();
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            let name = a.to_str().ok_or_else(|| format!("unknown option {a:?}"))?;
            let mut value = || args.next().ok_or_else(|| format!("{name} needs a value"));
            match name {
                "--pty" => out.pty = true,
                "--net" => out.net = true,
                "--seccomp" => out.seccomp = true,
                "--private-proc" => out.private_proc = true,
                "--status-fd" => out.status_fd = Some(fd(name, &value()?)?),
                "--program-fd" => out.program_fd = Some(fd(name, &value()?)?),
                "--chdir" => out.chdir = Some(value()?.into()),
                "--chdir-fd" => out.chdir_fd = Some(fd(name, &value()?)?),
                "--ids" => {
                    let v = value()?;
                    let (u, g) = utf8(name, &v)?
                        .split_once(':')
                        .ok_or_else(|| format!("{name}: expected UID:GID, got {v:?}"))?;
                    out.ids = Some((number(name, u)?, number(name, g)?));
                }
                "--rlimit" => {
                    let v = value()?;
                    let (k, n) = utf8(name, &v)?
                        .split_once('=')
                        .ok_or_else(|| format!("{name}: expected NAME=VALUE, got {v:?}"))?;
                    let r = Rlimit::parse(k).ok_or_else(|| format!("{name}: unknown {k}"))?;
                    out.rlimits.push((r, number(name, n)?));
                }
                "--landlock" => {
                    out.landlock = Some(match utf8(name, &value()?)? {
                        "required" => LandlockMode::Required,
                        "best-effort" => LandlockMode::BestEffort,
                        other => return Err(format!("{name}: unknown mode {other:?}")),
                    })
                }
                "--private-shm" => out.private_shm = Some(number(name, utf8(name, &value()?)?)?),
                "--proxy-port" => out.proxy_port = Some(number(name, utf8(name, &value()?)?)?),
                "--proxy-socket" => out.proxy_socket = Some(value()?.into()),
                "--read" => out.read.push(value()?.into()),
                "--write" => out.write.push(value()?.into()),
                "--read-fd" => out.read_fds.push(fd(name, &value()?)?),
                "--write-fd" => out.write_fds.push(fd(name, &value()?)?),
                _ => return Err(format!("unknown option {a:?}")),
            }
        }
        Ok(out)
    }
}

fn utf8<'a>(name: &str, v: &'a OsStr) -> Result<&'a str, String> {
    v.to_str()
        .ok_or_else(|| format!("{name}: not UTF-8: {v:?}"))
}

fn number<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{name}: not a number (or out of range): {v:?}"))
}

fn fd(name: &str, v: &OsStr) -> Result<i32, String> {
    let n: i32 = number(name, utf8(name, v)?)?;
    if n < 3 {
        return Err(format!("{name}: {n} is a standard descriptor"));
    }
    Ok(n)
}

/// The program to run: the file to execute, its argv and its whole environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Program {
    /// What `execve` is given: a path (relative ones are taken from the working directory
    /// the child entered). No `PATH` search happens in the helper.
    pub file: OsString,
    pub argv: Vec<OsString>,
    /// `(name, value)` pairs, exactly the program's environment.
    pub env: Vec<(OsString, OsString)>,
}

const MAGIC: &[u8] = b"replbox-program-1";

impl Program {
    /// Bytes for the program descriptor: NUL-terminated fields (a magic word, the file, the
    /// number of arguments, the arguments, then `NAME=VALUE` entries up to the end). Fails
    /// on a NUL inside a field, or an environment name that is empty or has `=`.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let mut field = |b: &[u8], what: &str| -> Result<(), String> {
            if b.contains(&0) {
                return Err(format!("{what} contains a NUL byte"));
            }
            out.extend_from_slice(b);
            out.push(0);
            Ok(())
        };
        field(MAGIC, "magic")?;
        field(self.file.as_bytes(), "the program's path")?;
        field(self.argv.len().to_string().as_bytes(), "argc")?;
        for a in &self.argv {
            field(a.as_bytes(), "an argument")?;
        }
        for (k, v) in &self.env {
            check_name(k.as_bytes())?;
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            field(&kv, "an environment variable")?;
        }
        Ok(out)
    }

    /// Read back what [`encode`](Self::encode) wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let body = bytes
            .strip_suffix(&[0])
            .ok_or("the program description is not NUL-terminated")?;
        let mut fields = body.split(|&b| b == 0);
        if fields.next() != Some(MAGIC) {
            return Err("the program description has no valid header".into());
        }
        let os = |b: &[u8]| OsString::from_vec(b.to_vec());
        let file = fields.next().map(os).ok_or("no program path")?;
        let argc: usize = fields
            .next()
            .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .ok_or("no argument count")?;
        let mut argv = Vec::with_capacity(argc.min(4096));
        for _ in 0..argc {
            argv.push(
                fields
                    .next()
                    .map(os)
                    .ok_or("fewer arguments than counted")?,
            );
        }
        let mut env = Vec::new();
        for kv in fields {
            let eq = kv
                .iter()
                .position(|&b| b == b'=')
                .ok_or("an environment entry without '='")?;
            check_name(&kv[..eq])?;
            env.push((os(&kv[..eq]), os(&kv[eq + 1..])));
        }
        if file.is_empty() || argv.is_empty() {
            return Err("no program to run".into());
        }
        Ok(Self { file, argv, env })
    }
}

fn check_name(k: &[u8]) -> Result<(), String> {
    if k.is_empty() || k.contains(&b'=') || k.contains(&0) {
        return Err(format!(
            "invalid environment variable name {:?}",
            String::from_utf8_lossy(k)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(a: &ExecArgs) {
        assert_eq!(&ExecArgs::from_args(a.to_args()).expect("parses"), a);
    }

    #[test]
    fn every_field_round_trips() {
        let all = ExecArgs {
            pty: true,
            status_fd: Some(3),
            program_fd: Some(4),
            chdir: Some(PathBuf::from(OsString::from_vec(b"/w \xff--x".to_vec()))),
            chdir_fd: Some(6),
            ids: Some((100_001, 100_002)),
            rlimits: vec![
                (Rlimit::Data, 1 << 30),
                (Rlimit::Nproc, 5),
                (Rlimit::Fsize, 7),
                (Rlimit::Nofile, 64),
                (Rlimit::Cpu, u64::MAX),
                (Rlimit::Msgqueue, 0),
            ],
            landlock: Some(LandlockMode::BestEffort),
            read: vec!["/usr".into(), "--write".into()],
            write: vec!["/w".into(), "/dev/null".into()],
            read_fds: vec![5, 7],
            write_fds: vec![6],
            net: true,
            seccomp: true,
            private_shm: Some(256 << 20),
            private_proc: true,
            proxy_port: Some(3128),
            proxy_socket: Some("/run/replbox-egress.sock".into()),
        };
        round_trip(&all);
        round_trip(&ExecArgs {
            landlock: Some(LandlockMode::Required),
            ..all
        });
        round_trip(&ExecArgs::default());
        assert!(ExecArgs::default().to_args().is_empty());
    }

    #[test]
    fn bad_arguments_are_refused() {
        let parse = |a: &[&str]| ExecArgs::from_args(a.iter().map(OsString::from));
        for bad in [
            &["--rlimit", "bogus=1"][..],
            &["--rlimit", "data"],
            &["--rlimit", "data=-1"],
            &["--ids", "1"],
            &["--ids", "1:x"],
            &["--status-fd", "1"],
            &["--program-fd"],
            &["--landlock", "maybe"],
            &["--private-shm", "big"],
            &["--proxy-port", "70000"],
            &["--proxy-socket"],
            &["--read-fd", "2"],
            &["--write-fd", "x"],
            &["--what"],
            &["--", "true"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn programs_round_trip_and_bad_ones_are_refused() {
        let p = Program {
            file: "/usr/bin/python3".into(),
            argv: vec!["python3".into(), "".into(), "a=b\n".into()],
            env: vec![
                ("PATH".into(), "/usr/bin".into()),
                ("EMPTY".into(), "".into()),
                ("X".into(), "=y=".into()),
            ],
        };
        assert_eq!(
            Program::decode(&p.encode().expect("encodes")).expect("decodes"),
            p
        );
        let no_env = Program {
            env: Vec::new(),
            ..p.clone()
        };
        assert_eq!(
            Program::decode(&no_env.encode().expect("encodes")).expect("decodes"),
            no_env
        );
        let nul = Program {
            argv: vec!["a\0b".into()],
            ..p.clone()
        };
        assert!(nul.encode().is_err());
        let bad_name = Program {
            env: vec![("A=B".into(), "c".into())],
            ..p.clone()
        };
        assert!(bad_name.encode().is_err());
        let bytes = p.encode().expect("encodes");
        assert!(Program::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(Program::decode(b"other\0/x\x001\0x\0").is_err());
        assert!(Program::decode(b"replbox-program-1\0/x\x003\0x\0").is_err());
        assert!(Program::decode(b"replbox-program-1\0/x\x001\0x\0NOEQUALS\0").is_err());
        assert!(Program::decode(b"").is_err());
    }
}
