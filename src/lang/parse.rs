//! Reading one language: its `language.toml` and the files it names, validated so that every
//! error names the file and the field.

use std::path::Path;

use super::LANGUAGE_FILE;
use super::protocol;
use super::spec::{LangSpec, NotebookSpec, PoolSpec, SessionSpec, Source};

/// Where the files a language file names are read from.
#[derive(Debug, Clone, Copy)]
pub enum Folder<'a> {
    /// A folder built into the binary.
    Builtin(&'a [(&'a str, &'a str)]),
    /// A folder of `--prompts DIR`.
    Dir(&'a Path),
    /// A lone `NAME.toml` in `--prompts DIR`: a language without files of its own.
    None,
}

/// Why a file a language names could not be read from its folder.
#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error("{0:?} is not a plain file name of the folder")]
    NotPlain(String),
    #[error("no file {0:?} in the folder")]
    NoFile(String),
    #[error("{}: {error}", .path.display())]
    Read {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error(
        "names the file {0:?}, but a single-file language has no folder: move the TOML to \
         <id>/{LANGUAGE_FILE} beside {0:?}"
    )]
    NoFolder(String),
}

impl Folder<'_> {
    fn read(&self, name: &str) -> Result<String, FolderError> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') || name == LANGUAGE_FILE {
            return Err(FolderError::NotPlain(name.into()));
        }
        match self {
            Folder::Builtin(files) => files
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t.to_string())
                .ok_or_else(|| FolderError::NoFile(name.into())),
            Folder::Dir(dir) => {
                let path = dir.join(name);
                std::fs::read_to_string(&path).map_err(|error| FolderError::Read { path, error })
            }
            Folder::None => Err(FolderError::NoFolder(name.into())),
        }
    }
}

pub(super) fn check_folder_name(origin: &str, folder: &str, spec: &LangSpec) -> anyhow::Result<()> {
    if folder != spec.id {
        anyhow::bail!(
            "{origin}: field `id`: {:?} must be the name of its folder ({folder:?})",
            spec.id
        );
    }
    Ok(())
}

/// Parse and validate one language file, reading the files it names from `folder`; errors
/// name the file and the field.
pub fn parse_spec(origin: &str, text: &str, folder: Folder<'_>) -> anyhow::Result<LangSpec> {
    let mut spec: LangSpec =
        toml::from_str(text).map_err(|e| anyhow::anyhow!("{origin}: {}", e.to_string().trim()))?;
    let bad = |field: &str, why: &str| anyhow::anyhow!("{origin}: field `{field}`: {why}");
    let load = |field: &str, source: &mut Source| {
        source.text = folder
            .read(&source.file)
            .map_err(|e| bad(field, &e.to_string()))?;
        anyhow::Ok(())
    };
    if let Some(p) = spec.run.pool.as_mut() {
        load("run.pool.loader", &mut p.loader)?;
    }
    if let Some(s) = spec.session.as_mut() {
        load("session.bootstrap", &mut s.bootstrap)?;
        if let Some(c) = s.compiled.as_mut() {
            load("session.compiled.module", &mut c.module)?;
            load("session.compiled.bootstrap", &mut c.bootstrap)?;
        }
    }
    if let Some(s) = spec.notebook.as_mut().and_then(|n| n.setup.as_mut()) {
        load("notebook.setup", s)?;
        protocol::check_source(&s.text, protocol::SETUP_VARS)
            .map_err(|e| bad("notebook.setup", &e.to_string()))?;
    }
    check_names(&spec, &bad)?;
    if let Some(p) = &spec.run.pool {
        check_pool(p, spec.run.compile.is_some(), &bad)?;
    }
    if let Some(v) = &spec.version {
        check_regex(&v.regex).map_err(|e| bad("version.regex", &e.to_string()))?;
    }
    if let Some(s) = &spec.session {
        check_session(s, &bad)?;
    }
    if let Some(n) = &spec.notebook {
        check_notebook(n, &bad)?;
    }
    Ok(spec)
}

/// Builds the error for a field of the language file being read.
type Bad<'a> = &'a dyn Fn(&str, &str) -> anyhow::Error;

/// The names and the `[run]` section.
fn check_names(spec: &LangSpec, bad: Bad<'_>) -> anyhow::Result<()> {
    let id_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '+' || c == '#')
    };
    if !id_ok(&spec.id) {
        return Err(bad("id", "must be non-empty letters, digits, -, _, + or #"));
    }
    if let Some(a) = spec.aliases.iter().find(|a| !id_ok(a)) {
        return Err(bad("aliases", &format!("{a:?} is not a valid name")));
    }
    if spec.programs.is_empty() {
        return Err(bad("programs", "must list at least one executable"));
    }
    if spec.run.command.is_empty() {
        return Err(bad("run.command", "must not be empty"));
    }
    if spec.run.file.is_empty() || spec.run.file.contains('/') {
        return Err(bad("run.file", "must be a plain file name"));
    }
    for r in &spec.reads {
        let p = std::path::Path::new(r);
        let plain = p.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        });
        let star_inside = r.trim_end_matches('*').contains('*');
        if !p.is_absolute() || !plain || star_inside || p == std::path::Path::new("/") {
            return Err(bad(
                "reads",
                &format!(
                    "{r:?} must be an absolute path without . or .., other than /, with `*` only \
at the end"
                ),
            ));
        }
    }
    Ok(())
}

/// The `[run.pool]` section (`compiled`: the language has a compile step).
fn check_pool(p: &PoolSpec, compiled: bool, bad: Bad<'_>) -> anyhow::Result<()> {
    if compiled {
        return Err(bad(
            "run.pool",
            "a language with a compile step cannot be pooled",
        ));
    }
    if p.command.is_empty() {
        return Err(bad("run.pool.command", "must not be empty"));
    }
    if !p
        .command
        .iter()
        .any(|c| c.contains("{loader}") || c.contains("{loader_file}"))
    {
        return Err(bad(
            "run.pool.command",
            "must contain {loader} or {loader_file}",
        ));
    }
    if p.command.iter().any(|c| c == "{args}") {
        return Err(bad(
            "run.pool.command",
            "cannot take {args} (the loader reads them)",
        ));
    }
    if p.loader.text.trim().is_empty() {
        return Err(bad("run.pool.loader", "must not be empty"));
    }
    protocol::check_source(&p.loader.text, &[])
        .map_err(|e| bad("run.pool.loader", &e.to_string()))?;
    if let Some(c) = p.cold_env.iter().find(|c| {
        let name = c.strip_suffix('*').unwrap_or(c);
        name.is_empty() || name.contains(['*', '=', '\0'])
    }) {
        return Err(bad(
            "run.pool.cold_env",
            &format!("{c:?} is not a variable name or NAME* prefix"),
        ));
    }
    Ok(())
}

/// The `[session]` section.
fn check_session(s: &SessionSpec, bad: Bad<'_>) -> anyhow::Result<()> {
    if s.command.is_empty() {
        return Err(bad("session.command", "must not be empty"));
    }
    check_session_templates(s, bad)?;
    check_session_code(s, bad)?;
    check_session_patterns(s, bad)?;
    if s.interrupt.is_empty() {
        return Err(bad("session.interrupt", "must not be empty"));
    }
    if let Some(p) = s
        .programs
        .iter()
        .find(|p| p.trim().is_empty() || p.chars().any(|c| c.is_whitespace() || c == '\0'))
    {
        return Err(bad(
            "session.programs",
            &format!("{p:?} is not an executable name or path"),
        ));
    }
    Ok(())
}

/// `[session]`'s templates of the protocol: the prompts, the line that runs a cell, the
/// cell's file name.
fn check_session_templates(s: &SessionSpec, bad: Bad<'_>) -> anyhow::Result<()> {
    if !s.prompt.contains("{nonce}") {
        return Err(bad("session.prompt", "must contain {nonce}"));
    }
    if let Some(c) = &s.continuation
        && !c.contains("{nonce}")
    {
        return Err(bad("session.continuation", "must contain {nonce}"));
    }
    if !s.eval.contains("{n}") {
        return Err(bad("session.eval", "must contain {n}"));
    }
    if s.eval.contains('\n') {
        return Err(bad("session.eval", "must be a single line"));
    }
    if !s.cell_file.contains("{n}") || s.cell_file.contains('/') {
        return Err(bad(
            "session.cell_file",
            "must be a plain file name containing {n}",
        ));
    }
    Ok(())
}

/// `[session]`'s code run in the interpreter: the bootstrap (compiled or not), the init
/// lines, the line that runs a cell.
fn check_session_code(s: &SessionSpec, bad: Bad<'_>) -> anyhow::Result<()> {
    if s.bootstrap_file.is_some() {
        return Err(bad(
            "session.bootstrap_file",
            "no longer used: the bootstrap is written under the name of its file \
(`bootstrap = { file = \"bootstrap.py\" }`)",
        ));
    }
    protocol::check_source(&s.bootstrap.text, protocol::SESSION_VARS)
        .map_err(|e| bad("session.bootstrap", &e.to_string()))?;
    if let Some(c) = &s.compiled {
        protocol::check_source(&c.bootstrap.text, protocol::SESSION_VARS)
            .map_err(|e| bad("session.compiled.bootstrap", &e.to_string()))?;
        let stem = c.module.file.strip_suffix(".hs").unwrap_or("");
        let is_module = stem.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && stem.chars().all(|c| c.is_ascii_alphanumeric());
        if !is_module {
            return Err(bad(
                "session.compiled.module",
                "must be a Haskell module's file: a capitalised plain name ending in .hs",
            ));
        }
    }
    for line in &s.init {
        protocol::check_source(line, protocol::SESSION_VARS)
            .map_err(|e| bad("session.init", &e.to_string()))?;
    }
    protocol::check_source(&s.eval, protocol::EVAL_VARS)
        .map_err(|e| bad("session.eval", &e.to_string()))?;
    Ok(())
}

/// `[session]`'s reading of the interpreter's output: the error and variable patterns, the
/// lines that list variables and inspect one.
fn check_session_patterns(s: &SessionSpec, bad: Bad<'_>) -> anyhow::Result<()> {
    if let Some(p) = &s.error_pattern {
        check_regex(p).map_err(|e| bad("session.error_pattern", &e.to_string()))?;
    }
    if let Some(p) = &s.vars_pattern {
        check_regex(p).map_err(|e| bad("session.vars_pattern", &e.to_string()))?;
        if !p.contains("?P<name>") || !p.contains("?P<type>") {
            return Err(bad(
                "session.vars_pattern",
                "must have the groups (?P<name>...) and (?P<type>...)",
            ));
        }
        if s.vars.is_none() {
            return Err(bad("session.vars_pattern", "needs session.vars"));
        }
    }
    if let Some(v) = &s.vars
        && v.contains('\n')
    {
        return Err(bad("session.vars", "must be a single line"));
    }
    if let Some(v) = &s.inspect
        && v.contains('\n')
    {
        return Err(bad("session.inspect", "must be a single line"));
    }
    Ok(())
}

/// The `[notebook]` section.
fn check_notebook(n: &NotebookSpec, bad: Bad<'_>) -> anyhow::Result<()> {
    let ext_ok = n.file_extension.starts_with('.')
        && n.file_extension.len() > 1
        && n.file_extension[1..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric());
    if !ext_ok {
        return Err(bad(
            "notebook.file_extension",
            "must be a dot and letters or digits (\".py\")",
        ));
    }
    if n.comment.trim().is_empty() || n.comment.contains('\n') {
        return Err(bad("notebook.comment", "must be a line comment's start"));
    }
    Ok(())
}

/// Check that a pattern is a valid regular expression without compiling it: parsing is
/// what finds syntax errors, and it costs a small fraction of building the matcher (which
/// happens on first use). The parser is the one `regex` itself uses, with its defaults.
fn check_regex(pattern: &str) -> Result<(), Box<regex_syntax::Error>> {
    regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .map(drop)
        .map_err(Box::new)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::lang::BUILTIN;

    #[test]
    fn builtin_folders_parse_and_every_file_is_used() {
        assert!(!BUILTIN.is_empty());
        for (folder, files) in BUILTIN {
            let text = files
                .iter()
                .find(|(n, _)| *n == LANGUAGE_FILE)
                .map(|(_, t)| *t)
                .unwrap_or_else(|| panic!("{folder} has no {LANGUAGE_FILE}"));
            let spec =
                parse_spec(folder, text, Folder::Builtin(files)).unwrap_or_else(|e| panic!("{e}"));
            check_folder_name(folder, folder, &spec).unwrap_or_else(|e| panic!("{e}"));
            // A file no language field names is left over from an edit.
            let used: Vec<&str> = std::iter::once(LANGUAGE_FILE)
                .chain(spec.run.pool.as_ref().map(|p| p.loader.file.as_str()))
                .chain(spec.session.as_ref().map(|s| s.bootstrap.file.as_str()))
                .chain(
                    spec.session
                        .as_ref()
                        .and_then(|s| s.compiled.as_ref())
                        .into_iter()
                        .flat_map(|c| [c.module.file.as_str(), c.bootstrap.file.as_str()]),
                )
                .chain(
                    spec.notebook
                        .as_ref()
                        .and_then(|n| n.setup.as_ref())
                        .map(|s| s.file.as_str()),
                )
                // Code mode's in-sandbox modules (written into each channel's directory).
                .chain(
                    crate::upstream::modules::FILES
                        .iter()
                        .filter(|m| m.0 == *folder)
                        .map(|m| m.1),
                )
                .collect();
            for (name, _) in *files {
                assert!(used.contains(name), "prompts/{folder}/{name} is not used");
            }
        }
    }

    /// Parse a language file without a folder.
    fn parse_alone(origin: &str, text: &str) -> anyhow::Result<LangSpec> {
        parse_spec(origin, text, Folder::None)
    }

    #[test]
    fn named_files_are_read_from_the_folder_only() {
        let base = "id='p'\nname='P'\nprograms=['p']\n[run]\nfile='a'\ncommand=['p']\n[run.pool]\ncommand=['{loader}']\n";
        let files: &[(&str, &str)] = &[("l.py", "print(1)")];
        let spec = parse_spec(
            "p",
            &format!("{base}loader={{file='l.py'}}\n"),
            Folder::Builtin(files),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            spec.run.pool.map(|p| p.loader.text),
            Some("print(1)".into())
        );
        for (file, says) in [
            ("nope.py", "no file \"nope.py\""),
            ("../l.py", "not a plain file name"),
            ("language.toml", "not a plain file name"),
        ] {
            let e = parse_spec(
                "p",
                &format!("{base}loader={{file='{file}'}}\n"),
                Folder::Builtin(files),
            )
            .unwrap_err();
            assert!(
                e.to_string().contains("p: field `run.pool.loader`")
                    && e.to_string().contains(says),
                "{e}"
            );
        }
        // A lone file cannot name files; inline source says how to convert.
        let e = parse_alone("p.toml", &format!("{base}loader={{file='l.py'}}\n")).unwrap_err();
        assert!(e.to_string().contains("<id>/language.toml"), "{e}");
        let e = parse_alone("p.toml", &format!("{base}loader='print(1)'\n")).unwrap_err();
        assert!(
            e.to_string().contains("no longer read") && e.to_string().contains("{ file ="),
            "{e}"
        );
    }

    #[test]
    fn errors_name_file_and_field() {
        let e = parse_alone("x.toml", "id = 'x'\nname='X'\nprograms=['x']\n").unwrap_err();
        assert!(e.to_string().starts_with("x.toml:"), "{e}");
        assert!(e.to_string().contains("run"), "{e}");
        let e = parse_alone(
            "y.toml",
            "id='y'\nname='Y'\nprograms=['y']\n[run]\nfile='a'\ncommand=['y']\nbogus=1\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = parse_alone(
            "z.toml",
            "id='z'\nname='Z'\nprograms=['z']\nversion={args=[], regex='('}\n[run]\nfile='a'\ncommand=['z']\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("version.regex"), "{e}");
        // Errors found only when translating (an unknown Unicode class) count too.
        let e = parse_alone(
            "u.toml",
            "id='u'\nname='U'\nprograms=['u']\nversion={args=[], regex='\\p{Nope}'}\n[run]\nfile='a'\ncommand=['u']\n",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("u.toml: field `version.regex`"),
            "{e}"
        );
    }

    #[test]
    fn pool_section_is_checked() {
        let base = "id='p'\nname='P'\nprograms=['p']\n[run]\nfile='a'\ncommand=['p', '{file}']\n";
        let folder = Folder::Builtin(&[("l", "x"), ("blank", " ")]);
        let ok = format!(
            "{base}[run.pool]\ncommand=['p', '-c', '{{loader}}']\nloader={{file='l'}}\ncold_env=['P_*']\n"
        );
        parse_spec("ok.toml", &ok, folder).unwrap_or_else(|e| panic!("{e}"));
        for (section, field) in [
            ("command=['p']\nloader={file='l'}\n", "run.pool.command"),
            (
                "command=['{loader}', '{args}']\nloader={file='l'}\n",
                "run.pool.command",
            ),
            (
                "command=['{loader}']\nloader={file='blank'}\n",
                "run.pool.loader",
            ),
            (
                "command=['{loader}']\nloader={file='l'}\ncold_env=['*']\n",
                "run.pool.cold_env",
            ),
        ] {
            let e = parse_spec("bad.toml", &format!("{base}[run.pool]\n{section}"), folder)
                .unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("bad.toml: field `{field}`")),
                "{e}"
            );
        }
        let compiled = format!(
            "{}compile=['cc']\n[run.pool]\ncommand=['{{loader}}']\nloader={{file='l'}}\n",
            base
        );
        let e = parse_spec("c.toml", &compiled, folder).unwrap_err();
        assert!(e.to_string().contains("`run.pool`"), "{e}");
    }

    #[test]
    fn validation_agrees_with_the_regex_crate() {
        for p in [
            r"(",
            r"\p{Nope}",
            r"a{2,1}",
            r"[z-a]",
            r"(?P<n>a)(?P<n>b)",
            r"x**",
        ] {
            assert_eq!(check_regex(p).is_ok(), regex::Regex::new(p).is_ok(), "{p}");
        }
        for p in [
            r"Python (\S+)",
            r"(?m)^Traceback \(most recent call last\):",
            r"v?(\d[\w.]*)",
        ] {
            assert!(check_regex(p).is_ok(), "{p}");
        }
    }

    pub(crate) const SESSION_LANG: &str = r#"
id = "x"
name = "X"
programs = ["xrun"]
[run]
file = "main.x"
command = ["{exe}", "{file}"]
[session]
programs = ["xrepl", "xrepl2"]
command = ["{exe}"]
bootstrap = { file = "boot" }
prompt = "{nonce}p"
cell_file = "cell-{n}"
eval = "run {n}"
"#;

    pub(crate) const SESSION_FILES: Folder<'static> = Folder::Builtin(&[("boot", "")]);

    #[test]
    fn source_placeholders_are_checked_where_they_are() {
        let with =
            |boot: &str, text: &str| parse_spec("s.toml", text, Folder::Builtin(&[("boot", boot)]));
        with("d = {ctl:json}; n = {sync_base}", SESSION_LANG).unwrap_or_else(|e| panic!("{e}"));
        for (boot, text, field) in [
            ("d = '{ctl}'", SESSION_LANG.to_string(), "session.bootstrap"),
            (
                "",
                SESSION_LANG.replace("run {n}", "run {n} {cell}"),
                "session.eval",
            ),
            (
                "",
                SESSION_LANG.replace("[session]", "[session]\ninit = ['cd {cwd}']"),
                "session.init",
            ),
            (
                "",
                SESSION_LANG.replace("[session]", "[session]\nbootstrap_file = 'b'"),
                "session.bootstrap_file",
            ),
        ] {
            let e = with(boot, &text).unwrap_err().to_string();
            assert!(e.contains(&format!("s.toml: field `{field}`")), "{e}");
        }
        // The eval line's path as a literal is fine.
        with("", &SESSION_LANG.replace("run {n}", "run {n} {cell:json}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn session_programs_are_validated() {
        parse_spec("ok.toml", SESSION_LANG, SESSION_FILES).unwrap_or_else(|e| panic!("{e}"));
        for bad in ["\"\"", "\"x repl\"", "\" \""] {
            let text = SESSION_LANG.replace("\"xrepl\", \"xrepl2\"", bad);
            let e = parse_spec("bad.toml", &text, SESSION_FILES).unwrap_err();
            assert!(e.to_string().contains("session.programs"), "{bad}: {e}");
        }
    }
}
