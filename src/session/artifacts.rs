//! What evaluations leave behind: the figures an end marker announces (read from the
//! session's `out/` directory, within the caps), the files created, changed or deleted in
//! the session's directory, and those files served as resources.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::SystemTime;

use super::entry::{Session, lock};
use super::files;
use super::manager::SessionManager;
use super::report::{Attachment, EvalReport, ImageInfo, ImageRef};
use super::table::Entry;
use super::watch::Tracked;
use crate::hostfs;
use crate::identity::Caller;
use crate::workspace::DirId;

impl SessionManager {
    /// A snapshot of `cwd` to compare the next evaluation against; None when the directory
    /// has more entries than tracking looks at (or tracking is off).
    pub(super) async fn baseline(&self, uid: Option<u32>, cwd: &Arc<OwnedFd>) -> Option<Tracked> {
        let max = self.config.max_tracked_files;
        if max == 0 {
            return None;
        }
        let cwd = cwd.clone();
        let skip = self.skip_dirs();
        hostfs::as_uid(uid, move || Tracked::start(cwd.as_fd(), max, &skip))
            .await
            .ok()
            .flatten()
    }

    /// Directories a session's listing never enters and a read never goes through: the
    /// server's workspace (other sessions' directories), should a caller's cwd contain it.
    pub(super) fn skip_dirs(&self) -> Vec<DirId> {
        self.workspace.root_id().into_iter().collect()
    }

    pub(super) fn untracked_note(&self) -> String {
        format!(
            "file changes are not tracked in this session: its directory has more than {} \
files and folders (--max-tracked-files)",
            self.config.max_tracked_files
        )
    }

    /// Attach what an evaluation left behind: the images its end marker announced (read
    /// from the control directory, within the caps) and the files it created, changed or
    /// deleted. The file work runs off the async workers.
    pub(super) async fn collect(&self, session: &Session, report: &mut EvalReport) {
        let refs = std::mem::take(&mut report.pending_images);
        let old = lock(&session.files).take();
        let was_tracked = old.is_some();
        if refs.is_empty() && old.is_none() {
            return;
        }
        let out = session.out_fd.clone();
        let cwd = session.cwd_fd.clone();
        let skip = self.skip_dirs();
        let id = session.id.clone();
        let max_images = self.config.max_images as usize;
        let max_bytes = self.config.max_image_bytes;
        let max_entries = self.config.max_tracked_files;
        // As the session's uid: both directories are the session code's to write.
        let job = hostfs::as_uid(session.uid, move || {
            let images = read_images(out.as_fd(), refs, max_images, max_bytes);
            let tracked = old.map(|mut tracked| {
                let changes = tracked.refresh(cwd.as_fd(), max_entries, &skip, &id);
                (tracked, changes)
            });
            (images, tracked)
        });
        let Ok((images, tracked)) = job.await else {
            tracing::warn!(session = %session.id, "collecting files and images failed");
            return;
        };
        report.images_omitted += images.over_count;
        for (info, data) in images.images {
            report.images.push(info);
            report.attachments.push(data);
        }
        if report.images_omitted > 0 {
            report.notes.push(format!(
                "{} more figure(s) not returned: at most {} images per evaluation \
(--max-images); close figures you are done with, or save them with savefig and read them as \
resources",
                report.images_omitted, self.config.max_images
            ));
        }
        for (name, size) in &images.too_big {
            report.images_omitted += 1;
            report.notes.push(format!(
                "{name} not returned: {} is over the {} cap per image (--max-image-bytes); \
draw it smaller (figsize, dpi) or save it with savefig and read it as a resource",
                files::human_size(*size),
                files::human_size(self.config.max_image_bytes)
            ));
        }
        match tracked {
            Some((new, Some(mut changes))) => {
                const LISTED: usize = 100;
                if changes.len() > LISTED {
                    report.files_omitted = (changes.len() - LISTED) as u64;
                    changes.truncate(LISTED);
                }
                report.files = changes;
                *lock(&session.files) = Some(new);
            }
            Some((_, None)) if was_tracked => {
                // The directory outgrew the walk: stop paying for it at every evaluation.
                report.notes.push(format!(
                    "file changes are no longer tracked in this session: its directory now has \
more than {} files and folders (--max-tracked-files)",
                    self.config.max_tracked_files
                ));
            }
            _ => {}
        }
    }

    /// The files of the caller's sessions (session id, path, size), for `resources/list`;
    /// each session's walk is bounded like change tracking's.
    pub async fn list_files(&self, caller: &Caller) -> Vec<(String, String, u64)> {
        // Open sessions, and ended ones whose files are kept, read-only.
        let mut mine: Vec<(SystemTime, String, Arc<OwnedFd>, Option<u32>)> =
            self.table.read(|st| {
                st.entries()
                    .filter(|(_, e)| e.owner() == caller)
                    .filter_map(|(id, e)| match e {
                        Entry::Open(s) => Some((s.created_at, id.clone(), s.cwd_fd.clone(), s.uid)),
                        _ => e
                            .kept()
                            .filter(|k| k.has_files())
                            .map(|k| (k.created_at, id.clone(), k.cwd_fd.clone(), k.uid)),
                    })
                    .collect()
            });
        mine.sort_by_key(|m| m.0);
        let max = self.config.max_tracked_files.max(1);
        let mut out = Vec::new();
        // Each session's directory as its own uid.
        for (_, id, cwd, uid) in mine {
            let skip = self.skip_dirs();
            let snap = hostfs::as_uid(uid, move || files::snapshot(cwd.as_fd(), max, &skip))
                .await
                .unwrap_or_default();
            for (path, stamp) in snap.files {
                out.push((id.clone(), path, stamp.size));
            }
        }
        out
    }

    /// Read a file of one of the caller's sessions, by path relative to its directory,
    /// following no symbolic link, within the resource size cap.
    pub async fn read_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
    ) -> Result<FileData, FileError> {
        let parts: Vec<String> = crate::workspace::check_relative(path)
            .map_err(FileError::Invalid)?
            .into_iter()
            .map(str::to_string)
            .collect();
        // An open session, or an ended one whose files are kept (read-only: nothing of it
        // runs any more, and its uid is still its own).
        let (cwd, uid) = match self.lookup(caller, id) {
            Ok(s) => (s.cwd_fd.clone(), s.uid),
            Err(e) => match self.kept_files(caller, id) {
                Some(files) => files,
                None => return Err(FileError::NotFound(e.message)),
            },
        };
        let walk = hostfs::Walk {
            same_mount: true,
            forbidden: self.skip_dirs(),
            into_workspaces: false,
        };
        let cap = self.config.max_resource_bytes;
        let shown = path.to_string();
        let sid = id.to_string();
        // As the session's uid, beneath its directory, on its filesystem, through no link.
        hostfs::as_uid(uid, move || {
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            let file = hostfs::open_beneath(cwd.as_fd(), &refs, &walk).map_err(|e| {
                match e.raw_os_error() {
                    Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV) => {
                        FileError::Invalid(format!(
                            "{shown:?} in session {sid} goes through a symbolic link or into \
another filesystem; links and mount points are not followed"
                        ))
                    }
                    Some(libc::ENOENT) => FileError::NotFound(format!(
                        "session {sid} has no file {shown:?}; resources/list shows its files"
                    )),
                    _ => FileError::Invalid(format!("{shown:?} in session {sid}: {e}")),
                }
            })?;
            match crate::workspace::read_capped(file, cap) {
                Ok(Ok(bytes)) => Ok(FileData {
                    bytes,
                    mime: files::mime_for(&shown),
                }),
                Ok(Err(size)) => Err(FileError::TooLarge(format!(
                    "{shown:?} is {} and resources/read returns at most {} \
(--max-resource-bytes); read the part you need in the session (head, a slice, a summary)",
                    files::human_size(size),
                    files::human_size(cap)
                ))),
                Err(e) => Err(FileError::Invalid(format!("{shown:?}: {e}"))),
            }
        })
        .await
        .unwrap_or_else(|e| Err(FileError::Invalid(format!("reading failed: {e}"))))
    }
}

/// A session file read for `resources/read`.
pub struct FileData {
    pub bytes: Vec<u8>,
    /// What its name suggests.
    pub mime: Option<&'static str>,
}

/// Why a session file cannot be read.
#[derive(Debug)]
pub enum FileError {
    /// No such session (of this caller) or file.
    NotFound(String),
    /// A path that is refused (outside the directory, through a link, not a file).
    Invalid(String),
    TooLarge(String),
}

#[derive(Default)]
struct ImagesRead {
    images: Vec<(ImageInfo, Attachment)>,
    /// Left out over the count cap.
    over_count: u64,
    /// Left out over the size cap: (name, bytes).
    too_big: Vec<(String, u64)>,
}

/// Read the images an end marker announced from the session's `out/` directory, within
/// the caps, removing each file once read. Code in the session could forge a marker, so a
/// name is only ever a plain file name in that directory, opened without following links.
fn read_images(
    out_dir: std::os::fd::BorrowedFd<'_>,
    refs: Vec<ImageRef>,
    max_images: usize,
    max_bytes: u64,
) -> ImagesRead {
    let mut out = ImagesRead::default();
    for (k, r) in refs.into_iter().enumerate() {
        let file = r.file.as_str();
        if file.is_empty() || file.contains('/') || file.starts_with('.') {
            tracing::warn!(file, "ignored an image name that is not a plain file name");
            continue;
        }
        let name = match r.figure {
            Some(n) => format!("figure-{n}.png"),
            None => format!("image-{}.png", k + 1),
        };
        if out.images.len() >= max_images {
            out.over_count += 1;
        } else {
            let read = hostfs::open_beneath(out_dir, &[file], &hostfs::Walk::default())
                .and_then(|f| crate::workspace::read_capped(f, max_bytes));
            match read {
                Ok(Ok(data)) => match png_size(&data) {
                    Some((width, height)) => out.images.push((
                        ImageInfo {
                            name,
                            mime_type: "image/png".into(),
                            bytes: data.len() as u64,
                            width,
                            height,
                        },
                        Attachment {
                            mime_type: "image/png".into(),
                            data,
                        },
                    )),
                    None => tracing::warn!(file, "ignored an image that is not a PNG"),
                },
                Ok(Err(size)) => out.too_big.push((name, size)),
                Err(e) => tracing::warn!(file, error = %e, "cannot read an image"),
            }
        }
        let _ = hostfs::remove_beneath(out_dir, &[file], false);
    }
    out
}

/// Width and height of a PNG, from its signature and IHDR chunk.
fn png_size(data: &[u8]) -> Option<(u32, u32)> {
    const SIG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if data.len() < 24 || &data[..8] != SIG || &data[12..16] != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(data[16..20].try_into().ok()?);
    let h = u32::from_be_bytes(data[20..24].try_into().ok()?);
    Some((w, h))
}
