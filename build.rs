//! Embeds every folder of `prompts/` (a language: `language.toml` and the source files it
//! names) into the binary, so adding a built-in language is adding a folder.
use std::{env, fs, path::PathBuf};

fn main() {
    let dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR")).join("prompts");
    println!("cargo:rerun-if-changed={}", dir.display());
    let hidden = |p: &PathBuf| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
    };
    let list = |d: &PathBuf| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| !hidden(p))
            .collect();
        v.sort();
        v
    };
    let mut out = String::from("&[\n");
    for folder in list(&dir) {
        if !folder.is_dir() {
            panic!(
                "{}: a language is a folder, prompts/<id>/language.toml with the files it names",
                folder.display()
            );
        }
        // The folder itself, so that a file added to it is seen.
        println!("cargo:rerun-if-changed={}", folder.display());
        let id = folder
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !folder.join("language.toml").is_file() {
            panic!("{}: no language.toml", folder.display());
        }
        out.push_str(&format!("    ({id:?}, &[\n"));
        for file in list(&folder) {
            if !file.is_file() {
                panic!("{}: a language folder holds files only", file.display());
            }
            println!("cargo:rerun-if-changed={}", file.display());
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.push_str(&format!(
                "        ({name:?}, include_str!({:?})),\n",
                file.display().to_string()
            ));
        }
        out.push_str("    ]),\n");
    }
    out.push_str("]\n");
    let dest = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("builtin_prompts.rs");
    fs::write(dest, out).expect("write builtin_prompts.rs");
}
