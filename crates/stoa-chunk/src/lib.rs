//! Temporary.
mod datadir;
pub mod engine;
mod error;
pub use error::ChunkError;
