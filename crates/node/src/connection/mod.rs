//! A client connection, served by the shard it was handed to.
//!
//! The reader takes frames in order and dispatches each to the shard that owns its
//! partition (or to shard 0 for metadata) before reading the next, so produces on one
//! connection reach a partition in the order they were sent. Replies are awaited
//! concurrently and written as they complete, matched by request id.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use braid_proto::client::{
    encode_error, encode_fetch_prefix, frame_length, split_request, Command, ErrorCode, FrameError,
    Request, Response, REQUEST_HEADER_BYTES,
};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

mod deadlines;
mod guard;
mod listing;
mod produce;
mod writer;

use deadlines::Deadlines;
use writer::{write_loop, FetchBudget, Outgoing};

use crate::admin::admin_request;
use crate::door::Turned;
use crate::error::NodeError;
use crate::layout::{Layout, PartitionKey, TopicRoute};
use crate::mailbox::{Control, FetchOutcome, NodeShared, ShardRequest, StrangerSlot};
use crate::metrics::{add, ShardMetrics};

/// Responses queued for the writer of one connection before the reader waits.
const OUTGOING_FRAMES_MAX: usize = 256;
/// Bytes the reader asks for at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Longest a fetch may wait for data (ms).
const FETCH_WAIT_MS_MAX: u32 = 60_000;

struct Env {
    shared: Arc<NodeShared>,
    layout: Rc<std::cell::RefCell<Arc<Layout>>>,
    metrics: Arc<ShardMetrics>,
    out: mpsc::Sender<Outgoing>,
    in_flight: Rc<Cell<usize>>,
    /// Requests this connection may still have in flight (`connection_requests_max`).
    requests: Arc<Semaphore>,
    /// Fetch-response bytes this connection may still hold (`connection_fetch_bytes_max`).
    fetch_bytes: Arc<Semaphore>,
    /// Its user's (before a login, or with authentication off, its source address's)
    /// share of the node's fetch budget (`fetch_bytes_per_user_max`).
    principal_bytes: std::cell::RefCell<Arc<crate::mailbox::PrincipalBudget>>,
    /// Becomes true when the client's side closed (or the connection is ending): a
    /// waiting fetch stops waiting and answers with what there is.
    reading_done: watch::Receiver<bool>,
    /// Fetches of this connection parked at a partition's end.
    waiting: Rc<Cell<u32>>,
    /// Who this connection logged in as.
    login: std::cell::RefCell<crate::login::Login>,
    /// A delayed login's slot among its user's ([`NodeShared::login_slots`]), held
    /// until the login ends.
    login_slot: std::cell::RefCell<Option<tokio::sync::OwnedSemaphorePermit>>,
    /// Its place among its user's connections, once logged in.
    user_slot: std::cell::RefCell<Option<crate::mailbox::UserSlot>>,
    /// The client's address, for the log lines that concern it.
    peer: Option<std::net::SocketAddr>,
    /// Its place among the strangers at the door, until it logs in.
    stranger: std::cell::RefCell<Option<StrangerSlot>>,
}

/// What the reader does after a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    /// Answer what is in flight, then close (a failed login).
    Close,
}

/// Starts serving a connection on the current shard, with what `context` gives of it.
pub(crate) fn spawn(
    context: ServeContext,
    stream: std::net::TcpStream,
    stranger: Option<StrangerSlot>,
) {
    let ServeContext {
        shared,
        layout,
        metrics,
        draining,
        access_changed,
    } = context;
    tokio::task::spawn_local(async move {
        let peer = stream.peer_addr().ok();
        // The slot the acceptor took for this connection goes back however it ends.
        let _slot = ConnectionSlot(Arc::clone(&shared));
        let stream = match stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(stream))
        {
            Ok(stream) => stream,
            Err(err) => {
                tracing::warn!(%err, "adopting a connection");
                return;
            }
        };
        let _ = stream.set_nodelay(true);
        add(&metrics.connections_total, 1);
        add(&metrics.connections_active, 1);
        let tls = shared.tls.clone();
        let context = ServeContext {
            shared,
            layout,
            metrics: Arc::clone(&metrics),
            draining,
            access_changed,
        };
        match tls {
            None => {
                let (reader, writer) = stream.into_split();
                serve(reader, writer, context, peer, stranger).await;
            }
            Some(tls) => {
                if let Some(stream) = handshake(&tls, stream, &context, peer).await {
                    let (reader, writer) = tokio::io::split(stream);
                    serve(reader, writer, context, peer, stranger).await;
                }
            }
        }
        metrics
            .connections_active
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(?peer, "connection closed");
    });
}

/// What serving a connection needs from its shard.
pub(crate) struct ServeContext {
    pub(crate) shared: Arc<NodeShared>,
    pub(crate) layout: Rc<std::cell::RefCell<Arc<Layout>>>,
    pub(crate) metrics: Arc<ShardMetrics>,
    pub(crate) draining: watch::Receiver<bool>,
    /// Changes with each new layout (users and grants included): a connection then
    /// checks that its login still holds.
    pub(crate) access_changed: watch::Receiver<u64>,
}

/// The TLS handshake of a new connection, or `None` (counted and logged) if it failed
/// or did not finish within the first-frame deadline: a client that opens a socket and
/// says nothing holds it no longer than one that sends no frame.
async fn handshake(
    tls: &crate::tls::ClientTls,
    stream: tokio::net::TcpStream,
    context: &ServeContext,
    peer: Option<std::net::SocketAddr>,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let limit = Duration::from_millis(context.shared.config.connection_first_frame_ms.max(1));
    let failure = match tokio::time::timeout(limit, tls.0.accept(stream)).await {
        Ok(Ok(stream)) => return Some(stream),
        Ok(Err(err)) => err.to_string(),
        Err(_) => "not finished in time".to_owned(),
    };
    add(&context.metrics.tls_handshake_failures, 1);
    tracing::info!(?peer, failure, "client TLS handshake failed");
    None
}

/// Accepts connections on shard 0 and hands them out round robin.
pub(crate) fn spawn_acceptor(
    shared: Arc<NodeShared>,
    mut draining: watch::Receiver<bool>,
    listener: std::net::TcpListener,
) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(%err, "adopting the client listener");
            return;
        }
    };
    tokio::task::spawn_local(async move {
        let mut next = 0usize;
        let mut last_refusal_logged = None;
        let mut last_stranger_logged = None;
        loop {
            tokio::select! {
                _ = draining.changed() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let max = shared.config.connections_max as usize;
                        let served = shared.connections.fetch_add(1, Ordering::AcqRel);
                        if served >= max {
                            shared.connections.fetch_sub(1, Ordering::AcqRel);
                            add(&shared.metrics[0].connections_refused, 1);
                            // One line per burst, not one per refused socket.
                            if last_refusal_logged.is_none_or(|at: tokio::time::Instant| at.elapsed() >= Duration::from_secs(10)) {
                                last_refusal_logged = Some(tokio::time::Instant::now());
                                tracing::warn!(%peer, connections_max = max, "refusing client connections: the node serves its maximum");
                            }
                            continue; // dropping the socket closes it
                        }
                        // Until it logs in, a connection holds a stranger's place: their
                        // own budget, per source too, so they never take the users'.
                        let stranger = if shared.config.authentication {
                            match StrangerSlot::take(&shared, peer.ip()) {
                                Ok(slot) => Some(slot),
                                Err(turned) => {
                                    shared.connections.fetch_sub(1, Ordering::AcqRel);
                                    add(&shared.metrics[0].strangers_refused, 1);
                                    if last_stranger_logged.is_none_or(|at: tokio::time::Instant| at.elapsed() >= Duration::from_secs(10)) {
                                        last_stranger_logged = Some(tokio::time::Instant::now());
                                        let limit = match turned {
                                            Turned::Node => "connections_unauthenticated_max",
                                            Turned::Source => "connections_unauthenticated_per_source_max",
                                        };
                                        tracing::warn!(%peer, limit, "refusing connections that have not logged in: the node holds its maximum of them");
                                    }
                                    continue;
                                }
                            }
                        } else {
                            None
                        };
                        let Ok(stream) = stream.into_std() else {
                            shared.connections.fetch_sub(1, Ordering::AcqRel);
                            continue;
                        };
                        let shard = next % shared.shards();
                        next += 1;
                        if shared.controls[shard].send(Control::Connection(stream, stranger)).is_err() {
                            shared.connections.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                    Err(err) => {
                        // Out of descriptors and the like: pause rather than spin.
                        tracing::warn!(%err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        tracing::info!("client listener closed");
    });
}

async fn serve<R, W>(
    mut reader: R,
    writer: W,
    context: ServeContext,
    peer: Option<std::net::SocketAddr>,
    stranger: Option<StrangerSlot>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + 'static,
{
    let ServeContext {
        shared,
        layout,
        metrics,
        mut draining,
        mut access_changed,
    } = context;
    let (out, outgoing) = mpsc::channel(OUTGOING_FRAMES_MAX);
    let mut writer_task = tokio::task::spawn_local(write_loop(
        writer,
        outgoing,
        Arc::clone(&shared),
        Arc::clone(&metrics),
    ));
    let mut writer_done = false;
    let requests = Arc::new(Semaphore::new(
        shared.config.connection_requests_max as usize,
    ));
    let fetch_bytes = Arc::new(Semaphore::new(
        shared.config.connection_fetch_bytes_max as usize,
    ));
    let (reading_done_tx, reading_done) = watch::channel(false);
    let address = peer.map_or_else(|| "unknown".to_owned(), |p| p.ip().to_string());
    let principal_bytes = shared.principal_budget(&format!("address {address}"));
    let env = Env {
        shared,
        layout,
        metrics,
        out,
        in_flight: Rc::new(Cell::new(0)),
        requests,
        fetch_bytes,
        reading_done,
        waiting: Rc::new(Cell::new(0)),
        login: std::cell::RefCell::default(),
        login_slot: std::cell::RefCell::default(),
        user_slot: std::cell::RefCell::default(),
        principal_bytes: std::cell::RefCell::new(principal_bytes),
        peer,
        stranger: std::cell::RefCell::new(stranger),
    };
    let login_needed = env.shared.config.authentication;
    let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut deadlines = Deadlines::new(&env.shared.config);
    let mut ended_login = None;
    let mut frame_permit = None;
    'read: loop {
        loop {
            // Until the connection logs in, frames are small: a stranger cannot make
            // the node hold `frame_bytes_max` per connection.
            let logged_in = !login_needed || env.login.borrow().user().is_some();
            let max = if logged_in {
                env.shared.config.frame_bytes_max
            } else {
                env.shared.config.connection_login_frame_bytes_max
            };
            match frame_length(&buf, REQUEST_HEADER_BYTES, max) {
                Ok(Some(total)) => {
                    let frame = buf.split_to(total);
                    // Received whole: its share of the node's budget goes back.
                    frame_permit = None;
                    deadlines.frame_done();
                    if handle_frame(&env, frame).await == Flow::Close {
                        break 'read;
                    }
                    if !logged_in && env.login.borrow().user().is_some() {
                        deadlines.logged_in();
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    refuse_stream(&env, &err).await;
                    break 'read;
                }
            }
        }
        if *draining.borrow() {
            break;
        }
        if frame_permit.is_none() {
            if let Some(total) = announced_total(&buf).filter(|t| *t > READ_CHUNK_BYTES) {
                // A large frame takes its length from the node's budget before its body
                // is read (until then its socket waits, pushing back through TCP), and
                // its room at once rather than by doubling.
                let Some(permit) = frame_budget(&env, total, &mut draining).await else {
                    break;
                };
                frame_permit = Some(permit);
                buf.reserve(total.saturating_sub(buf.len()));
            }
        }
        if buf.capacity() - buf.len() < READ_CHUNK_BYTES {
            buf.reserve(READ_CHUNK_BYTES);
        }
        let deadline = deadlines.next(!buf.is_empty(), env.in_flight.get() > 0);
        tokio::select! {
            () = tokio::time::sleep_until(deadline.at) => {
                if let Some(reason) = deadline.reason {
                    add(&env.metrics.connections_closed_deadline, 1);
                    tracing::info!(reason, "closing a client connection at its deadline");
                    break;
                }
            }
            read = reader.read_buf(&mut buf) => match read {
                Ok(0) => {
                    if !buf.is_empty() {
                        tracing::info!(bytes = buf.len(), "connection closed inside a frame");
                    }
                    break;
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::debug!(%err, "connection read failed");
                    break;
                }
            },
            _ = draining.changed() => {}
            // A deleted user or a new password ends the connections logged in with
            // the old credential at once, not at their next request.
            Ok(()) = access_changed.changed() => {
                ended_login = guard::lapsed_login(&env);
                if ended_login.is_some() {
                    break;
                }
            }
            // The writer stopped (the client reads nothing, or the socket failed): no
            // answer can go out, so nothing more is read.
            _ = &mut writer_task => {
                writer_done = true;
                break;
            }
        }
    }
    // Finish what was started: in-flight replies are still written, but waiting
    // fetches stop waiting (a client that went away must not hold the connection for
    // up to a minute).
    let _ = reading_done_tx.send(true);
    while env.in_flight.get() > 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    if let Some(user) = ended_login {
        // After the answers in flight (a user's own password change among them), so
        // the client's reader, which gives up on a connection-level error, has them.
        guard::send_lapsed(&env, 0, 0, &user).await;
    }
    drop(env);
    if !writer_done {
        let _ = writer_task.await;
    }
}

/// The length of the frame `buf` starts with, if its length field is in.
fn announced_total(buf: &[u8]) -> Option<usize> {
    let raw: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    Some(4 + u32::from_be_bytes(raw) as usize)
}

/// `bytes` of the node's frame budget for a frame being received, waited for (the
/// socket is not read meanwhile); `None` if the node drains first.
async fn frame_budget(
    env: &Env,
    bytes: usize,
    draining: &mut watch::Receiver<bool>,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let bytes = u32::try_from(bytes).ok()?;
    let budget = Arc::clone(&env.shared.frame_bytes);
    if let Ok(permit) = Arc::clone(&budget).try_acquire_many_owned(bytes) {
        return Some(permit);
    }
    add(&env.metrics.frame_budget_waits, 1);
    tokio::select! {
        permit = budget.acquire_many_owned(bytes) => permit.ok(),
        _ = draining.changed() => None,
    }
}

/// A counted client connection; its count is given back when it ends.
struct ConnectionSlot(Arc<NodeShared>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The stream can no longer be framed: answer once, with request id 0 and command 0
/// (the header may be garbage), then the caller closes.
async fn refuse_stream(env: &Env, err: &FrameError) {
    add(&env.metrics.frames_refused, 1);
    tracing::warn!(%err, "refusing an unframeable client stream; closing the connection");
    let (request_id, command) = (0, 0);
    let code = match err {
        FrameError::TooLarge { .. } => ErrorCode::FrameTooLarge,
        _ => ErrorCode::MalformedRequest,
    };
    send_error(
        env,
        request_id,
        command,
        &NodeError::new(code, err.to_string()),
    )
    .await;
}

/// The error response frame for a request.
fn error_frame(request_id: u64, command: u16, err: &NodeError) -> Vec<u8> {
    let mut frame = Vec::new();
    encode_error(
        &mut frame,
        request_id,
        command,
        err.code,
        &err.message,
        &err.details,
    );
    frame
}

async fn send_error(env: &Env, request_id: u64, command: u16, err: &NodeError) {
    env.metrics.error(err.code);
    let frame = error_frame(request_id, command, err);
    let _ = env.out.send(Outgoing::Frame(frame)).await;
}

/// Runs `work` for a reply without blocking the reader, once the connection has room
/// for another request in flight: until then the reader waits, and so does the socket.
async fn in_flight(env: &Env, work: impl std::future::Future<Output = ()> + 'static) {
    let permit = match Arc::clone(&env.requests).try_acquire_owned() {
        Ok(permit) => permit,
        Err(_) => {
            add(&env.metrics.connection_reads_paused, 1);
            match Arc::clone(&env.requests).acquire_owned().await {
                Ok(permit) => permit,
                Err(_) => return, // never closed
            }
        }
    };
    let counter = Rc::clone(&env.in_flight);
    counter.set(counter.get() + 1);
    tokio::task::spawn_local(async move {
        work.await;
        drop(permit);
        counter.set(counter.get() - 1);
    });
}

/// Shares of the connection's and the node's fetch-byte budgets for a fetch of up to
/// `bytes`, waited for (the reader, and so the socket, waits meanwhile).
async fn fetch_budget(env: &Env, bytes: u32) -> Option<FetchBudget> {
    let connection = match Arc::clone(&env.fetch_bytes).try_acquire_many_owned(bytes) {
        Ok(permit) => permit,
        Err(_) => {
            add(&env.metrics.connection_reads_paused, 1);
            Arc::clone(&env.fetch_bytes)
                .acquire_many_owned(bytes)
                .await
                .ok()?
        }
    };
    // A user's connections together hold at most its share: one that reads nothing
    // cannot take the node's whole budget with a few connections.
    let principal = Arc::clone(&env.principal_bytes.borrow());
    let principal_permit = match Arc::clone(&principal.bytes).try_acquire_many_owned(bytes) {
        Ok(permit) => permit,
        Err(_) => {
            add(&env.metrics.connection_reads_paused, 1);
            // Counted while it waits: the user's connections whose answers do not
            // move are then closed after `fetch_stall_contended_ms`.
            principal.waiting.fetch_add(1, Ordering::AcqRel);
            let permit = Arc::clone(&principal.bytes).acquire_many_owned(bytes).await;
            principal.waiting.fetch_sub(1, Ordering::AcqRel);
            permit.ok()?
        }
    };
    let node = match Arc::clone(&env.shared.fetch_bytes).try_acquire_many_owned(bytes) {
        Ok(permit) => permit,
        Err(_) => {
            add(&env.metrics.fetch_budget_waits, 1);
            // Counted while it waits: connections whose answers do not move are then
            // closed after `fetch_stall_contended_ms`, not the full write timeout.
            let waiting = &env.shared.fetch_budget_waiting;
            waiting.fetch_add(1, Ordering::AcqRel);
            let permit = Arc::clone(&env.shared.fetch_bytes)
                .acquire_many_owned(bytes)
                .await;
            waiting.fetch_sub(1, Ordering::AcqRel);
            permit.ok()?
        }
    };
    Some(FetchBudget::new(
        connection,
        principal_permit,
        node,
        principal,
    ))
}

fn route(
    env: &Env,
    stream: &str,
    topic: &str,
    partition: u32,
) -> Result<(Arc<TopicRoute>, PartitionKey), NodeError> {
    let layout = Arc::clone(&env.layout.borrow());
    let Some(route) = layout.topic(stream, topic) else {
        let code = if layout.streams.contains_key(stream) {
            ErrorCode::TopicNotFound
        } else {
            ErrorCode::StreamNotFound
        };
        return Err(NodeError::new(code, format!("no topic {stream}/{topic}")));
    };
    if route.partition(partition).is_none() {
        return Err(NodeError::new(
            ErrorCode::PartitionNotFound,
            format!("topic {stream}/{topic} has no partition {partition}"),
        ));
    }
    let key = PartitionKey {
        topic_id: route.id,
        partition,
    };
    Ok((Arc::clone(route), key))
}

fn shutting_down() -> NodeError {
    NodeError::new(ErrorCode::ShuttingDown, "node is shutting down")
}

async fn handle_frame(env: &Env, mut frame: BytesMut) -> Flow {
    let Ok((header, body)) = split_request(&frame) else {
        return Flow::Continue;
    };
    let (request_id, code) = (header.request_id, header.command);
    let Some(command) = Command::from_u16(code) else {
        tracing::info!(command = code, "unknown command");
        let err = NodeError::new(ErrorCode::UnknownCommand, format!("unknown command {code}"));
        send_error(env, request_id, code, &err).await;
        return Flow::Continue;
    };
    env.metrics.request(command);
    if request_id == 0 {
        // Id 0 is the node's, for answers to a stream it cannot frame.
        let err = NodeError::new(
            ErrorCode::InvalidArgument,
            "request id 0 is reserved for the node's connection-level errors",
        );
        send_error(env, request_id, code, &err).await;
        return Flow::Continue;
    }
    let request = match Request::decode(command, body) {
        Ok(request) => request,
        Err(err) => {
            // A bad name or a number out of its range is a bad argument of a
            // well-formed request; anything else could not be decoded at all.
            let code_for = match err {
                braid_proto::wire::WireError::InvalidName { .. }
                | braid_proto::wire::WireError::OutOfRange { .. } => ErrorCode::InvalidArgument,
                _ => ErrorCode::MalformedRequest,
            };
            tracing::info!(?command, %err, "refused request");
            let err = NodeError::new(code_for, err.to_string());
            send_error(env, request_id, code, &err).await;
            return Flow::Continue;
        }
    };
    if let Some(user) = guard::lapsed_login(env) {
        guard::send_lapsed(env, request_id, code, &user).await;
        return Flow::Close;
    }
    if let Err(err) = guard::admit(env, &request) {
        add(&env.metrics.permission_denials, 1);
        send_error(env, request_id, code, &err).await;
        return Flow::Continue;
    }
    let about_the_member = matches!(
        request,
        Request::Ping | Request::Authenticate { .. } | Request::NodeStatus
    );
    if !about_the_member
        && !env
            .shared
            .metadata_caught_up
            .load(std::sync::atomic::Ordering::Relaxed)
    {
        let err = NodeError::new(
            ErrorCode::NotLeader,
            format!(
                "member {} is catching up its metadata after its start; retry, or ask \
                 another member",
                env.shared.cluster.node_id
            ),
        );
        send_error(env, request_id, code, &err).await;
        return Flow::Continue;
    }
    let result = match request {
        Request::Ping => {
            let mut out = Vec::new();
            Response::Empty.encode(request_id, command, &mut out);
            let _ = env.out.send(Outgoing::Frame(out)).await;
            return Flow::Continue;
        }
        Request::Authenticate { mechanism, message } => {
            return guard::authenticate(env, request_id, mechanism, message).await;
        }
        Request::ClusterInfo => {
            let mut out = Vec::new();
            listing::cluster_info(env).encode(request_id, command, &mut out);
            let _ = env.out.send(Outgoing::Frame(out)).await;
            return Flow::Continue;
        }
        Request::NodeStatus => {
            let mut out = Vec::new();
            listing::node_status(env).encode(request_id, command, &mut out);
            let _ = env.out.send(Outgoing::Frame(out)).await;
            return Flow::Continue;
        }
        Request::ListStreams => {
            let mut out = Vec::new();
            listing::list_streams(env).encode(request_id, command, &mut out);
            let _ = env.out.send(Outgoing::Frame(out)).await;
            return Flow::Continue;
        }
        Request::Produce {
            stream,
            topic,
            partition,
            batch,
        } => {
            // The batch is the last field: split it off the frame without copying.
            let start = batch.as_ptr() as usize - frame.as_ptr() as usize;
            match route(env, stream, topic, partition) {
                Ok((route, key)) => {
                    let batch = frame.split_off(start);
                    produce::produce(env, request_id, route, key, batch).await
                }
                Err(err) => Err(err),
            }
        }
        Request::Fetch { max_wait_ms, .. } if max_wait_ms > FETCH_WAIT_MS_MAX => {
            Err(NodeError::new(
                ErrorCode::InvalidArgument,
                format!("max_wait_ms {max_wait_ms} exceeds {FETCH_WAIT_MS_MAX}"),
            ))
        }
        Request::Fetch {
            stream,
            topic,
            partition,
            offset,
            max_bytes,
            max_wait_ms,
        } => match route(env, stream, topic, partition) {
            Ok((_, key)) => {
                let reader = guard::Reader::of(env, stream);
                fetch(env, request_id, key, offset, max_bytes, max_wait_ms, reader).await
            }
            Err(err) => Err(err),
        },
        Request::ListOffsets {
            stream,
            topic,
            partition,
            spec,
        } => match route(env, stream, topic, partition) {
            Ok((_, key)) => list_offsets(env, request_id, key, spec).await,
            Err(err) => Err(err),
        },
        other => {
            let user = env.login.borrow().user().map(str::to_owned);
            match admin_request(&other, user.as_deref()) {
                Some(admin) => admin_call(env, request_id, command, admin).await,
                None => Err(NodeError::new(
                    ErrorCode::Internal,
                    "request has no handler",
                )),
            }
        }
    };
    if let Err(err) = result {
        send_error(env, request_id, code, &err).await;
    }
    Flow::Continue
}

/// Sends a fetch to the partition's owner; the answer comes on the returned receiver
/// (at once, or with `wait` at the next commit).
async fn ask_fetch(
    shared: &NodeShared,
    key: PartitionKey,
    offset: u64,
    max_bytes: u32,
    wait: bool,
) -> Result<oneshot::Receiver<Result<FetchOutcome, NodeError>>, NodeError> {
    let (reply, answer) = oneshot::channel();
    let owner = key.shard(shared.shards());
    shared.inboxes[owner]
        .send(ShardRequest::Fetch {
            key,
            offset,
            max_bytes,
            wait,
            reply,
        })
        .await
        .map_err(|_| shutting_down())?;
    Ok(answer)
}

/// A fetch's answer: at once, or after waiting up to `wait` for a commit (a wait ended
/// early by the client's close, or by its end, asks again without waiting).
async fn fetch_answer(
    shared: &NodeShared,
    key: PartitionKey,
    offset: u64,
    max_bytes: u32,
    wait: Option<Duration>,
    reading_done: &mut watch::Receiver<bool>,
) -> Result<FetchOutcome, NodeError> {
    let answer = ask_fetch(shared, key, offset, max_bytes, wait.is_some()).await?;
    let Some(wait) = wait else {
        return answer.await.map_err(|_| shutting_down())?;
    };
    let waited = tokio::select! {
        answered = tokio::time::timeout(wait, answer) => answered.ok(),
        _ = reading_done.wait_for(|done| *done) => None,
    };
    match waited {
        Some(answered) => answered.map_err(|_| shutting_down())?,
        // Dropping the receiver tells the owner this fetch no longer waits.
        None => ask_fetch(shared, key, offset, max_bytes, false)
            .await?
            .await
            .map_err(|_| shutting_down())?,
    }
}

async fn fetch(
    env: &Env,
    request_id: u64,
    key: PartitionKey,
    offset: u64,
    max_bytes: u32,
    max_wait_ms: u32,
    reader: guard::Reader,
) -> Result<(), NodeError> {
    let shared = Arc::clone(&env.shared);
    let out = env.out.clone();
    let metrics = Arc::clone(&env.metrics);
    let mut reading_done = env.reading_done.clone();
    // A connection parks at most `connection_waiting_fetches_max` fetches; more are
    // answered at once (empty at the end of the log), never refused.
    let mut wait = Some(Duration::from_millis(
        max_wait_ms.min(FETCH_WAIT_MS_MAX).into(),
    ))
    .filter(|w| !w.is_zero());
    if wait.is_some() && env.waiting.get() >= shared.config.connection_waiting_fetches_max {
        add(&env.metrics.fetch_waits_refused, 1);
        wait = None;
    }
    let waiting = wait.map(|_| {
        env.waiting.set(env.waiting.get() + 1);
        WaitingSlot(Rc::clone(&env.waiting))
    });
    // A fetch reads at most what one connection may hold, and holds that much of both
    // budgets until its answer is written.
    let max_bytes = max_bytes.clamp(1, shared.config.connection_fetch_bytes_max);
    let Some(budget) = fetch_budget(env, max_bytes).await else {
        return Err(shutting_down());
    };
    in_flight(env, async move {
        let outcome = fetch_answer(&shared, key, offset, max_bytes, wait, &mut reading_done).await;
        // Checked again once the answer is ready: a revoke (or the login's lapse) while
        // the fetch waited must not hand it the records that came after.
        let outcome = outcome.and_then(|answer| reader.still_allowed().map(|()| answer));
        drop(waiting);
        let item = match outcome {
            Ok(FetchOutcome {
                high_watermark,
                start_offset,
                read,
            }) => {
                let mut prefix = Vec::with_capacity(48);
                encode_fetch_prefix(
                    &mut prefix,
                    request_id,
                    high_watermark,
                    start_offset,
                    read.bytes().len() as u32,
                );
                Outgoing::Fetch(prefix, read, budget)
            }
            Err(err) => {
                metrics.error(err.code);
                Outgoing::Frame(error_frame(request_id, Command::Fetch as u16, &err))
            }
        };
        let _ = out.send(item).await;
    })
    .await;
    Ok(())
}

/// One of a connection's parked fetches, counted until dropped.
struct WaitingSlot(Rc<Cell<u32>>);

impl Drop for WaitingSlot {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

async fn list_offsets(
    env: &Env,
    request_id: u64,
    key: PartitionKey,
    spec: braid_proto::client::OffsetSpec,
) -> Result<(), NodeError> {
    let (reply, answer) = oneshot::channel();
    let owner = key.shard(env.shared.shards());
    env.shared.inboxes[owner]
        .send(ShardRequest::ListOffsets { key, spec, reply })
        .await
        .map_err(|_| shutting_down())?;
    reply_later(env, request_id, Command::ListOffsets, async move {
        answer
            .await
            .map_err(|_| shutting_down())?
            .map(Response::Offset)
    })
    .await;
    Ok(())
}

async fn admin_call(
    env: &Env,
    request_id: u64,
    command: Command,
    request: crate::admin::AdminRequest,
) -> Result<(), NodeError> {
    let (reply, answer) = oneshot::channel();
    env.shared.inboxes[0]
        .send(ShardRequest::Admin { request, reply })
        .await
        .map_err(|_| shutting_down())?;
    reply_later(env, request_id, command, async move {
        answer.await.map_err(|_| shutting_down())?
    })
    .await;
    Ok(())
}

async fn reply_later(
    env: &Env,
    request_id: u64,
    command: Command,
    work: impl std::future::Future<Output = Result<Response, NodeError>> + 'static,
) {
    let out = env.out.clone();
    let metrics = Arc::clone(&env.metrics);
    in_flight(env, async move {
        let mut frame = Vec::new();
        match work.await {
            Ok(response) => response.encode(request_id, command, &mut frame),
            Err(err) => {
                metrics.error(err.code);
                frame = error_frame(request_id, command as u16, &err);
            }
        }
        let _ = out.send(Outgoing::Frame(frame)).await;
    })
    .await;
}
