//! The harness's one error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("run `{cmd}`: {detail}")]
    Command { cmd: String, detail: String },
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("start {node}: {source}")]
    Spawn { node: String, source: std::io::Error },
    #[error("timed out after {secs} s waiting until {what}")]
    Timeout { secs: u64, what: String },
    #[error("the stoa binary is missing at {0}; build it with `cargo build --release --bin stoa`")]
    NoBinary(PathBuf),
    #[error("the fault harness needs root (network namespaces, mounts)")]
    NotRoot,
    #[error("bad status from meta: {0}")]
    Status(String),
}

pub type Result<T> = std::result::Result<T, FaultError>;

impl FaultError {
    pub fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> FaultError {
        FaultError::Io { what, path: path.into(), source }
    }
}
