//! The files a channel's directory holds for user code: each language's module (real
//! source files under `prompts/<language>/`) and `replbox-tool`, the command for shells.
//! Every channel has all of them, so a bash cell can run `python3 -c 'from replbox import
//! tools'` as well as `replbox-tool`.

/// (path in the channel's directory, contents).
pub(super) fn files() -> [(&'static str, &'static str); 4] {
    [
        (
            "python/replbox/__init__.py",
            include_str!("../../prompts/python/replbox_tools.py"),
        ),
        (
            "node/replbox/index.js",
            include_str!("../../prompts/javascript/replbox_tools.js"),
        ),
        (
            "ruby/replbox.rb",
            include_str!("../../prompts/ruby/replbox_tools.rb"),
        ),
        (
            "bin/replbox-tool",
            include_str!("../../prompts/shellscript/replbox-tool"),
        ),
    ]
}
