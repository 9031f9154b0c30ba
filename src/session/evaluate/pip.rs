//! `%pip install` (and `!pip install`) lines at the top of a Python cell, and
//! `await replbox.install(...)` lines at the top of a JavaScript one: installed by the
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
    let python = match session.lang.id() {
        "python" => true,
        "javascript" => false,
        _ => return Ok(None),
    };
    let what = if python {
        "%pip install"
    } else {
        "replbox.install"
    };
    let found = if python {
        crate::packages::pip_lines(code).map(Ok)
    } else {
        crate::packages::js_install_lines(code)
    };
    let Some(found) = found else {
        return Ok(None);
    };
    let (specs, rest) = found.map_err(ToolError::invalid)?;
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
        return Err(ToolError::invalid(format!(
            "{what}: name the packages to install (\"%pip install six\", \
             \"await replbox.install('lodash')\")"
        )));
    }
    let installed = sp
        .service
        .install(&sp.exe, &specs, &sp.layer, &session.owner.principal, cancel)
        .await
        .map_err(|e| e.into_tool())?;
    // The layer's listing changed within the interpreter's life: Python's import system
    // must look again (node's require looks at every call).
    let code = if python {
        format!("import importlib as _rb_il; _rb_il.invalidate_caches(); del _rb_il\n{rest}")
    } else {
        rest
    };
    Ok(Some((installed.line(), code)))
}
