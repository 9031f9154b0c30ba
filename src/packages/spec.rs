//! A caller's package specifiers, checked before anything sees them: for Python a PEP 508
//! requirement (a name, extras, version clauses, environment markers), for JavaScript an
//! npm registry specifier (a name, optionally `@` a version range or tag). Nothing else
//! passes: no URL, path, VCS reference, tarball, alias, option or second line, so a
//! specifier cannot name another index, a local file, a repository or an installer flag.

/// Most specifiers in one request.
pub const MAX_SPECS: usize = 64;
/// Longest specifier.
const MAX_LEN: usize = 200;

/// Whose packages: which installer and which rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Eco {
    /// PyPI's (uv).
    Python,
    /// npm's (npm).
    Npm,
}

impl Eco {
    /// The ecosystem of a language's `packages`, if it has one.
    pub fn of(language: &str) -> Option<Self> {
        match language {
            "python" => Some(Self::Python),
            "javascript" => Some(Self::Npm),
            _ => None,
        }
    }
}

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

impl Spec {
    /// npm's `name@X.Y.Z` (a prerelease or build allowed) and nothing else: one release.
    pub fn is_exact_npm(&self) -> bool {
        let Some((_, v)) = self.text.rsplit_once('@').filter(|(n, _)| !n.is_empty()) else {
            return false;
        };
        let (core, _) = v.split_once(['-', '+']).unwrap_or((v, ""));
        let parts: Vec<&str> = core.split('.').collect();
        parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
    }
}

/// A request's specifiers refused: the caller's to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("packages: {count} specifiers, more than {MAX_SPECS}; ask for fewer at once")]
    TooMany { count: usize },
    /// One specifier (its first 80 characters shown), and why.
    #[error("packages: {shown:?} is not a package specifier: {why}. Give {}", accepted(*.eco))]
    Refused { shown: String, eco: Eco, why: Why },
}

/// What a specifier of `eco` may be, for the message refusing one.
fn accepted(eco: Eco) -> &'static str {
    match eco {
        Eco::Python => {
            "a name with optional extras and versions, as pip takes it (\"polars\", \
             \"requests==2.32.*\", \"pandas[excel]>=2\")"
        }
        Eco::Npm => {
            "a registry package's name, optionally @ a version range or tag \
             (\"lodash\", \"lodash@^4.17\", \"@types/node@20\")"
        }
    }
}

/// Why one specifier is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Why {
    #[error("it is empty")]
    Empty,
    #[error("it is longer than {MAX_LEN} bytes")]
    TooLong,
    #[error("options are not accepted")]
    Option,
    #[error("it holds a control character")]
    Control,
    #[error("direct references (name @ URL) are not accepted")]
    DirectReference,
    #[error("a name starts and ends with a letter or digit")]
    NameEdge,
    #[error("an extra's list is not closed with ]")]
    ExtrasNotClosed,
    #[error("{0:?} is not an extra's name")]
    Extra(String),
    #[error("{0:?} is not a version clause (==, >=, ~=, …)")]
    Clause(String),
    #[error("{0:?} is not a version")]
    Version(String),
    #[error("its environment marker {0}")]
    Marker(Marker),
    #[error("a scoped name is @scope/name")]
    Scope,
    /// A scope's or a name's segment (which one).
    #[error("a {0} is letters, digits, - _ and ., starting with a letter or digit")]
    Word(&'static str),
    #[error("a name is at most {NPM_NAME_MAX} bytes")]
    NameTooLong,
    #[error("tarballs are not accepted")]
    Tarball,
    #[error("nothing follows the @ (give a version range or tag)")]
    EmptyRange,
    #[error("paths are not accepted")]
    Path,
    #[error("{0:?} is not a version range or tag (URLs, paths, git and aliases are not accepted)")]
    Range(String),
}

/// What is wrong with an environment marker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Marker {
    #[error("is empty")]
    Empty,
    #[error("has a string that is not closed")]
    Unclosed,
    #[error("names {0:?}, which is not a marker variable")]
    Variable(String),
    #[error("holds {0:?}, which markers never do")]
    Char(char),
    #[error("has {0:?}, which is not a comparison")]
    Operator(String),
}

/// Check a request's specifiers for `eco`; sorted and without duplicates. The error says
/// which one is refused and what is accepted.
pub fn check(eco: Eco, specs: &[String]) -> Result<Vec<Spec>, SpecError> {
    if specs.len() > MAX_SPECS {
        return Err(SpecError::TooMany { count: specs.len() });
    }
    let mut out = Vec::with_capacity(specs.len());
    for s in specs {
        let parsed = match eco {
            Eco::Python => python(s),
            Eco::Npm => npm(s),
        };
        let spec = parsed.map_err(|why| SpecError::Refused {
            shown: s.chars().take(80).collect(),
            eco,
            why,
        })?;
        if !out.contains(&spec) {
            out.push(spec);
        }
    }
    out.sort();
    Ok(out)
}

fn common(s: &str) -> Result<&str, Why> {
    let t = s.trim();
    if t.is_empty() {
        return Err(Why::Empty);
    }
    if t.len() > MAX_LEN {
        return Err(Why::TooLong);
    }
    if t.starts_with('-') {
        return Err(Why::Option);
    }
    if t.chars().any(|c| c.is_control()) {
        return Err(Why::Control);
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
fn python(s: &str) -> Result<Spec, Why> {
    let t = common(s)?;
    let (req, marker) = match t.split_once(';') {
        Some((r, m)) => (r.trim(), Some(m.trim())),
        None => (t, None),
    };
    if req.contains('@') {
        return Err(Why::DirectReference);
    }
    let name_end = req
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(req.len());
    let name = &req[..name_end];
    let ok_edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !ok_edge(name.chars().next()) || !ok_edge(name.chars().last()) {
        return Err(Why::NameEdge);
    }
    let mut rest = req[name_end..].trim_start();
    let mut text = name.to_string();
    if let Some(after) = rest.strip_prefix('[') {
        let (extras, tail) = after.split_once(']').ok_or(Why::ExtrasNotClosed)?;
        let mut list = Vec::new();
        for e in extras.split(',').map(str::trim) {
            if e.is_empty()
                || !e
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(Why::Extra(e.into()));
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
fn marker_check(m: &str) -> Result<(), Why> {
    let bad = |why: Marker| Err(Why::Marker(why));
    if m.is_empty() {
        return bad(Marker::Empty);
    }
    let mut rest = m;
    while let Some(c) = rest.chars().next() {
        let len = if c == ' ' || c == '(' || c == ')' {
            1
        } else if c == '\'' || c == '"' {
            match rest[1..].find(c) {
                Some(end) if !rest[1..1 + end].contains(['\\', '\'', '"']) => end + 2,
                _ => return bad(Marker::Unclosed),
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
                return bad(Marker::Variable(word.into()));
            }
            end
        } else {
            return bad(Marker::Char(c));
        };
        if c != '\'' && c != '"' && "<>=!~".contains(c) {
            let op = &rest[..len];
            if !["<", ">", "<=", ">=", "==", "!=", "~=", "==="].contains(&op) {
                return bad(Marker::Operator(op.into()));
            }
        }
        rest = &rest[len..];
    }
    Ok(())
}

/// Longest npm package name (npm's own limit).
const NPM_NAME_MAX: usize = 214;

/// An npm registry specifier: `name`, `@scope/name`, either optionally followed by `@` and
/// a semver range or a dist-tag. Refused: anything npm would take for a URL, a git or
/// GitHub reference (`user/repo`, `github:`), a path (`.`, `/`, `~/`), a tarball
/// (`*.tgz`), an alias (`npm:`) or an option.
fn npm(s: &str) -> Result<Spec, Why> {
    let t = common(s)?;
    let (scope, rest) = match t.strip_prefix('@') {
        Some(r) => {
            let (scope, after) = r.split_once('/').ok_or(Why::Scope)?;
            npm_word(scope, "scope")?;
            (Some(scope), after)
        }
        None => (None, t),
    };
    let (name, range) = match rest.split_once('@') {
        Some((n, r)) => (n, Some(r)),
        None => (rest, None),
    };
    npm_word(name, "name")?;
    let full = match scope {
        Some(sc) => format!("@{sc}/{name}"),
        None => name.to_string(),
    };
    if full.len() > NPM_NAME_MAX {
        return Err(Why::NameTooLong);
    }
    let lower = full.to_ascii_lowercase();
    if [".tgz", ".tar", ".tar.gz"]
        .iter()
        .any(|x| lower.ends_with(x))
    {
        return Err(Why::Tarball);
    }
    let mut text = full.clone();
    if let Some(r) = range {
        let r = r.trim();
        if r.is_empty() {
            return Err(Why::EmptyRange);
        }
        if r.starts_with('.') {
            return Err(Why::Path);
        }
        if !r.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    '.' | '+' | '-' | '*' | '^' | '~' | '<' | '>' | '=' | '|' | ' '
                )
        }) {
            return Err(Why::Range(r.into()));
        }
        text.push('@');
        text.push_str(r);
    }
    Ok(Spec { name: full, text })
}

/// A scope or a package name's one segment: URL-safe characters npm accepts, starting
/// with a letter or digit (never `.`, `_` or `-`: paths and options).
fn npm_word(w: &str, what: &'static str) -> Result<(), Why> {
    let first_ok = w.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok
        || !w
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(Why::Word(what));
    }
    Ok(())
}

/// One version clause (`>=2.0`, `==2.32.*`), without spaces.
fn version_clause(c: &str) -> Result<String, Why> {
    const OPS: [&str; 8] = ["===", "~=", "==", "!=", "<=", ">=", "<", ">"];
    let op = OPS
        .iter()
        .find(|op| c.starts_with(*op))
        .ok_or_else(|| Why::Clause(c.into()))?;
    let v = c[op.len()..].trim();
    if v.is_empty()
        || !v
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '*' | '+' | '!' | '-' | '_'))
    {
        return Err(Why::Version(v.into()));
    }
    Ok(format!("{op}{v}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(s: &str) -> Result<String, Why> {
        python(s).map(|s| s.text)
    }

    #[test]
    fn refusals_name_the_specifier_why_and_what_is_accepted() {
        let e = check(Eco::Python, &["six; os.system".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "packages: \"six; os.system\" is not a package specifier: its environment marker \
             names \"os.system\", which is not a marker variable. Give a name with optional \
             extras and versions, as pip takes it (\"polars\", \"requests==2.32.*\", \
             \"pandas[excel]>=2\")"
        );
        let e = check(Eco::Npm, &["lodash@http://x".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "packages: \"lodash@http://x\" is not a package specifier: \"http://x\" is not a \
             version range or tag (URLs, paths, git and aliases are not accepted). Give a \
             registry package's name, optionally @ a version range or tag (\"lodash\", \
             \"lodash@^4.17\", \"@types/node@20\")"
        );
        let many: Vec<String> = (0..=MAX_SPECS).map(|i| format!("p{i}")).collect();
        assert_eq!(
            check(Eco::Python, &many).unwrap_err().to_string(),
            format!(
                "packages: {} specifiers, more than {MAX_SPECS}; ask for fewer at once",
                MAX_SPECS + 1
            )
        );
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
        let pin = |s: &str| check(Eco::Python, &[s.to_string()]).unwrap()[0].is_exact_pin();
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
        let specs = check(
            Eco::Python,
            &["six".into(), "iniconfig".into(), "six".into()],
        )
        .unwrap();
        let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["iniconfig", "six"]);
        let many: Vec<String> = (0..=MAX_SPECS).map(|i| format!("p{i}")).collect();
        assert!(check(Eco::Python, &many).is_err());
        assert!(check(Eco::Npm, &many).is_err());
    }

    #[test]
    fn npm_registry_specifiers_pass() {
        let js = |s: &str| npm(s).map(|s| s.text);
        assert_eq!(js("is-odd").unwrap(), "is-odd");
        assert_eq!(js(" lodash@^4.17.21 ").unwrap(), "lodash@^4.17.21");
        assert_eq!(js("@types/node@20").unwrap(), "@types/node@20");
        assert_eq!(
            js("react@>=18 <19 || 17.x").unwrap(),
            "react@>=18 <19 || 17.x"
        );
        assert_eq!(js("JSONStream@latest").unwrap(), "JSONStream@latest");
        assert_eq!(npm("@scope/x@1").unwrap().name, "@scope/x");
        let exact = |s: &str| npm(s).unwrap().is_exact_npm();
        assert!(exact("is-odd@3.0.1") && exact("@s/x@1.2.3-rc.1"));
        assert!(!exact("is-odd") && !exact("is-odd@3") && !exact("is-odd@^3.0.1"));
        assert!(!exact("@s/x") && !exact("x@1.2.3 || 2"));
    }

    #[test]
    fn npm_refuses_what_is_not_a_registry_package() {
        for bad in [
            "",
            "-g",
            "--registry=https://evil/",
            "https://evil/x.tgz",
            "http://evil/x",
            "git+https://github.com/a/b",
            "git://github.com/a/b",
            "github:a/b",
            "a/b",
            "a/b#main",
            "x@github:a/b",
            "x@git+ssh://git@github.com/a/b",
            "x@https://evil/x.tgz",
            "x@file:../x",
            "file:../x",
            "x@./x",
            "x@../x",
            "x@/etc",
            "x@~/x",
            "./x",
            "../x",
            "/etc",
            "~/x",
            ".x",
            "_x",
            "x.tgz",
            "x.tar.gz",
            "x@npm:evil",
            "alias@npm:lodash@4",
            "@scope",
            "@/x",
            "@scope/",
            "@sc ope/x",
            "x@",
            "x@1\n--registry=https://evil/",
            "x@1;rm",
            "x@$(id)",
            "x@`id`",
            "x#main",
            "x y",
            "@a/b/c",
            &"a".repeat(215),
        ] {
            assert!(npm(bad).is_err(), "{bad:?} passed");
        }
    }
}
