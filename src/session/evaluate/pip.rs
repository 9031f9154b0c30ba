//! `%pip install` (and `!pip install`) lines at the top of a Python cell: installed by the
//! server's installer into the session's package layer, never run by the interpreter.

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::ToolError;
use crate::session::live::Session;

/// What the installer did for a cell's `%pip` lines, and the code to evaluate after them
/// (None: the cell has no `%pip` line, or the session is not Python).
pub(super) async fn install(
    config: &Config,
    session: &Session,
    code: &str,
    cancel: &CancellationToken,
) -> Result<Option<(String, String)>, ToolError> {
    if session.lang.id() != "python" {
        return Ok(None);
    }
    let Some((specs, rest)) = crate::packages::pip_lines(code) else {
        return Ok(None);
    };
    if config.packages.no_packages {
        return Err(crate::packages::enabled(None)
            .map(|_| ())
            .unwrap_err()
            .into_tool());
    }
    let Some(sp) = &session.packages else {
        return Err(ToolError::invalid(
            "%pip install: this session has no package layer (it runs in a virtual \
             environment, whose own pip installs into it); run pip as a program there, or \
             start a session without a venv",
        ));
    };
    if specs.is_empty() {
        return Err(ToolError::invalid(
            "%pip install: name the packages to install (\"%pip install six\")",
        ));
    }
    let installed = sp
        .service
        .install(
            &sp.python,
            &specs,
            &sp.layer,
            &session.owner.principal,
            cancel,
        )
        .await
        .map_err(|e| e.into_tool())?;
    // The layer's listing changed within the interpreter's life: its import system must
    // look again.
    let code =
        format!("import importlib as _rb_il; _rb_il.invalidate_caches(); del _rb_il\n{rest}");
    Ok(Some((installed.line(), code)))
}
