//! Rich displays: the MIME bundles a bootstrap wrote into `out/` (Python's `display()` and a
//! cell's value with `_repr_*_` methods, as Jupyter defines them), read within caps and made
//! into what the result carries: images, text resources with their MIME type, and a table's
//! records. Every byte of a bundle is user code's: a name is a plain file name opened
//! beneath `out/` through no link, a file is read up to a cap, a MIME type is checked
//! against a closed set, and each kind of content has a budget per evaluation.

use std::os::fd::BorrowedFd;

use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

use crate::hostfs;
use crate::session::files;
use crate::session::report::{DisplayInfo, DisplayRef, RichBlock, RichContent};

/// Largest bundle file read, in bytes (a bootstrap writes at most 4 MiB of data in one).
pub(super) const MAX_BUNDLE_BYTES: u64 = 6 << 20;
/// Bundles read per evaluation; more are counted as left out.
pub(super) const MAX_DISPLAYS: usize = 16;

/// The caps of one evaluation's displays.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caps {
    /// Images the evaluation may still return (figures count too).
    pub images: usize,
    /// Largest image, in bytes.
    pub image_bytes: u64,
    /// Bytes of text resources (HTML, Markdown, LaTeX, JSON) for the whole evaluation.
    pub text_bytes: usize,
    /// Bytes of a table's records (serialized) in the structured result.
    pub frame_bytes: usize,
}

/// What the displays of one evaluation became.
#[derive(Debug, Default)]
pub(super) struct Displays {
    pub infos: Vec<DisplayInfo>,
    pub blocks: Vec<RichBlock>,
    /// Images among `blocks`.
    pub images: usize,
    /// Why something was left out, for the result's notes.
    pub notes: Vec<String>,
    pub omitted: u64,
}

/// A bundle as a bootstrap writes it: `{"data": {mime: value}, "frame": {...}}`.
#[derive(Debug, Default, Deserialize)]
struct Bundle {
    #[serde(default)]
    data: serde_json::Map<String, Value>,
    #[serde(default)]
    frame: Option<Value>,
    /// Its parts are kept as resources and only linked from the result (within the same
    /// caps on bytes; a linked image does not count against the images returned).
    #[serde(default)]
    linked: bool,
}

/// What becomes of one MIME type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Base64 of an image whose header must be its format's (`image::size`); the file
    /// extension.
    Raster(&'static str),
    Svg,
    /// Text, returned as an embedded resource with the given file extension.
    Text(&'static str),
}

/// The MIME types returned (others, text/plain among them, are not: the text is already in
/// the output), in the order their blocks go into the result.
fn kind(mime: &str) -> Option<Kind> {
    Some(match mime {
        "image/png" => Kind::Raster("png"),
        "image/jpeg" => Kind::Raster("jpg"),
        "image/gif" => Kind::Raster("gif"),
        "image/svg+xml" => Kind::Svg,
        "text/html" => Kind::Text("html"),
        "text/markdown" => Kind::Text("md"),
        "text/latex" => Kind::Text("tex"),
        "application/json" | "application/geo+json" => Kind::Text("json"),
        // Vega, Vega-Lite, Plotly and other JSON formats of the notebook world (Vega-Lite 6
        // names its own `application/vnd.vegalite.v6.json`).
        m if m.starts_with("application/vnd.")
            && (m.ends_with("+json") || m.ends_with(".json"))
            && m.len() <= 80
            && m[16..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+.-".contains(&b)) =>
        {
            Kind::Text("json")
        }
        _ => return None,
    })
}

/// Names what an evaluation returns, to be read again later:
/// `replbox://sessions/{id}/{figures|displays}/{eval}-{n}.{ext}`, `n` counting the
/// evaluation's figures and display parts together (across the parts of an evaluation that
/// paused for input), so each URI names one thing.
#[derive(Debug, Clone)]
pub(crate) struct Namer {
    pub session_id: String,
    pub eval_id: u64,
    pub next: u64,
}

impl Namer {
    pub fn uri(&mut self, kind: &str, ext: &str) -> String {
        let uri = files::shown_uri(&self.session_id, kind, self.eval_id, self.next, ext);
        self.next += 1;
        uri
    }
}

/// Read the bundles an end marker named, within the caps, removing each file once read.
pub(super) fn read_displays(
    out_dir: BorrowedFd<'_>,
    refs: Vec<DisplayRef>,
    namer: &mut Namer,
    caps: Caps,
) -> Displays {
    let mut out = Displays::default();
    let mut text_left = caps.text_bytes;
    for (k, r) in refs.into_iter().enumerate() {
        let file = r.file.as_str();
        if file.is_empty() || file.contains('/') || file.starts_with('.') || file.len() > 255 {
            tracing::warn!("ignored a display name that is not a plain file name");
            continue;
        }
        if k >= MAX_DISPLAYS {
            out.omitted += 1;
        } else {
            let read = hostfs::open_beneath(out_dir, &[file], &hostfs::Walk::default())
                .and_then(|f| crate::workspace::read_capped(f, MAX_BUNDLE_BYTES));
            match read {
                Ok(Ok(data)) => bundle(&data, namer, caps, &mut text_left, &mut out),
                Ok(Err(size)) => {
                    out.omitted += 1;
                    out.notes.push(format!(
                        "a display of {} was not returned: over the {} read per display",
                        crate::session::files::human_size(size),
                        crate::session::files::human_size(MAX_BUNDLE_BYTES)
                    ));
                }
                Err(e) => tracing::warn!(error = %e, "cannot read a display"),
            }
        }
        let _ = hostfs::remove_beneath(out_dir, &[file], false);
    }
    out
}

/// One bundle's bytes (user code's) into `out`.
pub(super) fn bundle(
    data: &[u8],
    namer: &mut Namer,
    caps: Caps,
    text_left: &mut usize,
    out: &mut Displays,
) {
    // serde_json bounds nesting (128 levels); the size is bounded by the read.
    let Ok(b) = serde_json::from_slice::<Bundle>(data) else {
        tracing::warn!("ignored a display that is not a bundle");
        return;
    };
    let mut info = DisplayInfo::default();
    let mut entries: Vec<(&String, &Value, Kind)> = b
        .data
        .iter()
        .take(32)
        .filter_map(|(m, v)| kind(m).map(|k| (m, v, k)))
        .collect();
    // Images first, then text, each in a fixed order whatever the bundle's.
    let image = |k: &Kind| matches!(k, Kind::Raster(_) | Kind::Svg);
    entries.sort_by(|a, b| (!image(&a.2), a.0).cmp(&(!image(&b.2), b.0)));
    for (mime, value, kind) in entries {
        let Some((ext, content)) = part(mime, value, kind, b.linked, caps, text_left, out) else {
            continue;
        };
        let uri = namer.uri("displays", ext);
        info.uris.push(uri.clone());
        out.blocks.push(RichBlock {
            mime_type: mime.clone(),
            uri,
            content,
        });
        info.mime_types.push(mime.clone());
    }
    info.frame = b.frame.and_then(|f| frame(f, caps.frame_bytes));
    if !info.mime_types.is_empty() || info.frame.is_some() {
        out.infos.push(info);
    }
}

/// What one part of a bundle (`value`, of MIME type `mime`) returns, checked and within
/// the caps: its file extension and content. None when it returns nothing (with a note
/// when a cap left it out).
fn part(
    mime: &str,
    value: &Value,
    kind: Kind,
    linked: bool,
    caps: Caps,
    text_left: &mut usize,
    out: &mut Displays,
) -> Option<(&'static str, RichContent)> {
    match kind {
        Kind::Raster(ext) => {
            let s = value.as_str()?;
            let clean: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            let b64 = base64::engine::general_purpose::STANDARD;
            let bytes = b64.decode(clean.as_bytes()).ok()?;
            // The same check as a figure's: the signature and a header with a size.
            super::image::size(mime, &bytes)?;
            if !take_image(out, caps, bytes.len() as u64, mime, linked) {
                return None;
            }
            Some((ext, image_content(bytes, linked)))
        }
        Kind::Svg => {
            let s = value.as_str()?;
            if !s.contains("<svg") || !take_image(out, caps, s.len() as u64, mime, linked) {
                return None;
            }
            Some(("svg", image_content(s.as_bytes().to_vec(), linked)))
        }
        Kind::Text(ext) => {
            let text = match value {
                Value::String(s) => s.clone(),
                v if ext == "json" => v.to_string(),
                _ => return None,
            };
            if text.len() > *text_left {
                out.omitted += 1;
                out.notes.push(format!(
                    "a display's {mime} ({}) was not returned: over what is left of the \
evaluation's budget for rich text (--output-cap); its text form is in the output",
                    crate::session::files::human_size(text.len() as u64)
                ));
                return None;
            }
            *text_left -= text.len();
            let content = if linked {
                RichContent::Link(text.into_bytes())
            } else {
                RichContent::Text(text)
            };
            Some((ext, content))
        }
    }
}

/// An image's content: embedded, or kept as a resource and linked.
fn image_content(bytes: Vec<u8>, linked: bool) -> RichContent {
    if linked {
        RichContent::Link(bytes)
    } else {
        RichContent::Image(bytes)
    }
}

/// Whether one more image fits (a linked one only within the bytes per image); a note
/// when it does not.
fn take_image(out: &mut Displays, caps: Caps, bytes: u64, mime: &str, linked: bool) -> bool {
    if !linked && out.images >= caps.images {
        out.omitted += 1;
        out.notes.push(format!(
            "a display's {mime} was not returned: the evaluation has returned all its images \
(--max-images)"
        ));
        return false;
    }
    if bytes > caps.image_bytes {
        out.omitted += 1;
        out.notes.push(format!(
            "a display's {mime} ({}) was not returned: over the {} cap per image \
(--max-image-bytes)",
            crate::session::files::human_size(bytes),
            crate::session::files::human_size(caps.image_bytes)
        ));
        return false;
    }
    if !linked {
        out.images += 1;
    }
    true
}

/// A table's description, its known fields only; past `budget` bytes its records are left
/// out (`records_omitted`), past it even without them it is dropped.
fn frame(f: Value, budget: usize) -> Option<Value> {
    let Value::Object(mut o) = f else {
        return None;
    };
    let mut kept = serde_json::Map::new();
    for key in ["type", "shape", "columns", "head", "tail"] {
        if let Some(v) = o.remove(key) {
            kept.insert(key.into(), v);
        }
    }
    let size = |m: &serde_json::Map<String, Value>| Value::Object(m.clone()).to_string().len();
    if size(&kept) > budget {
        kept.remove("head");
        kept.remove("tail");
        kept.insert("records_omitted".into(), Value::Bool(true));
        if size(&kept) > budget {
            return None;
        }
    }
    Some(Value::Object(kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CAPS: Caps = Caps {
        images: 2,
        image_bytes: 1000,
        text_bytes: 100,
        frame_bytes: 200,
    };

    fn namer() -> Namer {
        Namer {
            session_id: "s".into(),
            eval_id: 1,
            next: 1,
        }
    }

    fn run(v: Value) -> Displays {
        let mut out = Displays::default();
        let mut left = CAPS.text_bytes;
        bundle(
            v.to_string().as_bytes(),
            &mut namer(),
            CAPS,
            &mut left,
            &mut out,
        );
        out
    }

    #[test]
    fn known_types_become_blocks_images_first() {
        let png = base64::engine::general_purpose::STANDARD
            .encode(crate::session::evaluate::image::tests::png_header(4, 3));
        let d = run(json!({"data": {
            "text/html": "<b>x</b>", "text/plain": "x", "image/png": png,
            "application/vnd.vegalite.v5+json": {"mark": "bar"},
            "application/x-evil": "no", "image/svg+xml": "<svg/>"
        }}));
        let mimes: Vec<&str> = d.blocks.iter().map(|b| b.mime_type.as_str()).collect();
        assert_eq!(
            mimes,
            [
                "image/png",
                "image/svg+xml",
                "application/vnd.vegalite.v5+json",
                "text/html"
            ]
        );
        assert_eq!(d.infos.len(), 1);
        assert_eq!(d.infos[0].mime_types, mimes);
        assert_eq!(d.blocks[2].uri, "replbox://sessions/s/displays/1-3.json");
        assert_eq!(d.blocks[1].uri, "replbox://sessions/s/displays/1-2.svg");
        assert_eq!(d.infos[0].uris.len(), 4);
        match &d.blocks[2].content {
            RichContent::Text(text) => assert_eq!(text, r#"{"mark":"bar"}"#),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn forged_and_oversized_parts_are_left_out() {
        // Not a PNG behind the label, a PNG's signature with no header after it, not
        // base64, a type with a path in it, text over the budget, and not a bundle at all.
        let b64 = base64::engine::general_purpose::STANDARD;
        let d = run(json!({"data": {
            "image/png": b64.encode(b"GIF89a"), "image/gif": b64.encode(b"GIF89a"),
            "image/jpeg": "!!!", "application/vnd./../x+json": "{}",
            "text/markdown": "m".repeat(101)
        }}));
        assert!(d.blocks.is_empty(), "{:?}", d.blocks);
        let d = run(json!({"data": {"image/png": b64.encode(b"\x89PNG\r\n\x1a\nno IHDR here")}}));
        assert!(d.blocks.is_empty(), "{:?}", d.blocks);
        let d = run(json!({"data": {
            "image/png": b64.encode(b"GIF89a"), "image/jpeg": "!!!",
            "application/vnd./../x+json": "{}", "text/markdown": "m".repeat(101)
        }}));
        assert!(d.blocks.is_empty(), "{:?}", d.blocks);
        assert_eq!(d.omitted, 1);
        assert!(d.notes[0].contains("budget"), "{:?}", d.notes);
        let mut out = Displays::default();
        let mut left = 100;
        bundle(b"[1,2", &mut namer(), CAPS, &mut left, &mut out);
        bundle(
            &b"[".repeat(10_000),
            &mut namer(),
            CAPS,
            &mut left,
            &mut out,
        );
        assert!(out.infos.is_empty() && out.blocks.is_empty());
    }

    #[test]
    fn a_frame_keeps_its_fields_and_drops_records_over_budget() {
        let d = run(json!({"data": {}, "frame": {
            "type": "pandas.DataFrame", "shape": [2, 1], "columns": [{"name": "a", "dtype": "int64"}],
            "head": [{"a": 1}, {"a": 2}], "extra": "x"
        }}));
        assert_eq!(
            d.infos[0].frame,
            Some(json!({"type": "pandas.DataFrame", "shape": [2, 1],
                        "columns": [{"name": "a", "dtype": "int64"}],
                        "head": [{"a": 1}, {"a": 2}]}))
        );
        let d = run(json!({"data": {}, "frame": {"shape": [9, 1], "head": ["x".repeat(300)]}}));
        assert_eq!(
            d.infos[0].frame,
            Some(json!({"shape": [9, 1], "records_omitted": true}))
        );
    }

    #[test]
    fn linked_parts_are_links_within_the_bytes_cap_but_not_the_count() {
        let svg = "<svg xmlns=\"http://www.w3.org/2000/svg\"/>";
        let mut out = Displays::default();
        let mut left = 100;
        for _ in 0..3 {
            let b = json!({"data": {"image/svg+xml": svg}, "linked": true}).to_string();
            bundle(b.as_bytes(), &mut namer(), CAPS, &mut left, &mut out);
        }
        assert_eq!((out.images, out.omitted, out.blocks.len()), (0, 0, 3));
        assert!(matches!(out.blocks[0].content, RichContent::Link(_)));
        let big = format!("<svg>{}</svg>", "x".repeat(1000));
        let b = json!({"data": {"image/svg+xml": big}, "linked": true}).to_string();
        bundle(b.as_bytes(), &mut namer(), CAPS, &mut left, &mut out);
        assert_eq!((out.blocks.len(), out.omitted), (3, 1));
    }

    #[test]
    fn images_count_against_the_cap() {
        let png = base64::engine::general_purpose::STANDARD
            .encode(crate::session::evaluate::image::tests::png_header(4, 3));
        let mut out = Displays::default();
        let mut left = 100;
        for _ in 0..3 {
            let b = json!({"data": {"image/png": png}}).to_string();
            bundle(b.as_bytes(), &mut namer(), CAPS, &mut left, &mut out);
        }
        assert_eq!(out.images, 2);
        assert_eq!(out.omitted, 1);
    }
}
