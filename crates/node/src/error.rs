//! The error a request gets: a stable code and a message for people.

use braid_proto::client::{ErrorCode, ErrorDetail};

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct NodeError {
    /// The wire code.
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
    /// What a program may act on (a leader to ask), sent after the message.
    pub details: Vec<ErrorDetail>,
}

impl NodeError {
    /// An error with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// The error with `detail` added.
    pub fn with(mut self, detail: ErrorDetail) -> Self {
        self.details.push(detail);
        self
    }
}

impl From<crate::metadata::MetaError> for NodeError {
    fn from(err: crate::metadata::MetaError) -> Self {
        use crate::metadata::MetaError;
        let code = match &err {
            MetaError::StreamNotFound(_) => ErrorCode::StreamNotFound,
            MetaError::StreamExists(_) => ErrorCode::StreamExists,
            MetaError::TopicNotFound { .. } => ErrorCode::TopicNotFound,
            MetaError::TopicExists { .. } => ErrorCode::TopicExists,
            MetaError::UserNotFound(_) => ErrorCode::UserNotFound,
            MetaError::UserExists(_) => ErrorCode::UserExists,
            MetaError::SessionNotFound(_) => ErrorCode::SessionNotFound,
            MetaError::Group(group) => return group.clone().into(),
            _ => ErrorCode::InvalidArgument,
        };
        Self::new(code, err.to_string())
    }
}

impl From<crate::groups::GroupError> for NodeError {
    fn from(err: crate::groups::GroupError) -> Self {
        use crate::groups::GroupError;
        let code = match &err {
            GroupError::UnknownMember { .. } => ErrorCode::UnknownMember,
            GroupError::NotAssigned { .. } => ErrorCode::NotAssigned,
            GroupError::StaleGeneration { .. } => ErrorCode::StaleGeneration,
            GroupError::GroupFull { .. }
            | GroupError::TooManyGroups { .. }
            | GroupError::TooManyGroupsInStream { .. } => ErrorCode::QuotaExceeded,
            _ => ErrorCode::InvalidArgument,
        };
        Self::new(code, err.to_string())
    }
}
