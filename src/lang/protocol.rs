//! What the server and a language's bootstrap agree on (docs/bootstrap-protocol.md), and
//! the placeholders through which the bootstrap learns the session's values.
//!
//! Source text (a bootstrap, `init` lines, the `eval` line) is code, so a text value is
//! never spliced into it as raw text: `{name:FORMAT}` writes it as a string literal of
//! the language (`{ctl:json}` gives `"/srv/…/ctl"`), so quotes, newlines, `'''`, `$(…)`
//! or `#{…}` in a directory name stay data. A bare `{name}` is allowed only for numbers;
//! for text it is an error when the language is loaded. Expansion is one pass: a value
//! that contains `{nonce}` is not expanded again.

use std::fmt::Write as _;

/// Internal evaluations (readiness, resynchronisation) are numbered from here, so user
/// evaluation N is `<cell N>`; a bootstrap learns it as `{sync_base}`.
pub const SYNC_BASE: u64 = 1 << 40;

/// Name of the file created in the control directory just before evaluation `{n}` is
/// interrupted (removed when it ends); a bootstrap learns it as `{interrupt_file:…}`.
pub const INTERRUPT_FILE: &str = "interrupted-{n}";

/// Name of the file created in the control directory when input is first typed into
/// evaluation `{n}` (removed when it ends): the bootstrap then discards what the program left
/// unread; it learns the name as `{input_file:…}`.
pub const INPUT_FILE: &str = "input-{n}";

/// How a text value is written as a string literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A JSON string: also a string literal of Python and JavaScript.
    Json,
    /// A Ruby double-quoted string: JSON with `#` escaped, so nothing interpolates.
    Ruby,
    /// A Haskell string (ASCII only; other characters as numeric escapes).
    Haskell,
    /// A Bash `$'…'` string (one line whatever the value holds; a NUL, which no Bash
    /// string can hold, is left out).
    Shell,
    /// An R string: ASCII, every other character as a `\U{…}` escape, so the source reads
    /// the same in any locale; a NUL, which no R string can hold, is left out.
    R,
}

impl Format {
    pub const NAMES: [(&'static str, Format); 5] = [
        ("json", Format::Json),
        ("ruby", Format::Ruby),
        ("haskell", Format::Haskell),
        ("shell", Format::Shell),
        ("r", Format::R),
    ];

    pub fn parse(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| *f)
    }

    /// `s` as a literal of this format. The result never contains a raw newline.
    pub fn quote(self, s: &str) -> String {
        match self {
            Format::Json => json(s),
            Format::Ruby => json(s).replace('#', "\\u0023"),
            Format::Haskell => {
                let mut out = String::with_capacity(s.len() + 2);
                out.push('"');
                let mut chars = s.chars().peekable();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        c if c == ' ' || c.is_ascii_graphic() => out.push(c),
                        c => {
                            let _ = write!(out, "\\{}", c as u32);
                            // `\&` ends a numeric escape followed by a digit, as `show` does.
                            if chars.peek().is_some_and(|d| d.is_ascii_digit()) {
                                out.push_str("\\&");
                            }
                        }
                    }
                }
                out.push('"');
                out
            }
            Format::Shell => {
                let mut out = String::with_capacity(s.len() + 3);
                out.push_str("$'");
                for c in s.chars() {
                    match c {
                        '\\' => out.push_str("\\\\"),
                        '\'' => out.push_str("\\'"),
                        '\0' => {}
                        c if (c as u32) < 0x20 || c == '\u{7f}' => {
                            let _ = write!(out, "\\{:03o}", c as u32);
                        }
                        c => out.push(c),
                    }
                }
                out.push('\'');
                out
            }
            Format::R => {
                let mut out = String::with_capacity(s.len() + 2);
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\0' => {}
                        c if c == ' ' || c.is_ascii_graphic() => out.push(c),
                        c => {
                            let _ = write!(out, "\\U{{{:x}}}", c as u32);
                        }
                    }
                }
                out.push('"');
                out
            }
        }
    }
}

fn json(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A placeholder's value.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Text(&'a str),
    Number(u64),
}

/// Whether a placeholder holds text (which must be quoted) or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Number,
}

/// Placeholders of a bootstrap and of `init` lines.
pub const SESSION_VARS: &[(&str, Kind)] = &[
    ("nonce", Kind::Text),
    ("prompt", Kind::Text),
    ("continuation", Kind::Text),
    ("ctl", Kind::Text),
    ("work", Kind::Text),
    ("out", Kind::Text),
    ("cwd", Kind::Text),
    ("cell_file", Kind::Text),
    ("interrupt_file", Kind::Text),
    ("input_file", Kind::Text),
    ("sync_base", Kind::Number),
    ("max_images", Kind::Number),
];

/// Placeholders of an export's setup code: the answers typed into the exported cells.
pub const SETUP_VARS: &[(&str, Kind)] = &[("answers", Kind::Text)];

/// Placeholders of the `eval` line.
pub const EVAL_VARS: &[(&str, Kind)] = &[("n", Kind::Number), ("cell", Kind::Text)];

/// The values of [`SESSION_VARS`] for one session.
#[derive(Debug, Clone)]
pub struct SessionValues {
    pub nonce: String,
    /// The prompt and continuation prompt, with the nonce in them (empty: none).
    pub prompt: String,
    pub continuation: String,
    pub ctl: String,
    pub work: String,
    pub out: String,
    pub cwd: String,
    /// The cell file name with `{n}` in it (`cell-{n}.py`).
    pub cell_file: String,
    pub max_images: u64,
}

impl SessionValues {
    fn vars(&self) -> [(&str, Value<'_>); 12] {
        [
            ("nonce", Value::Text(&self.nonce)),
            ("prompt", Value::Text(&self.prompt)),
            ("continuation", Value::Text(&self.continuation)),
            ("ctl", Value::Text(&self.ctl)),
            ("work", Value::Text(&self.work)),
            ("out", Value::Text(&self.out)),
            ("cwd", Value::Text(&self.cwd)),
            ("cell_file", Value::Text(&self.cell_file)),
            ("interrupt_file", Value::Text(INTERRUPT_FILE)),
            ("input_file", Value::Text(INPUT_FILE)),
            ("sync_base", Value::Number(SYNC_BASE)),
            ("max_images", Value::Number(self.max_images)),
        ]
    }

    /// Expand a bootstrap or an `init` line.
    pub fn expand(&self, source: &str) -> String {
        expand_source(source, &self.vars())
    }
}

/// One `{name}` or `{name:format}` in a text, by byte range.
struct Placeholder<'t> {
    start: usize,
    end: usize,
    name: &'t str,
    format: Option<&'t str>,
}

/// Every well-formed placeholder of `text`, in order (`{` followed by an identifier, an
/// optional `:` and lower-case format name, and `}`).
fn placeholders(text: &str) -> Vec<Placeholder<'_>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = memchr::memchr(b'{', &bytes[i..]) {
        let start = i + off;
        i = start + 1;
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let name_end = start + 1 + bytes[start + 1..].iter().take_while(|b| ident(**b)).count();
        if name_end == start + 1 || bytes[start + 1].is_ascii_digit() {
            continue;
        }
        let (format, close) = if bytes.get(name_end) == Some(&b':') {
            let f_end = name_end
                + 1
                + bytes[name_end + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_lowercase())
                    .count();
            if f_end == name_end + 1 {
                continue;
            }
            (Some(&text[name_end + 1..f_end]), f_end)
        } else {
            (None, name_end)
        };
        if bytes.get(close) != Some(&b'}') {
            continue;
        }
        out.push(Placeholder {
            start,
            end: close + 1,
            name: &text[start + 1..name_end],
            format,
        });
        i = close + 1;
    }
    out
}

/// Expand the placeholders of source text. Text values are written only in the literal
/// form a placeholder asks for; a bare text placeholder (which [`check_source`] refuses)
/// and unknown names or formats are left as they are.
pub fn expand_source(text: &str, vars: &[(&str, Value<'_>)]) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut last = 0;
    for p in placeholders(text) {
        let Some((_, value)) = vars.iter().find(|(n, _)| *n == p.name) else {
            continue;
        };
        let rendered = match (value, p.format.map(Format::parse)) {
            (Value::Number(n), None | Some(Some(_))) => n.to_string(),
            (Value::Text(s), Some(Some(f))) => f.quote(s),
            _ => continue,
        };
        out.push_str(&text[last..p.start]);
        out.push_str(&rendered);
        last = p.end;
    }
    out.push_str(&text[last..]);
    out
}

/// A placeholder a language's source may not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceholderError {
    #[error(
        "{{{name}:{format}}}: unknown literal format {format:?} (known: {})",
        Format::NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
    )]
    UnknownFormat { name: String, format: String },
    /// A text placeholder without a literal format.
    #[error(
        "{{{0}}} is text spliced into code: write it as a literal, {{{0}:json}} (Python, \
         JavaScript), {{{0}:ruby}}, {{{0}:haskell}}, {{{0}:shell}} or {{{0}:r}}"
    )]
    Bare(String),
    /// A name this source does not have, with a known format (`known`: the names it has).
    #[error(
        "{{{name}:{format}}}: unknown placeholder {name:?} (known here: {})",
        if .known.is_empty() { "none".to_string() } else { .known.join(", ") }
    )]
    UnknownName {
        name: String,
        format: String,
        known: Vec<String>,
    },
}

/// Check source text against the placeholders it may use: a known name with an unknown
/// format, a bare text placeholder, or an unknown name with a known format (a misspelt
/// placeholder) is an error.
pub fn check_source(text: &str, vars: &[(&str, Kind)]) -> Result<(), PlaceholderError> {
    for p in placeholders(text) {
        let known = vars.iter().find(|(n, _)| *n == p.name);
        match (known, p.format) {
            (Some(_), Some(f)) if Format::parse(f).is_none() => {
                return Err(PlaceholderError::UnknownFormat {
                    name: p.name.to_string(),
                    format: f.to_string(),
                });
            }
            (Some((name, Kind::Text)), None) => {
                return Err(PlaceholderError::Bare(name.to_string()));
            }
            (None, Some(f)) if Format::parse(f).is_some() => {
                return Err(PlaceholderError::UnknownName {
                    name: p.name.to_string(),
                    format: f.to_string(),
                    known: vars.iter().map(|(n, _)| n.to_string()).collect(),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NASTY: &str = "a'b\"c\nd'''e\"\"\"f`g`$(h){nonce}#{i}#$j\\k\u{1b}\u{7f}é✓日本 9";

    #[test]
    fn formats_quote_and_stay_on_one_line() {
        assert_eq!(Format::Json.quote("a\"b\\c\n"), r#""a\"b\\c\n""#);
        assert_eq!(Format::Ruby.quote("#{x}"), r#""\u0023{x}""#);
        assert_eq!(
            Format::Haskell.quote("é1\u{1b}x\"\\"),
            r#""\233\&1\27x\"\\""#
        );
        assert_eq!(Format::Shell.quote("it's\n\\\0"), r"$'it\'s\012\\'");
        assert_eq!(
            Format::R.quote("a\"\\\n\0é`$(x)"),
            r#""a\"\\\U{a}\U{e9}`$(x)""#
        );
        for (_, f) in Format::NAMES {
            let q = f.quote(NASTY);
            assert!(!q.contains('\n') && !q.contains('\r'), "{f:?}: {q}");
        }
        // The Ruby literal has no `#` left to interpolate with.
        assert!(!Format::Ruby.quote(NASTY).contains('#'));
    }

    #[test]
    fn expansion_quotes_text_and_is_one_pass() {
        let vars = [
            ("ctl", Value::Text("/w/{nonce}'x")),
            ("nonce", Value::Text("abc")),
            ("n", Value::Number(7)),
        ];
        assert_eq!(
            expand_source(
                "d = {ctl:json}; k = {nonce:shell}; n = {n}, {n:haskell}",
                &vars
            ),
            r#"d = "/w/{nonce}'x"; k = $'abc'; n = 7, 7"#
        );
        // Bare text, unknown names and formats, and braces of the language stay as they are.
        let t = "{ctl} {nope:json} {ctl:bogus} ${x} {} { n } {1} #{n}x";
        assert_eq!(
            expand_source(t, &vars),
            "{ctl} {nope:json} {ctl:bogus} ${x} {} { n } {1} #7x"
        );
    }

    #[test]
    fn checks_refuse_raw_text_and_misspellings() {
        let ok = "x = {ctl:json}\ny = {sync_base}\nz = `${a}` {a:b}{}\n{ {n} }";
        check_source(ok, SESSION_VARS).unwrap_or_else(|e| panic!("{e}"));
        for (bad, says) in [
            ("'{ctl}'", "{ctl} is text"),
            ("{ctl:python}", "unknown literal format"),
            ("{ctrl:json}", "unknown placeholder \"ctrl\""),
        ] {
            let e = check_source(bad, SESSION_VARS).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = check_source("run({cell})", EVAL_VARS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "{cell} is text spliced into code: write it as a literal, {cell:json} (Python, \
             JavaScript), {cell:ruby}, {cell:haskell}, {cell:shell} or {cell:r}"
        );
        let e = check_source("{nope:json}", EVAL_VARS)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "{{nope:json}}: unknown placeholder \"nope\" (known here: {})",
                EVAL_VARS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        );
        let e = check_source("{nope:json}", &[]).unwrap_err().to_string();
        assert_eq!(
            e,
            "{nope:json}: unknown placeholder \"nope\" (known here: none)"
        );
        check_source("run({n}, {cell:json})", EVAL_VARS).unwrap_or_else(|e| panic!("{e}"));
    }
}
