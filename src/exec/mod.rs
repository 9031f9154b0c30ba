//! Spawning: the server side of running a program under the helper (`replbox-exec`, its
//! own crate), child environments and PTYs.

pub(crate) mod child;
pub mod env;
pub mod pty;
pub mod spawn;

pub use spawn::{Proc, SpawnSpec, Stdio3, describe_status, spawn};
