//! Spawning: the `__exec` helper every child runs under, the server-side spawner, child
//! environments and PTYs.

pub(crate) mod child;
pub mod env;
pub mod helper;
pub mod pty;
pub mod spawn;

pub use spawn::{Proc, SpawnSpec, Stdio3, describe_status, spawn};
