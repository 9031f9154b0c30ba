//! One test per (behaviour, language): a failure names its language, and each case runs
//! in parallel with the others instead of a test taking the sum of six languages.
//!
//! ```ignore
//! // tests `state_persists::python`, `state_persists::ruby`, … (a module per behaviour)
//! per_lang!(state_persists, [python, javascript, ruby], |lang| {
//!     let s = Server::stdio().start().await;
//!     let id = s.start_session(lang).await;
//!     …
//! });
//!
//! // a table whose rows start with the language: the rows of each language in its own test
//! per_row!(reads_one_line, READ_ONE, [python, javascript, r], |&(lang, ask, expect)| {
//!     …
//! });
//! ```
//!
//! A language whose program is missing is skipped with its reason (in CI, a failure). The
//! languages listed are checked against the table: a row with no test fails the build's
//! `…::every_row_has_a_test`.

/// (session language, the program that must be on PATH for it)
pub const LANGUAGES: &[(&str, &str)] = &[
    ("python", "python3"),
    ("javascript", "node"),
    ("ruby", "ruby"),
    ("haskell", "ghci"),
    ("shellscript", "bash"),
    ("r", "R"),
];

/// Whether `language` can run here: its program is on PATH, or the check is skipped (in
/// CI, a failure). A language not in [`LANGUAGES`] is a mistake in the test.
pub fn require_language(language: &str) -> bool {
    let Some((_, program)) = LANGUAGES.iter().find(|(l, _)| *l == language) else {
        panic!("no program known for language {language}: add it to LANGUAGES");
    };
    super::require(language, program)
}

/// A table row that starts with its language.
pub trait Row {
    fn language(&self) -> &str;
}

impl<B> Row for (&str, B) {
    fn language(&self) -> &str {
        self.0
    }
}
impl<B, C> Row for (&str, B, C) {
    fn language(&self) -> &str {
        self.0
    }
}
impl<B, C, D> Row for (&str, B, C, D) {
    fn language(&self) -> &str {
        self.0
    }
}
impl<B, C, D, E> Row for (&str, B, C, D, E) {
    fn language(&self) -> &str {
        self.0
    }
}

/// The rows of `table` for `language` (at least one, or the test is wrong).
pub fn rows_of<'a, R: Row>(table: &'a [R], language: &str) -> Vec<&'a R> {
    let rows: Vec<&R> = table.iter().filter(|r| r.language() == language).collect();
    assert!(!rows.is_empty(), "the table has no row for {language}");
    rows
}

/// Every language of `table` is among `listed` (those given a test).
pub fn assert_rows_covered<R: Row>(table: &[R], listed: &[&str]) {
    for r in table {
        assert!(
            listed.contains(&r.language()),
            "a row for {} has no test: add it to the list",
            r.language()
        );
    }
}

/// `per_lang!(name, [lang, …], |lang| { body })`: a module `name` with one async test per
/// language (`name::lang`), `lang: &'static str` in the body, skipped when the language's
/// program is missing. A doc comment before `name` documents the module.
macro_rules! per_lang {
    ($(#[$doc:meta])* $name:ident, [$($lang:ident),+ $(,)?], |$l:ident| $body:block) => {
        $(#[$doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $lang() {
                    let $l: &'static str = stringify!($lang);
                    if !$crate::common::require_language($l) {
                        return;
                    }
                    $body
                }
            )+
        }
    };
}
pub(crate) use per_lang;

/// `per_row!(name, TABLE, [lang, …], |pattern| { body })`: a module `name` with one async
/// test per language, running `body` for each row of `TABLE` (rows start with their
/// language) of that language, with the row bound to `pattern`; plus
/// `name::every_row_has_a_test`.
macro_rules! per_row {
    ($(#[$doc:meta])* $name:ident, $table:expr, [$($lang:ident),+ $(,)?], |$row:pat_param| $body:block) => {
        $(#[$doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $lang() {
                    if !$crate::common::require_language(stringify!($lang)) {
                        return;
                    }
                    for $row in $crate::common::rows_of($table, stringify!($lang)) {
                        $body
                    }
                }
            )+

            #[test]
            fn every_row_has_a_test() {
                $crate::common::assert_rows_covered($table, &[$(stringify!($lang)),+]);
            }
        }
    };
}
pub(crate) use per_row;
