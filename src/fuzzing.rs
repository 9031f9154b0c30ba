//! What the fuzz targets (`fuzz/`) reach: the parsers of bytes a caller or user code
//! controls. Built only with the `fuzzing` feature, so that the library's surface otherwise
//! stays what the binaries and the tests use.

pub use crate::output::{HeadTail, Renderer};
pub use crate::session::EvalReport;
pub use crate::session::files::{file_uri, parse_uri};
pub use crate::session::report::{EvalStatus, apply_marker};
pub use crate::session::scan::{EndMarker, Event, MAX_MARKER, Scanner};
