//! The connection's door: its login (`Authenticate`) and the permission check every
//! other request passes before it is served.

use braid_proto::client::{Command, ErrorCode, Response};
use braid_proto::scram::nonce_from;

use super::{send_error, Env, Flow, Outgoing};
use crate::access::{need_of, Need};
use crate::error::NodeError;
use crate::metrics::add;

/// Refuses `request` unless the connection may make it: with authentication off,
/// everything is allowed; with it on, a logged-in user that still exists must hold the
/// permission the request needs.
pub(super) fn admit(
    env: &Env,
    request: &braid_proto::client::Request<'_>,
) -> Result<(), NodeError> {
    if !env.shared.config.authentication {
        return Ok(());
    }
    let need = need_of(request);
    if need == Need::Nothing {
        return Ok(());
    }
    let login = env.login.borrow();
    let Some(user) = login.user() else {
        return Err(NodeError::new(
            ErrorCode::NotAuthenticated,
            "this node requires authentication: send Authenticate (SCRAM-SHA-256) first",
        ));
    };
    let layout = env.layout.borrow();
    if layout.access.allows(user, need) {
        return Ok(());
    }
    if !layout.access.exists(user) {
        return Err(NodeError::new(
            ErrorCode::NotAuthenticated,
            format!("user {user} no longer exists"),
        ));
    }
    Err(NodeError::new(
        ErrorCode::PermissionDenied,
        format!("user {user} lacks {}", need.describe()),
    ))
}

/// One `Authenticate` step, answered inline (a few HMACs: the client pays the
/// PBKDF2). A failed step is answered `AuthenticationFailed` and the connection
/// closes, so each guess costs the guesser a connection and its own PBKDF2.
pub(super) async fn authenticate(
    env: &Env,
    request_id: u64,
    mechanism: &str,
    message: &[u8],
) -> Flow {
    let mut random = [0u8; 18];
    let step = match crate::admin_bootstrap::random_bytes(&mut random) {
        Ok(()) => {
            let layout = std::sync::Arc::clone(&env.layout.borrow());
            env.login.borrow_mut().step(
                mechanism,
                message,
                &layout.access,
                &env.shared.stand_in_secret,
                &nonce_from(&random),
            )
        }
        Err(err) => {
            let err = NodeError::new(ErrorCode::Internal, err.to_string());
            send_error(env, request_id, Command::Authenticate as u16, &err).await;
            return Flow::Close;
        }
    };
    match step {
        Ok(reply) => {
            if let Some(user) = env.login.borrow().user() {
                add(&env.metrics.authentications, 1);
                tracing::debug!(user, "client authenticated");
            }
            let mut frame = Vec::new();
            Response::Authenticated(reply).encode(request_id, Command::Authenticate, &mut frame);
            let _ = env.out.send(Outgoing::Frame(frame)).await;
            Flow::Continue
        }
        Err(err) => {
            add(&env.metrics.authentication_failures, 1);
            tracing::info!(%err, "client authentication failed; closing the connection");
            let err = NodeError::new(ErrorCode::AuthenticationFailed, err.to_string());
            send_error(env, request_id, Command::Authenticate as u16, &err).await;
            Flow::Close
        }
    }
}
