//! The presentation layer: what every tool result says. The reports of `run` and `session`
//! get their text here (`text()`, the first content block, what the agent reads) and, where
//! a result carries more than text, their content blocks (an evaluation's images and links,
//! an export's document). `mcp` only puts them in the protocol's result beside the
//! structured form. Tests assert these texts byte for byte.

mod eval;
mod history;
mod inspect;
mod run;
mod session;

pub use session::already_closed;
