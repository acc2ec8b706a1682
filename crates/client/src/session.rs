//! Client sessions: what makes a producer's resends idempotent. A session is
//! registered with the cluster's coordinator, kept open by heartbeats at a third of
//! its timeout, and ended when its producer is done (see `docs/protocol.md`, "Client
//! sessions").

use std::time::Duration;

use braid_proto::client::{Request, Response};

use crate::client::Client;
use crate::connection::unexpected;
use crate::error::ClientError;

/// Client sessions.
impl Client {
    /// Registers a client session that ends when no heartbeat comes for `timeout`
    /// (1 s to 10 min); returns its id.
    ///
    /// # Errors
    /// As [`Client::call`]; `InvalidArgument` for a timeout out of range.
    pub async fn register_session(&self, timeout: Duration) -> Result<u64, ClientError> {
        let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        match self.call(&Request::RegisterSession { timeout_ms }).await? {
            Response::Session(session) => Ok(session),
            other => Err(unexpected(&other)),
        }
    }

    /// Keeps `session` open; returns the id through which ended sessions are retired.
    ///
    /// # Errors
    /// As [`Client::call`]; `SessionNotFound` once the session has ended.
    pub async fn session_heartbeat(&self, session: u64) -> Result<u64, ClientError> {
        match self.call(&Request::SessionHeartbeat { session }).await? {
            Response::SessionAlive { retired_through } => Ok(retired_through),
            other => Err(unexpected(&other)),
        }
    }

    /// Ends `session` (ending an ended session is no error).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn end_session(&self, session: u64) -> Result<(), ClientError> {
        match self.call(&Request::EndSession { session }).await? {
            Response::Empty => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}
