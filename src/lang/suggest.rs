//! "Did you mean …?" for a language name that is not known: the closest id or alias by edit
//! distance, when it is close enough to be a slip of the keyboard.

use super::Registry;

/// The candidate closest to `name` (case-insensitive optimal string alignment distance, so
/// a swapped pair of letters counts once), if it is within a third of the name's length
/// (at least 1, at most 3), or starts with a name of 3 letters or more.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let name = name.trim().to_ascii_lowercase();
    if name.is_empty() || name.len() > 64 {
        return None;
    }
    let allowed = (name.chars().count() / 3).clamp(1, 3);
    candidates
        .into_iter()
        .filter_map(|c| {
            let lower = c.to_ascii_lowercase();
            let d = strsim::osa_distance(&name, &lower);
            let prefix = name.len() >= 3 && lower.starts_with(&name);
            (d <= allowed || prefix).then_some((d, c))
        })
        .min_by_key(|(d, c)| (*d, c.len()))
        .map(|(_, c)| c)
}

impl Registry {
    /// The installed language name (id or alias) closest to `name`; with `sessions`, only
    /// those of languages that can hold a session here.
    pub fn suggest(&self, name: &str, sessions: bool) -> Option<String> {
        let names: Vec<&str> = self
            .all()
            .iter()
            .filter(|l| {
                if sessions {
                    l.session_available()
                } else {
                    l.installed()
                }
            })
            .flat_map(|l| std::iter::once(l.id()).chain(l.spec.aliases.iter().map(String::as_str)))
            .collect();
        closest(name, names).map(str::to_string)
    }
}

/// " Did you mean \"x\"?" when there is a close name, else "".
pub fn did_you_mean(suggestion: Option<&str>) -> String {
    suggestion.map_or(String::new(), |s| format!(" Did you mean {s:?}?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 9] = [
        "python",
        "py",
        "python3",
        "javascript",
        "js",
        "node",
        "ruby",
        "shellscript",
        "bash",
    ];

    #[test]
    fn slips_of_the_keyboard_find_their_language() {
        for (typed, want) in [
            ("pyhton", "python"),
            ("Pytohn", "python"),
            ("javscript", "javascript"),
            ("nodejs", "node"),
            ("rubyy", "ruby"),
            ("bsh", "bash"),
            ("shell", "shellscript"),
            ("pyton3", "python3"),
        ] {
            assert_eq!(closest(typed, NAMES), Some(want), "{typed}");
        }
    }

    #[test]
    fn unrelated_names_get_no_suggestion() {
        for typed in ["cobol", "fortran", "", "x", "zz", &"p".repeat(100)] {
            assert_eq!(closest(typed, NAMES), None, "{typed}");
        }
    }
}
