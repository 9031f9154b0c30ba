//! `%pip install` (and `!pip install`) lines at the top of a Python cell, and
//! `await replbox.install(...)` lines at the top of a JavaScript one: installed by the
//! server's installer into the session's package layer, never run by the interpreter.

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::ToolError;
use crate::packages::{Eco, InstallLineError, PackageError};
use crate::session::live::Session;

/// What a cell's install lines did: the note for its report, the code to evaluate after
/// them, and the exact versions installed (for the journal).
pub(super) struct Done {
    pub note: String,
    pub code: String,
    pub pins: Vec<String>,
}

/// The session's ecosystem, the specifiers and the rest of the cell.
type Lines = (Eco, Vec<String>, String);

/// Why a replayed cell's install lines could not be installed again (the replay reports it
/// as the cell's error, and does not run the cell).
#[derive(Debug, thiserror::Error)]
pub(super) enum ReplayError {
    #[error(transparent)]
    Line(#[from] InstallLineError),
    #[error("this session has no package layer")]
    NoLayer,
    #[error("{}", .0.message())]
    Install(PackageError),
}

/// A cell's install lines (None: no such line, or a language without them).
fn lines(session: &Session, code: &str) -> Option<Result<Lines, InstallLineError>> {
    let eco = Eco::of(session.lang.id())?;
    let found = match eco {
        Eco::Python => crate::packages::pip_lines(code).map(Ok),
        Eco::Npm => crate::packages::js_install_lines(code),
    }?;
    Some(found.map(|(specs, rest)| (eco, specs, rest)))
}

/// The code evaluated after the install lines: Python's import system must look at the
/// layer again, its listing having changed within the interpreter's life (node's require
/// looks at every call).
fn after(eco: Eco, rest: String) -> String {
    match eco {
        Eco::Python => {
            format!("import importlib as _rb_il; _rb_il.invalidate_caches(); del _rb_il\n{rest}")
        }
        Eco::Npm => rest,
    }
}

/// Install what a cell's install lines ask for (None: the cell has none).
pub(super) async fn install(
    config: &Config,
    session: &Session,
    code: &str,
    cancel: &CancellationToken,
) -> Result<Option<Done>, ToolError> {
    let Some(found) = lines(session, code) else {
        return Ok(None);
    };
    let (eco, specs, rest) = found?;
    let what = match eco {
        Eco::Python => "%pip install",
        Eco::Npm => "replbox.install",
    };
    if config.packages.no_packages {
        return Err(crate::packages::enabled(None)
            .map(|_| ())
            .unwrap_err()
            .into());
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
        .await?;
    Ok(Some(Done {
        note: installed.line(),
        code: after(eco, rest),
        pins: installed.pins,
    }))
}

/// A replayed cell's install lines installed again: the exact versions the journal kept
/// (`pins`, from the cache when it has them), else what the lines ask for. The code to
/// evaluate after them, or why they could not be installed.
pub(super) async fn replay(
    session: &Session,
    code: &str,
    pins: Option<&Vec<String>>,
    cancel: &CancellationToken,
) -> Result<Option<String>, ReplayError> {
    let Some(found) = lines(session, code) else {
        return Ok(None);
    };
    let (eco, specs, rest) = found?;
    let Some(sp) = &session.packages else {
        return Err(ReplayError::NoLayer);
    };
    let want = match pins {
        Some(p) if !p.is_empty() && p.len() <= crate::packages::MAX_SPECS => p.clone(),
        _ => specs,
    };
    sp.service
        .install(&sp.exe, &want, &sp.layer, &session.owner.principal, cancel)
        .await
        .map_err(ReplayError::Install)?;
    Ok(Some(after(eco, rest)))
}
