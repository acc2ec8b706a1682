//! One connection to a node, shared by every caller: requests are pipelined, each
//! answered by the response with its request id. [`crate::Client`] holds one per
//! cluster member and routes each request to the right one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use braid_proto::client::{
    frame_length, split_response, Command, Request, Response, RESPONSE_HEADER_BYTES,
};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::error::ClientError;
use crate::options::{ConnectOptions, Credentials};

/// Largest response frame the client accepts (the node's default maximum plus room).
const RESPONSE_BYTES_MAX: u32 = 64 << 20;

type Waiter = oneshot::Sender<Result<Response, ClientError>>;

#[derive(Debug, Default)]
struct Pending {
    waiters: HashMap<u64, (Command, Waiter)>,
    /// Set when the connection failed: later calls fail at once.
    failed: Option<ClientError>,
}

/// Held by every clone of a [`Connection`] and by nothing else: when the last clone goes,
/// the frame queue closes, the writer shuts the socket and the node ends the
/// connection (the reader holds only `pending`).
#[derive(Debug)]
struct Inner {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    /// The address it was made to, as the caller named it.
    addr: String,
}

/// A connection to one Braid node. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    inner: Arc<Inner>,
}

/// What a fetch returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// Offset after the last committed record of the partition.
    pub high_watermark: u64,
    /// Earliest offset stored.
    pub start_offset: u64,
    /// Whole batches, as stored (possibly starting before the offset asked for).
    pub batches: bytes::Bytes,
}

impl Connection {
    /// Connects to the node at `addr` (`HOST:PORT`) with TLS and a login as
    /// `options` say.
    ///
    /// # Errors
    /// [`ClientError::Io`] if the connection or the TLS handshake fails,
    /// [`ClientError::Server`] with `AuthenticationFailed` for a refused login,
    /// [`ClientError::Authentication`] if the node could not prove it knows the user.
    pub(crate) async fn connect_with(
        addr: &str,
        options: &ConnectOptions,
    ) -> Result<Self, ClientError> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        watch_for_a_dead_peer(&stream, options.dead_peer_timeout)?;
        let origin = addr.to_owned();
        let client = match &options.tls {
            None => {
                let (reader, writer) = stream.into_split();
                Self::start(reader, writer, origin)
            }
            Some(tls) => {
                let name = tls.server_name_for(addr)?;
                let stream = tls.connector().connect(name, stream).await?;
                let (reader, writer) = tokio::io::split(stream);
                Self::start(reader, writer, origin)
            }
        };
        if let Some(credentials) = &options.credentials {
            client.login(credentials).await?;
        }
        Ok(client)
    }

    /// Whether the connection has failed (every call on it fails at once).
    pub(crate) fn is_closed(&self) -> bool {
        self.inner
            .pending
            .lock()
            .map_or(true, |pending| pending.failed.is_some())
    }

    /// The address it was made to.
    pub(crate) fn addr(&self) -> &str {
        &self.inner.addr
    }

    fn start<R, W>(mut reader: R, mut writer: W, addr: String) -> Self
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (frames, mut outgoing) = mpsc::unbounded_channel::<Vec<u8>>();
        let pending = Arc::new(Mutex::new(Pending::default()));
        let inner = Arc::new(Inner {
            frames,
            pending: Arc::clone(&pending),
            next_id: AtomicU64::new(1),
            addr,
        });
        tokio::spawn(async move {
            while let Some(frame) = outgoing.recv().await {
                if writer.write_all(&frame).await.is_err() {
                    return;
                }
            }
            // Every clone is gone: say so, and the node closes its side.
            let _ = writer.shutdown().await;
        });
        tokio::spawn(async move {
            let failure = read_loop(&mut reader, &pending).await;
            let waiters = match pending.lock() {
                Ok(mut pending) => {
                    pending.failed = Some(failure.clone());
                    std::mem::take(&mut pending.waiters)
                }
                Err(_) => HashMap::new(),
            };
            for (_, (_, waiter)) in waiters {
                let _ = waiter.send(Err(failure.clone()));
            }
        });
        Self { inner }
    }

    /// Logs in as `credentials.user` (SCRAM-SHA-256: two round trips; the PBKDF2 work
    /// runs off the async threads).
    ///
    /// # Errors
    /// As [`Connection::connect_with`].
    pub(crate) async fn login(&self, credentials: &Credentials) -> Result<(), ClientError> {
        use braid_proto::scram::{nonce_from, ScramClient, MECHANISM};
        let auth = |e: braid_proto::scram::ScramError| ClientError::Authentication(e.to_string());
        let mut random = [0u8; 18];
        getrandom::getrandom(&mut random)
            .map_err(|e| ClientError::Authentication(format!("drawing a nonce: {e}")))?;
        let scram = ScramClient::new(&credentials.user, &nonce_from(&random)).map_err(auth)?;
        let first = self
            .authenticate_step(MECHANISM, scram.client_first().into_bytes())
            .await?;
        let password = credentials.password.clone();
        let (scram, last) = tokio::task::spawn_blocking(move || scram.answer(&first, &password))
            .await
            .map_err(|e| ClientError::Authentication(e.to_string()))?
            .map_err(auth)?;
        let reply = self.authenticate_step(MECHANISM, last.into_bytes()).await?;
        scram.verify(&reply).map_err(auth)
    }

    async fn authenticate_step(
        &self,
        mechanism: &str,
        message: Vec<u8>,
    ) -> Result<String, ClientError> {
        let request = Request::Authenticate {
            mechanism,
            message: &message,
        };
        match self.call(&request).await? {
            Response::Authenticated(reply) => String::from_utf8(reply)
                .map_err(|_| ClientError::Authentication("the node's answer is not UTF-8".into())),
            other => Err(unexpected(&other)),
        }
    }

    /// Sends a request now (so calls made in order reach the node in order) and returns
    /// a future of its response.
    pub(crate) fn start_call(
        &self,
        request: &Request<'_>,
    ) -> impl std::future::Future<Output = Result<Response, ClientError>> + Send + 'static {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (waiter, answer) = oneshot::channel();
        let mut frame = Vec::new();
        request.encode(id, &mut frame);
        let registered = match self.inner.pending.lock() {
            Ok(mut pending) => match &pending.failed {
                Some(err) => Err(err.clone()),
                None => {
                    pending.waiters.insert(id, (request.command(), waiter));
                    Ok(())
                }
            },
            Err(_) => Err(ClientError::Closed),
        };
        let sent = registered.and_then(|()| {
            self.inner
                .frames
                .send(frame)
                .map_err(|_| ClientError::Closed)
        });
        async move {
            sent?;
            answer.await.map_err(|_| ClientError::Closed)?
        }
    }

    /// Sends a request and waits for its response.
    ///
    /// # Errors
    /// [`ClientError::Server`] with the node's code and message, or a connection error.
    pub(crate) async fn call(&self, request: &Request<'_>) -> Result<Response, ClientError> {
        self.start_call(request).await
    }
}

/// Makes the kernel drop the connection once the node stops acknowledging for
/// `timeout`: unacknowledged sends (TCP_USER_TIMEOUT) and, when idle, keepalive probes
/// from a third of it on, every second.
fn watch_for_a_dead_peer(
    stream: &tokio::net::TcpStream,
    timeout: std::time::Duration,
) -> std::io::Result<()> {
    if timeout.is_zero() {
        return Ok(());
    }
    let socket = socket2::SockRef::from(stream);
    let second = std::time::Duration::from_secs(1);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time((timeout / 3).max(second))
        .with_interval(second);
    socket.set_tcp_keepalive(&keepalive)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    socket.set_tcp_user_timeout(Some(timeout))?;
    Ok(())
}

pub(crate) fn unexpected(response: &Response) -> ClientError {
    ClientError::Protocol(format!("unexpected response {response:?}"))
}

async fn read_loop<R: AsyncRead + Unpin>(reader: &mut R, pending: &Mutex<Pending>) -> ClientError {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        loop {
            let total =
                match frame_length(&buf, RESPONSE_HEADER_BYTES, RESPONSE_BYTES_MAX) {
                    Ok(Some(total)) => total,
                    Ok(None) => break,
                    Err(_) if speaks_tls(&buf) => return ClientError::Protocol(
                        "the node speaks TLS: connect with TLS (the SDK's ConnectOptions::tls, \
                         the CLI's --tls-ca or BRAID_TLS_CA)"
                            .into(),
                    ),
                    Err(err) => return ClientError::Protocol(err.to_string()),
                };
            let frame = buf.split_to(total).freeze();
            let (header, body) = match split_response(&frame) {
                Ok(split) => split,
                Err(err) => return ClientError::Protocol(err.to_string()),
            };
            let waiter = match pending.lock() {
                Ok(mut pending) => pending.waiters.remove(&header.request_id),
                Err(_) => return ClientError::Closed,
            };
            let Some((command, waiter)) = waiter else {
                if header.request_id == 0 && header.status != 0 {
                    // The node refused the stream as a whole and is closing it.
                    return ClientError::from_response(header.status, body);
                }
                continue;
            };
            let result = if header.status == 0 {
                // Fetched batches stay in the frame's buffer: no copy of a large read.
                Response::decode_shared(command, &frame.slice_ref(body))
                    .map_err(|e| ClientError::Protocol(e.to_string()))
            } else {
                Err(ClientError::from_response(header.status, body))
            };
            let _ = waiter.send(result);
        }
        // Room for the rest of a frame whose length is known, in one allocation (a
        // large fetch answer would otherwise grow, and be copied, step by step).
        let announced = buf
            .get(..4)
            .map(|raw| 4 + u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize);
        let want = announced.map_or(0, |total| total.saturating_sub(buf.len()));
        buf.reserve(want.max(64 * 1024));
        match reader.read_buf(&mut buf).await {
            Ok(0) => return ClientError::Closed,
            Ok(_) => {}
            Err(err) => return err.into(),
        }
    }
}

/// The address a client connects to by default: the node's default client port.
pub fn default_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7070))
}

/// Whether `answer` starts like a TLS record (an alert or a handshake, TLS 1.0 to 1.3):
/// what a TLS node answers a client that did not start TLS (read as a frame length,
/// 352,518,912 bytes).
fn speaks_tls(answer: &[u8]) -> bool {
    matches!(answer, [0x15 | 0x16, 0x03, 0x01..=0x04, ..])
}
