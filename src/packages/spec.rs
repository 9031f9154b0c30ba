//! A caller's package specifiers, checked before anything sees them: a PEP 508 requirement
//! (a name, extras, version clauses, environment markers). Nothing else passes: no URL, path, VCS
//! reference, option or second line, so a specifier cannot name another index, a local
//! file or an installer flag.

/// Most specifiers in one request.
pub const MAX_SPECS: usize = 64;
/// Longest specifier.
const MAX_LEN: usize = 200;

/// One checked specifier: as given (spaces trimmed), and its normalised name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Spec {
    /// The name, normalised (PEP 503 for Python: lower case, runs of `-_.` as `-`).
    pub name: String,
    /// The whole specifier as the installer gets it (no spaces but inside markers).
    pub text: String,
}

impl Spec {
    /// `name==VERSION` (extras allowed) and nothing else: one release, whatever the index
    /// says since, so what the cache holds of it is what the index would give.
    pub fn is_exact_pin(&self) -> bool {
        let Some((_, v)) = self.text.split_once("==") else {
            return false;
        };
        !v.is_empty()
            && !self.text.contains(';')
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_'))
    }
}

/// Check a request's specifiers for `eco`; sorted and without duplicates. The message says
/// which one is refused and what is accepted.
pub fn check(specs: &[String]) -> Result<Vec<Spec>, String> {
    if specs.len() > MAX_SPECS {
        return Err(format!(
            "packages: {} specifiers, more than {MAX_SPECS}; ask for fewer at once",
            specs.len()
        ));
    }
    let mut out = Vec::with_capacity(specs.len());
    for s in specs {
        let spec = python(s).map_err(|why| {
            let shown: String = s.chars().take(80).collect();
            format!(
                "packages: {shown:?} is not a package specifier: {why}. Give a name with \
                 optional extras and versions, as pip takes it (\"polars\", \
                 \"requests==2.32.*\", \"pandas[excel]>=2\")"
            )
        })?;
        if !out.contains(&spec) {
            out.push(spec);
        }
    }
    out.sort();
    Ok(out)
}

fn common(s: &str) -> Result<&str, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("it is empty".into());
    }
    if t.len() > MAX_LEN {
        return Err(format!("it is longer than {MAX_LEN} bytes"));
    }
    if t.starts_with('-') {
        return Err("options are not accepted".into());
    }
    if t.chars().any(|c| c.is_control()) {
        return Err("it holds a control character".into());
    }
    Ok(t)
}

/// PEP 503's normal form of a Python project name.
pub fn normalize_python(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// A PEP 508 requirement without a URL: `name[extras] clauses ; markers`.
fn python(s: &str) -> Result<Spec, String> {
    let t = common(s)?;
    let (req, marker) = match t.split_once(';') {
        Some((r, m)) => (r.trim(), Some(m.trim())),
        None => (t, None),
    };
    if req.contains('@') {
        return Err("direct references (name @ URL) are not accepted".into());
    }
    let name_end = req
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(req.len());
    let name = &req[..name_end];
    let ok_edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !ok_edge(name.chars().next()) || !ok_edge(name.chars().last()) {
        return Err("a name starts and ends with a letter or digit".into());
    }
    let mut rest = req[name_end..].trim_start();
    let mut text = name.to_string();
    if let Some(after) = rest.strip_prefix('[') {
        let (extras, tail) = after
            .split_once(']')
            .ok_or_else(|| "an extra's list is not closed with ]".to_string())?;
        let mut list = Vec::new();
        for e in extras.split(',').map(str::trim) {
            if e.is_empty()
                || !e
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(format!("{e:?} is not an extra's name"));
            }
            list.push(e);
        }
        text.push('[');
        text.push_str(&list.join(","));
        text.push(']');
        rest = tail.trim_start();
    }
    let rest = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or(rest)
        .trim();
    if !rest.is_empty() {
        let mut clauses = Vec::new();
        for clause in rest.split(',').map(str::trim) {
            clauses.push(version_clause(clause)?);
        }
        text.push_str(&clauses.join(","));
    }
    if let Some(m) = marker {
        marker_check(m)?;
        text.push_str("; ");
        text.push_str(m);
    }
    Ok(Spec {
        name: normalize_python(name),
        text,
    })
}

/// PEP 508's marker variables.
const MARKER_VARS: [&str; 13] = [
    "python_version",
    "python_full_version",
    "os_name",
    "sys_platform",
    "platform_release",
    "platform_system",
    "platform_version",
    "platform_machine",
    "platform_python_implementation",
    "implementation_name",
    "implementation_version",
    "extra",
    "platform.python_implementation",
];

/// An environment marker made only of PEP 508's tokens: its variables, quoted strings
/// without quotes or backslashes inside, comparison operators, `and`/`or`/`in`/`not` and
/// parentheses. The installer parses it; this keeps anything else from reaching it.
fn marker_check(m: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("its environment marker {why}"));
    if m.is_empty() {
        return bad("is empty");
    }
    let mut rest = m;
    while let Some(c) = rest.chars().next() {
        let len = if c == ' ' || c == '(' || c == ')' {
            1
        } else if c == '\'' || c == '"' {
            match rest[1..].find(c) {
                Some(end) if !rest[1..1 + end].contains(['\\', '\'', '"']) => end + 2,
                _ => return bad("has a string that is not closed"),
            }
        } else if "<>=!~".contains(c) {
            rest.find(|c: char| !"<>=!~".contains(c))
                .unwrap_or(rest.len())
        } else if c.is_ascii_alphabetic() {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .unwrap_or(rest.len());
            let word = &rest[..end];
            if !MARKER_VARS.contains(&word) && !["and", "or", "in", "not"].contains(&word) {
                return bad(&format!("names {word:?}, which is not a marker variable"));
            }
            end
        } else {
            return bad(&format!("holds {c:?}, which markers never do"));
        };
        if c != '\'' && c != '"' && "<>=!~".contains(c) {
            let op = &rest[..len];
            if !["<", ">", "<=", ">=", "==", "!=", "~=", "==="].contains(&op) {
                return bad(&format!("has {op:?}, which is not a comparison"));
            }
        }
        rest = &rest[len..];
    }
    Ok(())
}

/// One version clause (`>=2.0`, `==2.32.*`), without spaces.
fn version_clause(c: &str) -> Result<String, String> {
    const OPS: [&str; 8] = ["===", "~=", "==", "!=", "<=", ">=", "<", ">"];
    let op = OPS
        .iter()
        .find(|op| c.starts_with(*op))
        .ok_or_else(|| format!("{c:?} is not a version clause (==, >=, ~=, …)"))?;
    let v = c[op.len()..].trim();
    if v.is_empty()
        || !v
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '*' | '+' | '!' | '-' | '_'))
    {
        return Err(format!("{v:?} is not a version"));
    }
    Ok(format!("{op}{v}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(s: &str) -> Result<String, String> {
        python(s).map(|s| s.text)
    }

    #[test]
    fn python_requirements_pass_normalised() {
        assert_eq!(py("polars").unwrap(), "polars");
        assert_eq!(py(" requests == 2.32.* ").unwrap(), "requests==2.32.*");
        assert_eq!(
            py("pandas[excel, xml]>=2,<3").unwrap(),
            "pandas[excel,xml]>=2,<3"
        );
        assert_eq!(py("six (>=1.0)").unwrap(), "six>=1.0");
        assert_eq!(
            py("six; (python_version >= '3.8' and sys_platform == \"linux\") or extra == 'x'")
                .unwrap(),
            "six; (python_version >= '3.8' and sys_platform == \"linux\") or extra == 'x'"
        );
        assert_eq!(
            py("tomli; python_version < \"3.11\"").unwrap(),
            "tomli; python_version < \"3.11\""
        );
        assert_eq!(
            python("Typing_Extensions").unwrap().name,
            "typing-extensions"
        );
    }

    #[test]
    fn python_refuses_what_is_not_a_registry_requirement() {
        for bad in [
            "",
            "-r reqs.txt",
            "--index-url=https://evil/simple",
            "pkg @ https://evil/pkg.whl",
            "pkg@file:///etc",
            "./local",
            "/abs/path",
            "git+https://x/y",
            "six\n--index-url https://evil",
            "six==1.0 --hash=sha256:00",
            "six>=1; os.system('x')",
            "six; python_version < '3' or __import__('os')",
            "six; python_version < \"3\\\"\"",
            "six; python_version <<< '3'",
            "six[a b]",
            "six~1",
            &"a".repeat(300),
        ] {
            assert!(py(bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn exact_pins_are_told_from_ranges() {
        let pin = |s: &str| check(&[s.to_string()]).unwrap()[0].is_exact_pin();
        assert!(pin("six==1.17.0"));
        assert!(pin("pandas[excel]==2.2.1"));
        for not in [
            "six",
            "six==1.*",
            "six>=1",
            "six==1.0,<2",
            "six===1.0",
            "six==1; python_version > '3'",
        ] {
            assert!(!pin(not), "{not}");
        }
    }

    #[test]
    fn a_request_is_sorted_and_deduplicated() {
        let specs = check(&["six".into(), "iniconfig".into(), "six".into()]).unwrap();
        let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["iniconfig", "six"]);
        let many: Vec<String> = (0..=MAX_SPECS).map(|i| format!("p{i}")).collect();
        assert!(check(&many).is_err());
    }
}
