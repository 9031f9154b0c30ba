//! What evaluations leave behind: the figures an end marker announces (read from the
//! session's `out/` directory, within the caps) and the files created, changed or deleted in
//! the session's directory.

use std::os::fd::AsFd;

use super::{Evaluator, display};
use crate::hostfs;
use crate::session::files::{self, FileChange};
use crate::session::live::{Session, lock};
use crate::session::report::{Attachment, EvalReport, ImageInfo, ImageRef};
use crate::session::watch::Tracked;

impl Evaluator {
    /// Attach what an evaluation left behind: the images its end marker announced (read
    /// from the control directory, within the caps) and the files it created, changed or
    /// deleted. The file work runs off the async workers.
    pub(super) async fn collect(&self, session: &Session, report: &mut EvalReport) {
        let refs = std::mem::take(&mut report.pending_images);
        let display_refs = std::mem::take(&mut report.pending_displays);
        let old = lock(&session.files).take();
        let was_tracked = old.is_some();
        if refs.is_empty() && display_refs.is_empty() && old.is_none() {
            if report.displays_omitted > 0 {
                report
                    .notes
                    .push(displays_left_out(report.displays_omitted));
            }
            return;
        }
        let eval_id = report.eval_id;
        let text_bytes = self.config.output_cap;
        let out = session.out_fd.clone();
        let cwd = session.cwd_fd.clone();
        let skip = self.skip.clone();
        let id = session.id.clone();
        let max_images = self.config.max_images as usize;
        let max_bytes = self.config.max_image_bytes;
        let max_entries = self.config.max_tracked_files;
        let mut namer = {
            let last = lock(&session.shown);
            display::Namer {
                session_id: id.clone(),
                eval_id,
                next: if last.0 == eval_id { last.1 } else { 1 },
            }
        };
        // As the session's uid: both directories are the session code's to write.
        let job = hostfs::as_uid(session.uid, move || {
            let images = read_images(out.as_fd(), refs, &mut namer, max_images, max_bytes);
            let caps = display::Caps {
                images: max_images.saturating_sub(images.images.len()),
                image_bytes: max_bytes,
                text_bytes,
                frame_bytes: text_bytes / 4,
            };
            let displays = display::read_displays(out.as_fd(), display_refs, &mut namer, caps);
            let tracked = old.map(|mut tracked| {
                let changes = tracked.refresh(cwd.as_fd(), max_entries, &skip, &id);
                (tracked, changes)
            });
            (images, displays, tracked, namer.next)
        });
        let Ok((images, displays, tracked, next)) = job.await else {
            tracing::warn!(session = %session.id, "collecting files and images failed");
            return;
        };
        *lock(&session.shown) = (eval_id, next);
        self.shown(report, images, displays);
        self.changes(session, report, tracked, was_tracked);
    }

    /// The figures and displays read into the report, with notes on what was left out.
    fn shown(&self, report: &mut EvalReport, images: ImagesRead, displays: display::Displays) {
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
        report.displays = displays.infos;
        report.rich = displays.blocks;
        report.notes.extend(displays.notes);
        let omitted = report.displays_omitted + displays.omitted;
        if omitted > 0 {
            report.notes.push(displays_left_out(omitted));
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
    }

    /// The files the evaluation created, changed or deleted into the report, and the
    /// session's tracking refreshed (`tracked`) kept; a note when its directory outgrew the
    /// walk.
    fn changes(
        &self,
        session: &Session,
        report: &mut EvalReport,
        tracked: Option<(Tracked, Option<Vec<FileChange>>)>,
        was_tracked: bool,
    ) {
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
}

/// The note for displays left out.
fn displays_left_out(n: u64) -> String {
    format!(
        "{n} display(s) not returned: at most {} per evaluation, each within the caps on images \
and on rich text",
        display::MAX_DISPLAYS
    )
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
    namer: &mut display::Namer,
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
                Ok(Ok(data)) => match super::image::size("image/png", &data) {
                    Some((width, height)) => {
                        let uri = namer.uri("figures", "png");
                        out.images.push((
                            ImageInfo {
                                name,
                                mime_type: "image/png".into(),
                                bytes: data.len() as u64,
                                width,
                                height,
                                uri: uri.clone(),
                            },
                            Attachment {
                                mime_type: "image/png".into(),
                                data,
                                uri,
                            },
                        ))
                    }
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
