use stoa_types::FsError;

/// Why a call did not get a reply. Every one of these means "the peer may or may not have
/// executed the request".
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("connect to {addr}: {source}")]
    Connect { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("connection to {addr} lost: {detail}")]
    Lost { addr: std::net::SocketAddr, detail: String },
    #[error("call to {addr} timed out after {ms} ms")]
    Timeout { addr: std::net::SocketAddr, ms: u64 },
    #[error("bad frame from {addr}: {source}")]
    Frame { addr: std::net::SocketAddr, source: stoa_proto::FrameError },
    #[error("listen on {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
}

impl From<NetError> for FsError {
    /// A failed call is retryable elsewhere or later: the peer may be down or partitioned.
    fn from(e: NetError) -> Self {
        match e {
            NetError::Frame { source: stoa_proto::FrameError::BadVersion(_), .. } => {
                FsError::Protocol(e.to_string())
            }
            _ => FsError::Unavailable(e.to_string()),
        }
    }
}
