//! How text values are written into a bootstrap as literals of the language
//! (`lang::protocol::Format::quote`): directory names and the nonce, never spliced as code.
//!
//! Properties: no literal spans lines; each one reads back as the original text (JSON and
//! Ruby through a JSON parser, Shell, Haskell and R through decoders of their escapes; Shell
//! and R without NULs, which their strings cannot hold); a Ruby literal holds no `#` (no
//! interpolation); Haskell and R literals are ASCII.

use replbox::fuzzing::Format;

/// Bash's `$'…'` as `Format::Shell` writes it: `\\`, `\'` and three-digit octal escapes.
fn unshell(q: &str) -> Option<String> {
    let inner = q.strip_prefix("$'")?.strip_suffix('\'')?;
    let mut out = Vec::new();
    let b = inner.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => {
                let next = *b.get(i + 1)?;
                if next.is_ascii_digit() {
                    let oct = std::str::from_utf8(b.get(i + 1..i + 4)?).ok()?;
                    out.push(u8::from_str_radix(oct, 8).ok()?);
                    i += 4;
                } else {
                    out.push(next);
                    i += 2;
                }
            }
            b'\'' => return None, // an unescaped quote would end the literal
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A Haskell string literal as `Format::Haskell` writes it: `\"`, `\\`, decimal escapes,
/// and `\&` (empty) after a decimal escape followed by a digit.
fn unhaskell(q: &str) -> Option<String> {
    let inner = q.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                '&' => {}
                d if d.is_ascii_digit() => {
                    let mut n = d.to_digit(10)?;
                    while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                        n = n.checked_mul(10)?.checked_add(d)?;
                        chars.next();
                    }
                    out.push(char::from_u32(n)?);
                }
                _ => return None,
            },
            '"' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// An R string literal as `Format::R` writes it: `\"`, `\\` and `\U{hex}`.
fn unr(q: &str) -> Option<String> {
    let inner = q.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                'U' => {
                    if chars.next()? != '{' {
                        return None;
                    }
                    let hex: String = chars.by_ref().take_while(|c| *c != '}').collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                _ => return None,
            },
            '"' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// Check one input (libFuzzer's, or a corpus file's).
pub fn run(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    for (name, f) in Format::NAMES {
        let q = f.quote(s);
        assert!(!q.contains('\n') && !q.contains('\r'), "{name}: {q:?}");
        let back = match f {
            Format::Json | Format::Ruby => serde_json::from_str::<String>(&q).ok(),
            Format::Shell => unshell(&q),
            Format::Haskell => unhaskell(&q),
            Format::R => unr(&q),
        };
        let want = match f {
            Format::Shell | Format::R => s.replace('\0', ""),
            _ => s.to_string(),
        };
        assert_eq!(back.as_deref(), Some(want.as_str()), "{name}: {q:?}");
    }
    assert!(!Format::Ruby.quote(s).contains('#'));
    assert!(Format::Haskell.quote(s).is_ascii());
    assert!(Format::R.quote(s).is_ascii());
}
