//! The client's error type, its `Result`, and the gRPC code names the contract uses.

/// Everything that can go wrong talking to a node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address could not be turned into a gRPC endpoint.
    #[error("invalid address '{address}': {source}")]
    InvalidAddress {
        address: String,
        source: tonic::transport::Error,
    },
    /// The TCP/HTTP2 connection could not be established.
    #[error("connect to {address}: {source}")]
    Connect {
        address: String,
        source: tonic::transport::Error,
    },
    /// The TLS options could not be used (unreadable file, bad PEM, `http://` with TLS).
    #[error("tls: {0}")]
    Tls(String),
    /// User name or password cannot travel as gRPC metadata.
    #[error("invalid credentials: {0}")]
    InvalidCredentials(String),
    /// The server answered with a gRPC status (kept whole: branch on `status.code()`).
    #[error("{}: {}", code_name(.0.code()), .0.message())]
    Status(#[from] tonic::Status),
    /// The server broke the stream protocol of docs/api.md (e.g. no `subscribed` first).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The request half of a stream is gone (the call ended).
    #[error("stream closed: {0}")]
    Closed(&'static str),
}

impl Error {
    /// The gRPC status, if the server answered with one.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            Error::Status(s) => Some(s),
            _ => None,
        }
    }

    /// The gRPC code (`Unavailable` for connection problems).
    pub fn code(&self) -> tonic::Code {
        match self {
            Error::Status(s) => s.code(),
            Error::InvalidAddress { .. } | Error::InvalidCredentials(_) | Error::Tls(_) => {
                tonic::Code::InvalidArgument
            }
            Error::Connect { .. } | Error::Closed(_) => tonic::Code::Unavailable,
            Error::Protocol(_) => tonic::Code::Internal,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The gRPC code as the contract spells it: `INVALID_ARGUMENT`, `NOT_FOUND`, ….
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
