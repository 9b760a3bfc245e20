//! Shutdown on SIGINT or SIGTERM.

use tokio::signal::unix::{signal, SignalKind};

/// Resolves on the first SIGINT or SIGTERM. The handlers are installed before this
/// returns, so a signal that arrives while the caller starts up is not lost.
pub fn shutdown() -> anyhow::Result<impl std::future::Future<Output = ()> + Send> {
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        }
    })
}

/// A multi-threaded tokio runtime for one command.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}
