//! The files a channel's directory holds for user code: each language's module (real
//! source files under `prompts/<language>/`) and `replbox-tool`, the command for shells.
//! Every channel has all of them, so a bash cell can run `python3 -c 'from replbox import
//! tools'` as well as `replbox-tool`.

/// Each file: the prompts folder and file it comes from, where it goes in the channel's
/// directory, and its contents.
pub(crate) const FILES: [(&str, &str, &str, &str); 4] = [
    (
        "python",
        "replbox_tools.py",
        "python/replbox/__init__.py",
        include_str!("../../prompts/python/replbox_tools.py"),
    ),
    (
        "javascript",
        "replbox_tools.js",
        "node/replbox/index.js",
        include_str!("../../prompts/javascript/replbox_tools.js"),
    ),
    (
        "ruby",
        "replbox_tools.rb",
        "ruby/replbox.rb",
        include_str!("../../prompts/ruby/replbox_tools.rb"),
    ),
    (
        "shellscript",
        "replbox-tool",
        "bin/replbox-tool",
        include_str!("../../prompts/shellscript/replbox-tool"),
    ),
];

/// (path in the channel's directory, contents).
pub(super) fn files() -> impl Iterator<Item = (&'static str, &'static str)> {
    FILES.iter().map(|(_, _, to, text)| (*to, *text))
}
