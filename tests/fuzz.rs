//! Every fuzz target's corpus (`fuzz/corpus/TARGET/*`), replayed through the target's own
//! checks (`fuzz/bodies/TARGET.rs`) on stable in every test run: an input that once found a
//! bug, or covers a path, keeps being checked without the nightly fuzzing build. Then a
//! short mutation pass from that corpus: up to `REPLBOX_FUZZ_RUNS` inputs per target
//! (default 300, within `REPLBOX_FUZZ_SECS`, default 10 s) mutated the way libFuzzer does
//! (bit flips, inserted and removed bytes, splices with other inputs, the dictionary's
//! tokens), from a seed that is printed with any failure (`REPLBOX_FUZZ_SEED` replays it).
//! Not coverage-guided: `.ci/fuzz` runs libFuzzer itself for longer searches.

#[path = "../fuzz/bodies/mod.rs"]
mod bodies;

use std::path::{Path, PathBuf};

/// The files of `fuzz/corpus/<target>/`, in name order.
fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files
}

/// Run `check` on every input of `target`'s corpus; a failure names the file.
fn replay(target: &str, check: fn(&[u8])) {
    let mut failed = Vec::new();
    for file in corpus(target) {
        let data = std::fs::read(&file).expect("read a corpus file");
        if std::panic::catch_unwind(|| check(&data)).is_err() {
            failed.push(file.display().to_string());
        }
    }
    assert!(failed.is_empty(), "{target}: inputs that fail: {failed:?}");
}

/// Inputs mutated from `target`'s corpus, each through `check`; a failing input is written
/// to `target/tmp/fuzz-failures/` and named with the seed.
fn mutate(target: &str, check: fn(&[u8]), max_len: usize) {
    let runs: u64 = std::env::var("REPLBOX_FUZZ_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    // A budget, not a check: the pass stops early on a slow machine (debug builds of the
    // scanner's checks on 40 kB inputs take a while).
    let secs: u64 = std::env::var("REPLBOX_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let seed: u64 = std::env::var("REPLBOX_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    let corpus: Vec<Vec<u8>> = corpus(target)
        .iter()
        .map(|f| std::fs::read(f).expect("read a corpus file"))
        .collect();
    let dict = dictionary();
    let mut rng = Rng(seed);
    let mut failure = None;
    for run in 0..runs {
        if std::time::Instant::now() > until {
            break;
        }
        let base = &corpus[rng.below(corpus.len())];
        let other = &corpus[rng.below(corpus.len())];
        let input = rng.mutate(base, other, &dict, max_len);
        if std::panic::catch_unwind(|| check(&input)).is_err() {
            failure = Some((run, input));
            break;
        }
    }
    if let Some((run, input)) = failure {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
        let _ = std::fs::create_dir_all(&dir);
        let file = dir.join(format!("{target}-{seed}-{run}"));
        let _ = std::fs::write(&file, &input);
        panic!(
            "{target}: mutated input #{run} fails (REPLBOX_FUZZ_SEED={seed}); written to {}",
            file.display()
        );
    }
}

/// The tokens of `fuzz/scan.dict` (libFuzzer's dictionary format: `name="value"`, with
/// `\xNN` and `\\` escapes).
fn dictionary() -> Vec<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/scan.dict");
    let text = std::fs::read_to_string(path).expect("fuzz/scan.dict");
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(v) = line
            .split_once('=')
            .and_then(|(_, v)| v.strip_prefix('"')?.strip_suffix('"'))
        else {
            continue;
        };
        let b = v.as_bytes();
        let mut tok = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') && i + 3 < b.len() {
                let hex = std::str::from_utf8(&b[i + 2..i + 4]).unwrap_or("");
                if let Ok(x) = u8::from_str_radix(hex, 16) {
                    tok.push(x);
                    i += 4;
                    continue;
                }
            }
            if b[i] == b'\\' && i + 1 < b.len() {
                tok.push(b[i + 1]);
                i += 2;
                continue;
            }
            tok.push(b[i]);
            i += 1;
        }
        out.push(tok);
    }
    assert!(!out.is_empty(), "no tokens in fuzz/scan.dict");
    out
}

/// xorshift64*: small, seedable, enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// `base` with one to eight of libFuzzer's kinds of mutation, at most `max_len` bytes.
    fn mutate(&mut self, base: &[u8], other: &[u8], dict: &[Vec<u8>], max_len: usize) -> Vec<u8> {
        let mut v = base.to_vec();
        for _ in 0..1 + self.below(8) {
            let at = self.below(v.len() + 1);
            match self.below(7) {
                0 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] ^= 1 << self.below(8);
                }
                1 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] = self.next() as u8;
                }
                2 => v.insert(at, self.next() as u8),
                3 if !v.is_empty() => {
                    let n = 1 + self.below(v.len().min(64));
                    let i = self.below(v.len() - n + 1);
                    v.drain(i..i + n);
                }
                4 => {
                    let tok = &dict[self.below(dict.len())];
                    v.splice(at..at, tok.iter().copied());
                }
                5 if !other.is_empty() => {
                    // Splice: a piece of another input.
                    let i = self.below(other.len());
                    let n = 1 + self.below(other.len() - i);
                    v.splice(at..at, other[i..i + n].iter().copied());
                }
                _ if v.len() > 1 => {
                    // Repeat a piece (lengths past the parsers' bounds).
                    let i = self.below(v.len());
                    let n = 1 + self.below((v.len() - i).min(256));
                    let piece = v[i..i + n].to_vec();
                    for _ in 0..1 + self.below(64) {
                        v.splice(at..at, piece.iter().copied());
                    }
                }
                _ => v.push(self.next() as u8),
            }
        }
        v.truncate(max_len);
        v
    }
}

/// Every directory of `fuzz/corpus/` has a replay below (a new target gets one).
#[test]
fn every_corpus_is_replayed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut targets: Vec<String> = std::fs::read_dir(&dir)
        .expect("fuzz/corpus")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    targets.sort();
    assert_eq!(
        targets,
        ["lang", "marker", "quote", "render", "scan", "uri"],
        "add a replay test for each new target"
    );
}

#[test]
fn lang() {
    replay("lang", bodies::lang::run);
    mutate("lang", bodies::lang::run, 16384);
}

#[test]
fn marker() {
    replay("marker", bodies::marker::run);
    mutate("marker", bodies::marker::run, 4096);
}

#[test]
fn quote() {
    replay("quote", bodies::quote::run);
    mutate("quote", bodies::quote::run, 4096);
}

#[test]
fn render() {
    replay("render", bodies::render::run);
    mutate("render", bodies::render::run, 16384);
}

#[test]
fn scan() {
    replay("scan", bodies::scan::run);
    mutate("scan", bodies::scan::run, 16384);
}

#[test]
fn uri() {
    replay("uri", bodies::uri::run);
    mutate("uri", bodies::uri::run, 4096);
}
