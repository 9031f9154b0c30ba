//! A PTY pair whose master side is read and written without blocking the async executor.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::fs::{Gid, Mode, OFlags, Uid};
use rustix::pty::OpenptFlags;
use rustix::termios::{
    self, InputModes, LocalModes, OptionalActions, QueueSelector, SpecialCodeIndex, Winsize,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Terminal size every session gets: wide enough that tables are not folded for an agent.
pub const COLS: u16 = 200;
pub const ROWS: u16 = 50;

/// Open a PTY with echo off. Returns the async master and the slave to give the child.
pub fn open() -> io::Result<(PtyMaster, OwnedFd)> {
    // Both ends are opened close-on-exec atomically: another child forked at the same moment
    // must never inherit them (a stray copy of the slave would keep the terminal open after
    // the session's tree is gone, hiding its end).
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    termios::tcsetwinsize(
        &slave,
        Winsize {
            ws_row: ROWS,
            ws_col: COLS,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    // Echo off before the child starts: the one line we type per evaluation must not come
    // back as output.
    // NOFLSH: an interrupt (Ctrl-C) must not make the kernel drop what the interpreter wrote
    // and the server has not read yet (an end marker written as the interrupt came), nor
    // typed input; the server discards typed input itself before each line it types.
    let mut t = termios::tcgetattr(&slave)?;
    t.local_modes.remove(LocalModes::ECHO | LocalModes::ECHONL);
    t.local_modes.insert(LocalModes::NOFLSH);
    termios::tcsetattr(&slave, OptionalActions::Now, &t)?;
    rustix::fs::fcntl_setfl(
        &master,
        rustix::fs::fcntl_getfl(&master)? | OFlags::NONBLOCK,
    )?;
    // SAFETY: the OwnedFd is moved into the AsyncFd, which owns it until dropped; nothing
    // else closes or replaces it.
    let master = unsafe {
        AsyncFd::register_with_interest(master, Interest::READABLE | Interest::WRITABLE)?
    };
    Ok((PtyMaster { fd: master }, slave))
}

/// Make the terminal behind `slave` belong to `uid`/`gid`, readable and writable by it only.
pub fn give_to(slave: &OwnedFd, uid: u32, gid: u32) -> io::Result<()> {
    rustix::fs::fchown(slave, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))?;
    Ok(rustix::fs::fchmod(slave, Mode::from_raw_mode(0o600))?)
}

/// Device number of a terminal descriptor.
pub fn rdev(fd: &OwnedFd) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_rdev)
}

pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

/// What one read produced.
pub enum ReadOutcome {
    Data(usize),
    /// Every slave descriptor is closed: the process tree is gone.
    Closed,
}

impl PtyMaster {
    /// Read what is available, waiting until something is.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        loop {
            let mut guard = self.fd.readable().await?;
            let res = guard.try_io(|inner| Ok(rustix::io::read(inner.get_ref(), &mut *buf)?));
            match res {
                Ok(Ok(0)) => return Ok(ReadOutcome::Closed),
                Ok(Ok(n)) => return Ok(ReadOutcome::Data(n)),
                // Linux reports EIO on the master once the last slave fd is closed.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => {
                    return Ok(ReadOutcome::Closed);
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Wait until the terminal has output, then run `f` (which should make one non-blocking
    /// read with [`read_now`](Self::read_now)). Lets the caller hold a lock across the read
    /// and whatever it does with the bytes.
    pub async fn on_readable<T>(&self, mut f: impl FnMut(&Self) -> io::Result<T>) -> io::Result<T> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|_| f(self)) {
                Ok(res) => return res,
                Err(_would_block) => continue,
            }
        }
    }

    /// One non-blocking read (`WouldBlock` when there is nothing to read).
    pub fn read_now(&self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        match rustix::io::read(self.fd.get_ref(), buf) {
            Ok(0) => Ok(ReadOutcome::Closed),
            Ok(n) => Ok(ReadOutcome::Data(n)),
            // Linux reports EIO on the master once the last slave fd is closed.
            Err(rustix::io::Errno::IO) => Ok(ReadOutcome::Closed),
            Err(e) => Err(e.into()),
        }
    }

    /// Bytes the program wrote that have not been read yet.
    pub fn unread(&self) -> usize {
        rustix::io::ioctl_fionread(self.fd.get_ref())
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Write all of `data`, waiting for room when the terminal's input buffer is full.
    pub async fn write_all(&self, data: &[u8]) -> io::Result<()> {
        self.write_counted(data, &mut 0).await
    }

    /// [`write_all`](Self::write_all), adding to `written` as bytes go out: a caller that
    /// stops waiting (drops the future at a deadline) knows how much was typed.
    pub async fn write_counted(&self, mut data: &[u8], written: &mut usize) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|inner| Ok(rustix::io::write(inner.get_ref(), data)?)) {
                Ok(Ok(n)) => {
                    data = &data[n..];
                    *written += n;
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Discard what was typed into the terminal and not read yet (the line discipline's
    /// input queue, through a descriptor of the terminal's other side: the master's own
    /// input queue is the program's output).
    pub fn flush_input(&self) {
        let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
        if let Ok(peer) = rustix::pty::ioctl_tiocgptpeer(self.fd.get_ref(), flags) {
            let _ = termios::tcflush(&peer, QueueSelector::IFlush);
        }
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.get_ref().as_raw_fd()
    }

    /// Whether a program switched the terminal out of canonical (line) mode, as line
    /// editors and key readers do while they wait for input.
    pub fn is_raw(&self) -> bool {
        termios::tcgetattr(self.fd.get_ref())
            .map(|t| !t.local_modes.contains(LocalModes::ICANON))
            .unwrap_or(false)
    }

    /// How long a read of the terminal waits at most: None (until input comes) in canonical
    /// mode or with VMIN > 0 (VTIME is then a timer between bytes, started by the first);
    /// VTIME tenths of a second with VMIN 0.
    pub fn read_timeout(&self) -> Option<std::time::Duration> {
        let t = termios::tcgetattr(self.fd.get_ref()).ok()?;
        if t.local_modes.contains(LocalModes::ICANON)
            || t.special_codes[SpecialCodeIndex::VMIN] != 0
        {
            return None;
        }
        Some(std::time::Duration::from_millis(
            100 * u64::from(t.special_codes[SpecialCodeIndex::VTIME]),
        ))
    }

    /// The byte the Enter key sends as the program reading it gets it: a newline when the
    /// terminal turns carriage returns into newlines (ICRNL, on unless a program turned it
    /// off) or reads lines, else the key's own carriage return.
    pub fn enter_key(&self) -> u8 {
        match termios::tcgetattr(self.fd.get_ref()) {
            Ok(t)
                if !t.local_modes.contains(LocalModes::ICANON)
                    && !t.input_modes.contains(InputModes::ICRNL) =>
            {
                b'\r'
            }
            _ => b'\n',
        }
    }

    /// Whether the terminal turns the interrupt character into SIGINT (ISIG). Programs
    /// that read keys one by one switch it off.
    pub fn signals_enabled(&self) -> bool {
        termios::tcgetattr(self.fd.get_ref())
            .map(|t| t.local_modes.contains(LocalModes::ISIG))
            .unwrap_or(true)
    }

    /// The terminal's foreground process group, as the kernel sees it.
    pub fn foreground_pgrp(&self) -> Option<i32> {
        termios::tcgetpgrp(self.fd.get_ref())
            .ok()
            .map(|p| p.as_raw_nonzero().get())
            .filter(|&p| p > 0)
    }
}
