//! What the targets share: how an input is cut into the chunks a reader would see.

/// Cut `data` into chunks whose lengths (1..=`max`) come from `seed`, so one input is fed
/// in many ways. Deterministic: the same input is always cut the same way.
pub fn chunks(data: &[u8], seed: u8, max: usize) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 0x9e37_0000;
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        // xorshift32
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let len = (state as usize % max.max(1)) + 1;
        let (a, b) = rest.split_at(len.min(rest.len()));
        out.push(a);
        rest = b;
    }
    out
}

/// The nonce, prompts and markers of a fuzzed session (as a python session writes them).
pub const NONCE: &str = "f00dfeed01234567";
pub const PROMPT: &str = "\x1b_rbx;f00dfeed01234567;p\x1b\\";
pub const CONTINUATION: &str = "\x1b_rbx;f00dfeed01234567;c\x1b\\";
