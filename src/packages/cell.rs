//! Packages asked for in a cell's own code: `%pip install` lines at the top of a Python
//! cell, `await replbox.install(...)` lines at the top of a JavaScript one. Only the
//! specifiers are taken out, as plain words or string literals; what they ask for is
//! checked and installed like any request's `packages`.

/// A `replbox.install` line that is not made of plain string literals: the caller's to
/// write again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "replbox.install: {line:?} is not a call with string literals; write it on a \
     line of its own at the top of the cell, as \
     await replbox.install('lodash', 'is-odd@3')"
)]
pub struct InstallLineError {
    /// The line's first 80 characters.
    pub line: String,
}

impl From<InstallLineError> for crate::error::ToolError {
    fn from(e: InstallLineError) -> Self {
        Self::invalid(e.to_string())
    }
}

/// `%pip install ...` / `!pip install ...` lines at the top of a Python cell: the
/// specifiers they ask for and the rest of the cell (None when the cell has none).
/// Options are refused as specifiers are (only names and versions are accepted).
pub fn pip_lines(code: &str) -> Option<(Vec<String>, String)> {
    let mut specs = Vec::new();
    let mut rest_at = 0;
    let mut any = false;
    for line in code.split_inclusive('\n') {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            rest_at += line.len();
            continue;
        }
        // Quoted as a shell would take them (`%pip install "pandas>=2"`); a line that
        // does not split is passed on whole, to be refused as a specifier.
        let owned = shlex::split(t).unwrap_or_else(|| vec![t.to_string()]);
        let words: Vec<&str> = owned.iter().map(String::as_str).collect();
        let is_pip = matches!(
            words.as_slice(),
            ["%pip" | "!pip" | "!pip3" | "%pip3", "install", ..]
                | ["!python" | "!python3", "-m", "pip", "install", ..]
        );
        if !is_pip {
            break;
        }
        any = true;
        let skip = if words[0].starts_with("!python") {
            4
        } else {
            2
        };
        // `-q`/`--quiet` and `-U`/`--upgrade` mean nothing here; any other option is
        // passed on as a specifier, to be refused by name.
        specs.extend(
            words[skip..]
                .iter()
                .filter(|w| !matches!(**w, "-q" | "--quiet" | "-U" | "--upgrade"))
                .map(|w| w.to_string()),
        );
        rest_at += line.len();
    }
    any.then(|| (specs, code[rest_at..].to_string()))
}

/// `await replbox.install('a', "b@1")` lines at the top of a JavaScript cell (also with the
/// names in one array, without `await`, with a `;`): the specifiers and the rest of the
/// cell; None when the cell starts with none. A line that starts as one but is not made of
/// plain string literals is an error saying how to write it.
pub fn js_install_lines(code: &str) -> Option<Result<(Vec<String>, String), InstallLineError>> {
    let mut specs = Vec::new();
    let mut rest_at = 0;
    let mut any = false;
    for line in code.split_inclusive('\n') {
        let t = line.trim();
        if t.is_empty() || t.starts_with("//") {
            rest_at += line.len();
            continue;
        }
        let call = t.strip_prefix("await").map(str::trim_start).unwrap_or(t);
        let Some(args) = call.strip_prefix("replbox.install") else {
            break;
        };
        any = true;
        match js_string_args(args) {
            Some(names) => specs.extend(names),
            None => {
                return Some(Err(InstallLineError {
                    line: t.chars().take(80).collect(),
                }));
            }
        }
        rest_at += line.len();
    }
    any.then(|| Ok((specs, code[rest_at..].to_string())))
}

/// `('a', "b")`, `(['a', 'b'])` (a trailing `;` allowed): the strings, when they are plain
/// literals (no escapes, no `${}`); None otherwise.
fn js_string_args(s: &str) -> Option<Vec<String>> {
    let s = s.trim_start().strip_prefix('(')?;
    let s = s.trim_end();
    let s = s
        .strip_suffix(';')
        .unwrap_or(s)
        .trim_end()
        .strip_suffix(')')?;
    let mut inner = s.trim();
    if let Some(list) = inner.strip_prefix('[') {
        inner = list.strip_suffix(']')?.trim();
    }
    let mut out = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let q = rest.chars().next()?;
        if !matches!(q, '\'' | '"' | '`') {
            return None;
        }
        let end = rest[1..].find(q)? + 1;
        let lit = &rest[1..end];
        if lit.contains('\\') || lit.contains("${") {
            return None;
        }
        out.push(lit.to_string());
        rest = rest[end + 1..].trim_start();
        match rest.strip_prefix(',') {
            Some(r) => rest = r.trim_start(),
            None if rest.is_empty() => {}
            None => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_lines_are_found_at_the_top_of_a_cell_only() {
        assert_eq!(
            pip_lines("%pip install six tomli\nimport six\n"),
            Some((vec!["six".into(), "tomli".into()], "import six\n".into()))
        );
        assert_eq!(
            pip_lines("!pip install -q six\n"),
            Some((vec!["six".into()], String::new()))
        );
        assert_eq!(
            pip_lines("!pip install --index-url=https://evil six").map(|p| p.0),
            Some(vec!["--index-url=https://evil".into(), "six".into()])
        );
        assert_eq!(
            pip_lines("%pip install \"six>=1\" 'tomli; python_version < \"3.11\"'\n").map(|p| p.0),
            Some(vec![
                "six>=1".into(),
                "tomli; python_version < \"3.11\"".into()
            ])
        );
        assert_eq!(pip_lines("import six\n%pip install six"), None);
    }

    #[test]
    fn js_install_lines_take_string_literals_only() {
        assert_eq!(
            js_install_lines(
                "await replbox.install('is-odd', \"lodash@^4\");\nrequire('is-odd')(3)\n"
            ),
            Some(Ok((
                vec!["is-odd".into(), "lodash@^4".into()],
                "require('is-odd')(3)\n".into()
            )))
        );
        assert_eq!(
            js_install_lines("// deps\nreplbox.install(['a', `b`,])\n").map(|r| r.map(|p| p.0)),
            Some(Ok(vec!["a".into(), "b".into()]))
        );
        for bad in [
            "await replbox.install(name)",
            "await replbox.install('a' + x)",
            "await replbox.install(`${x}`)",
            "await replbox.install('a\\'b')",
            "await replbox.install('a'); require('fs')",
            "await replbox.installX('a')",
        ] {
            assert!(
                matches!(js_install_lines(bad), Some(Err(_))),
                "{bad:?}: {:?}",
                js_install_lines(bad)
            );
        }
        assert_eq!(
            js_install_lines("const x = 1;\nawait replbox.install('a')"),
            None
        );
        assert_eq!(js_install_lines("console.log('replbox.install')"), None);
        assert_eq!(
            js_install_lines("await replbox.install(name)")
                .and_then(Result::err)
                .map(|e| e.to_string())
                .as_deref(),
            Some(
                "replbox.install: \"await replbox.install(name)\" is not a call with string \
                 literals; write it on a line of its own at the top of the cell, as await \
                 replbox.install('lodash', 'is-odd@3')"
            )
        );
        assert_eq!(pip_lines("print('%pip install six')"), None);
    }
}
