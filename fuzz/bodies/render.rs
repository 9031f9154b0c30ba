//! The output renderer (`output::Renderer`: parser, clamped screen, budget) and its head+tail buffer
//! (`output::HeadTail`), on bytes user code prints, in reads of any size.
//!
//! Properties, besides no panic: the rendered text is bounded by the cap (the head and tail
//! it keeps, each byte at most one replacement character, plus the omission line), and the
//! progress line can be asked for at any time.

use super::common;
use replbox::fuzzing::{HeadTail, Renderer, finish_now};

const CAPS: [usize; 6] = [0, 1, 7, 64, 1000, 4096];

/// The most text `cap` bytes can become: U+FFFD (3 bytes) per kept byte, and the line
/// saying how much was left out.
fn bound(cap: usize) -> usize {
    3 * cap + 64
}

/// Check one input (libFuzzer's, or a corpus file's).
pub fn run(data: &[u8]) {
    let [sel, seed, input @ ..] = data else {
        return;
    };
    let cap = CAPS[usize::from(*sel) % CAPS.len()];
    let mut r = Renderer::new(cap);
    let mut h = HeadTail::new(cap);
    for (i, c) in common::chunks(input, *seed, 1 + usize::from(*seed) * 256)
        .into_iter()
        .enumerate()
    {
        r.push(c);
        h.push(c);
        if i % 8 == 7 {
            let _ = r.last_line();
        }
    }
    let _ = r.last_line();
    let out = finish_now(r);
    assert!(
        out.text.len() <= bound(cap),
        "cap {cap}: {} bytes of rendered text",
        out.text.len()
    );
    let (text, omitted) = h.finish();
    assert!(text.len() <= bound(cap), "cap {cap}: {} bytes", text.len());
    assert!(omitted <= input.len() as u64);
    if input.len() <= cap {
        assert_eq!(omitted, 0);
        assert_eq!(text, String::from_utf8_lossy(input));
    }
}
