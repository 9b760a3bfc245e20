//! Jepsen-style fault tests for Stoa: a cluster whose every node is a separate host (a
//! network namespace with its own address), faults injected for real (kill -9,
//! SIGSTOP, cut links, a full disk, flipped bytes on disk), workloads that record every
//! client operation with its invoke and complete time, and a checker that proves the
//! history linearizable and that no acknowledged byte was lost.
//!
//! ```text
//!  Cluster (net namespaces, stoa meta|chunk|mount)   <- scenario injects a fault, heals
//!     ^ FUSE mounts                                          |
//!  workloads (registers, namespace, fsynced files) -> History -> checker -> Summary
//! ```

pub mod checker;
pub mod cluster;
pub mod error;
pub mod history;
pub mod net;
pub mod rng;
pub mod run;
pub mod scenario;
pub mod workload;

pub use error::{FaultError, Result};
