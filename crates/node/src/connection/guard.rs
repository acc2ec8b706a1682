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
        // On an open node anyone could make itself an administrator, who would stay
        // one once authentication is turned on (found by review): users and grants
        // are made only where logins are required.
        if grants_access(request) {
            return Err(NodeError::new(
                ErrorCode::PermissionDenied,
                "authentication is off on this node: users, passwords and grants are \
                 listed and managed only on a node that requires logins (authentication = true)",
            ));
        }
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
    Err(NodeError::new(
        ErrorCode::PermissionDenied,
        format!("user {user} lacks {}", need.describe()),
    ))
}

/// Who asked for a fetch, to check again when its answer is ready (a parked fetch may
/// wait up to a minute, and a revoke in between must hold for what it would get).
pub(super) struct Reader {
    layout: std::rc::Rc<std::cell::RefCell<std::sync::Arc<crate::layout::Layout>>>,
    /// The logged-in user, its credential's `StoredKey` and the stream; `None` on an
    /// open node (nothing to check, nothing copied on its fetch path).
    login: Option<(String, [u8; 32], String)>,
}

impl Reader {
    pub(super) fn of(env: &Env, stream: &str) -> Self {
        let login = env.login.borrow();
        Self {
            layout: std::rc::Rc::clone(&env.layout),
            login: login
                .authenticated()
                .map(|(user, key)| (user.to_owned(), *key, stream.to_owned())),
        }
    }

    /// `PermissionDenied` if the reader may no longer read its stream.
    pub(super) fn still_allowed(&self) -> Result<(), NodeError> {
        let Some((user, key, stream)) = &self.login else {
            return Ok(());
        };
        let layout = self.layout.borrow();
        let need = Need::Stream(stream, braid_proto::client::READ);
        if layout.access.holds(user, key) && layout.access.allows(user, need) {
            return Ok(());
        }
        Err(NodeError::new(
            ErrorCode::PermissionDenied,
            format!(
                "user {user} lost {} while its fetch waited",
                need.describe()
            ),
        ))
    }
}

/// The user of the connection's login if it has lapsed (the user was deleted or
/// given a new password since), counted and logged: the connection must close. A login
/// binds a connection to a credential, not to a name, so a user made again under the
/// same name never inherits the old connections.
pub(super) fn lapsed_login(env: &Env) -> Option<String> {
    let user = {
        let layout = env.layout.borrow();
        let login = env.login.borrow();
        login.lapsed(&layout.access).map(str::to_owned)
    }?;
    add(&env.metrics.logins_ended, 1);
    tracing::info!(
        peer = ?env.peer,
        user,
        "ending a connection: its user was deleted or its password changed"
    );
    Some(user)
}

/// Tells the client why its connection ends: as the answer to its request, or with
/// request id 0 when it is the node's own doing.
pub(super) async fn send_lapsed(env: &Env, request_id: u64, command: u16, user: &str) {
    let err = NodeError::new(
        ErrorCode::NotAuthenticated,
        format!("user {user} was deleted or its password changed: log in again"),
    );
    send_error(env, request_id, command, &err).await;
}

/// Whether `request` gives someone access: a user, a password or a grant.
fn grants_access(request: &braid_proto::client::Request<'_>) -> bool {
    use braid_proto::client::Request;
    // Every user command: a node that was secure and is restarted open must not let a
    // stranger list its users and grants, or delete users and strip their grants.
    matches!(
        request,
        Request::CreateUser { .. }
            | Request::DeleteUser { .. }
            | Request::ListUsers
            | Request::ChangePassword { .. }
            | Request::GrantPermissions { .. }
            | Request::RevokePermissions { .. }
    )
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
    let attempted = env.login.borrow().attempted(message);
    let now_ms = || u64::try_from(env.shared.started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let starting = matches!(*env.login.borrow(), crate::login::Login::Anonymous);
    if let (true, Some(peer), Some(user)) = (starting, env.peer, attempted.as_deref()) {
        // A guesser's source, or a user being guessed at, waits before each try.
        let delay = env.shared.door().login_delay(peer.ip(), user, now_ms());
        if !delay.is_zero() {
            add(&env.metrics.logins_delayed, 1);
            // Parallel connections from many addresses do not guess faster: a few of
            // the user's delayed logins go through at once, the others wait their turn.
            // A turn is waited for within the login deadline: guesses queued by a
            // client that went away leave the queue by then, and so does this one.
            let login_ms =
                std::time::Duration::from_millis(env.shared.config.connection_login_ms.max(1));
            let slots = env.shared.login_slots(user);
            let Ok(slot) = tokio::time::timeout(login_ms, slots.acquire_owned()).await else {
                add(&env.metrics.connections_closed_deadline, 1);
                tracing::info!(
                    peer = ?env.peer,
                    user,
                    "closing a connection whose login waited its login deadline for its turn"
                );
                return Flow::Close;
            };
            *env.login_slot.borrow_mut() = slot.ok();
            // Taken again: the failures of those that went before while it waited.
            let delay = env.shared.door().login_delay(peer.ip(), user, now_ms());
            tokio::time::sleep(delay).await;
        }
    }
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
            let user = env.login.borrow().user().map(str::to_owned);
            if let Some(user) = user.as_deref() {
                let Some(slot) = crate::mailbox::UserSlot::take(&env.shared, user) else {
                    add(&env.metrics.logins_refused_per_user, 1);
                    let max = env.shared.config.connections_per_user_max;
                    tracing::warn!(
                        peer = ?env.peer,
                        user,
                        max,
                        "refusing a login: the user holds connections_per_user_max connections"
                    );
                    let err = NodeError::new(
                        ErrorCode::QuotaExceeded,
                        format!(
                            "user {user} holds {max} connections, the most connections_per_user_max allows"
                        ),
                    );
                    send_error(env, request_id, Command::Authenticate as u16, &err).await;
                    return Flow::Close;
                };
                *env.user_slot.borrow_mut() = Some(slot);
                add(&env.metrics.authentications, 1);
                tracing::debug!(peer = ?env.peer, user, "client authenticated");
                // No longer a stranger: its place at the door goes back, and its
                // fetches count against its user's share from now on.
                env.stranger.borrow_mut().take();
                env.login_slot.borrow_mut().take();
                *env.principal_bytes.borrow_mut() =
                    env.shared.principal_budget(&format!("user {user}"));
            }
            let mut frame = Vec::new();
            Response::Authenticated(reply).encode(request_id, Command::Authenticate, &mut frame);
            let _ = env.out.send(Outgoing::Frame(frame)).await;
            Flow::Continue
        }
        Err(err) => {
            add(&env.metrics.authentication_failures, 1);
            if let Some(peer) = env.peer {
                env.shared
                    .door()
                    .login_failed(peer.ip(), attempted.as_deref(), now_ms());
            }
            tracing::info!(
                peer = ?env.peer,
                user = attempted.as_deref().unwrap_or("-"),
                %err,
                "client authentication failed; closing the connection"
            );
            let err = NodeError::new(ErrorCode::AuthenticationFailed, err.to_string());
            send_error(env, request_id, Command::Authenticate as u16, &err).await;
            Flow::Close
        }
    }
}
