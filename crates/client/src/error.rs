//! Errors of the SDK, typed by who is at fault.

use braid_proto::client::ErrorCode;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server refused the request.
    #[error("server error {code}: {message}")]
    Server {
        /// The stable error code.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// The connection failed.
    #[error("connection error ({kind:?}): {message}")]
    Io {
        /// The OS error kind.
        kind: std::io::ErrorKind,
        /// The OS error text.
        message: String,
    },
    /// The connection is closed; calls on it fail.
    #[error("connection closed")]
    Closed,
    /// The server sent something this client cannot decode.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A fetched batch is damaged (CRC or structure).
    #[error("damaged batch from partition {partition} at offset {offset}: {reason}")]
    Corrupt {
        /// The partition.
        partition: u32,
        /// Where the batch was.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The login could not be completed on this side: the node's answer was malformed
    /// or its proof wrong (it does not hold the user's credential). A refused password
    /// is [`ClientError::Server`] with `AuthenticationFailed`.
    #[error("authentication: {0}")]
    Authentication(String),
    /// The caller asked for something impossible (no such partition, bad settings).
    #[error("{0}")]
    Invalid(String),
}

impl ClientError {
    /// The server error code, if the server refused the call.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Server { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ClientError {
    fn from(err: std::io::Error) -> Self {
        Self::Io {
            kind: err.kind(),
            message: err.to_string(),
        }
    }
}
