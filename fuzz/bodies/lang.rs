//! Language files (`lang::parse_spec`): a `language.toml` and the source files it names.
//! The input is the TOML, then optionally a NUL and the text of a file `x.src` of the
//! folder; the folder also holds every built-in language's files.
//!
//! Properties, besides no panic: an accepted language keeps the promises the session code
//! relies on: its eval line is one line whatever the cell's path holds (a path is written
//! as a literal, never spliced), its prompt and continuation carry the nonce, and its cell
//! file is a plain name.

use std::path::Path;

use replbox::fuzzing::{BUILTIN, Folder, parse_spec};

const NONCE: &str = "f00dfeed01234567";
/// A path with everything that would break out of a literal, or a line.
const NASTY: &str = "/w/x\n'\"\r{n}$(id)`#{x}\\\u{1b}é";

/// Check one input (libFuzzer's, or a corpus file's).
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (toml, extra) = text.split_once('\0').unwrap_or((text, ""));
    let mut files: Vec<(&str, &str)> = BUILTIN
        .iter()
        .flat_map(|(_, files)| files.iter().copied())
        .collect();
    files.push(("x.src", extra));
    let Ok(spec) = parse_spec("fuzz", toml, Folder::Builtin(&files)) else {
        return;
    };
    assert!(!spec.id.is_empty());
    assert!(!spec.run.file.is_empty() && !spec.run.file.contains('/'));
    let Some(s) = &spec.session else {
        return;
    };
    assert!(s.prompt_for(NONCE).contains(NONCE));
    if let Some(c) = s.continuation_for(NONCE) {
        assert!(c.contains(NONCE));
    }
    for n in [0, 1, u64::MAX] {
        let cell = s.cell_name(n);
        assert!(!cell.contains('/') && !cell.is_empty(), "{cell:?}");
        let line = s.eval_line(n, Path::new(NASTY));
        assert!(
            !line.contains('\n') && !line.contains('\r'),
            "the eval line {line:?} spans lines"
        );
    }
    let nasty = Path::new(NASTY);
    let values = s.values(NONCE, nasty, nasty, nasty, nasty, 8);
    let _ = values.expand(&s.bootstrap.text);
    for line in &s.init {
        let _ = values.expand(line);
    }
}
