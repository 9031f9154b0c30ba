//! A file the server wrote earlier read back whole as hostile data (a session's journal, a
//! task's file, an npm layer's lockfile): no link followed (`O_NOFOLLOW`: a link planted in
//! its place is refused, never read through), never blocking (`O_NONBLOCK`: a FIFO in its
//! place is refused, not waited on), a regular file only, and no more than its bound read,
//! even from a file that grows meanwhile. A leaf, so that `tasks`, which may use only
//! leaves, shares it with `session` and `packages`; each caller's error wraps [`ReadError`],
//! whose messages are theirs (or, for a lockfile, stands for "no layout").

use std::fs::Metadata;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Why a file does not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("cannot open it: {0}")]
    Open(io::Error),
    /// Its metadata or bytes could not be read.
    #[error("{0}")]
    Read(io::Error),
    #[error("not a regular file")]
    NotFile,
    #[error("{0} bytes, over the bound")]
    TooBig(u64),
}

/// The bytes of the regular file at `path` (at most `limit`; a larger one is an error) and
/// its metadata as opened.
pub(crate) fn read(path: &Path, limit: u64) -> Result<(Vec<u8>, Metadata), ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(ReadError::Open)?;
    let meta = file.metadata().map_err(ReadError::Read)?;
    if !meta.is_file() {
        return Err(ReadError::NotFile);
    }
    if meta.len() > limit {
        return Err(ReadError::TooBig(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Read)?;
    Ok((bytes, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_fifos_directories_and_big_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("f");
        std::fs::write(&file, b"0123456789").unwrap();
        assert_eq!(read(&file, 10).unwrap().0, b"0123456789");
        assert_eq!(
            read(&file, 9).unwrap_err().to_string(),
            "10 bytes, over the bound"
        );
        let link = d.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(matches!(read(&link, 10), Err(ReadError::Open(_))));
        let fifo = d.path().join("p");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(
            read(&fifo, 10).unwrap_err().to_string(),
            "not a regular file"
        );
        assert_eq!(
            read(d.path(), 10).unwrap_err().to_string(),
            "not a regular file"
        );
        assert_eq!(
            read(&d.path().join("absent"), 10).unwrap_err().to_string(),
            "cannot open it: No such file or directory (os error 2)"
        );
    }
}
