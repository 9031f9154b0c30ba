//! What the fuzz targets (`fuzz/`) reach: the parsers of bytes a caller or user code
//! controls. Built only with the `fuzzing` feature, so that the library's surface otherwise
//! stays what the binaries and the tests use.

pub use crate::lang::protocol::Format;
pub use crate::lang::{BUILTIN, Folder, parse_spec};
pub use crate::output::{HeadTail, Renderer};
pub use crate::session::EvalReport;
pub use crate::session::files::{file_uri, parse_uri};
pub use crate::session::report::{EvalStatus, apply_marker};
pub use crate::session::scan::{EndMarker, Event, MAX_MARKER, Scanner};

/// [`Renderer::finish`] without a runtime: with none, every push is rendered on the caller's
/// thread, so the future is ready at once.
pub fn finish_now(r: Renderer) -> crate::output::Rendered {
    use std::future::Future;
    let mut f = std::pin::pin!(r.finish());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("without a runtime nothing renders in the background"),
    }
}
