//! Errors of the SDK, typed by who is at fault.

use braid_proto::client::{ErrorCode, ErrorDetail};

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
        /// What the server said besides, for programs (the leader to ask, for
        /// `NotLeader`); those this SDK does not know are skipped.
        details: Vec<ErrorDetail>,
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

    /// The member a `NotLeader` answer named as the leader: its node id and client
    /// address.
    pub fn leader(&self) -> Option<(u8, &str)> {
        let Self::Server { details, .. } = self else {
            return None;
        };
        details.iter().find_map(|detail| match detail {
            ErrorDetail::Leader {
                node_id,
                client_addr,
            } => Some((*node_id, client_addr.as_str())),
            _ => None,
        })
    }

    /// A refusal by the server, from an error response's status and body.
    pub(crate) fn from_response(status: u16, body: &[u8]) -> Self {
        let (message, details) = match braid_proto::client::ErrorBody::decode(body) {
            Ok(body) => (body.message, body.details),
            Err(err) => (format!("undecodable message: {err}"), Vec::new()),
        };
        Self::Server {
            code: braid_proto::client::error_code(status),
            message,
            details,
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
