//! One connection to a node, shared by every caller: requests are pipelined, each
//! answered by the response with its request id.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use braid_proto::client::{
    decode_error_message, error_code, frame_length, split_response, Command, OffsetSpec, Request,
    Response, StreamSummary, TopicInfo, TopicSettings, TopicSummary, RESPONSE_HEADER_BYTES,
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

/// Held by every clone of a [`Client`] and by nothing else: when the last clone goes,
/// the frame queue closes, the writer shuts the socket and the node ends the
/// connection (the reader holds only `pending`).
#[derive(Debug)]
struct Inner {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    /// Where and how this connection was made, so it can be made again.
    origin: Origin,
}

/// The address and options a connection was made with.
#[derive(Debug, Clone)]
struct Origin {
    addr: String,
    options: ConnectOptions,
}

/// A connection to a Braid node. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
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

impl Client {
    /// Connects to a node over plain TCP, without a login.
    ///
    /// # Errors
    /// [`ClientError::Io`] if the connection fails.
    pub async fn connect(addr: impl tokio::net::ToSocketAddrs) -> Result<Self, ClientError> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let origin = Origin {
            addr: stream.peer_addr()?.to_string(),
            options: ConnectOptions::default(),
        };
        let (reader, writer) = stream.into_split();
        Ok(Self::start(reader, writer, origin))
    }

    /// A new connection made as this one was (same address, TLS and login), for a
    /// caller whose connection failed.
    ///
    /// # Errors
    /// As [`Client::connect_with`].
    pub async fn reconnect(&self) -> Result<Self, ClientError> {
        let origin = &self.inner.origin;
        Self::connect_with(&origin.addr, &origin.options).await
    }

    /// Whether the connection has failed (every call on it fails at once).
    pub fn is_closed(&self) -> bool {
        self.inner
            .pending
            .lock()
            .map_or(true, |pending| pending.failed.is_some())
    }

    /// Connects to the node at `addr` (`HOST:PORT`) with TLS and a login as
    /// `options` say.
    ///
    /// # Errors
    /// [`ClientError::Io`] if the connection or the TLS handshake fails,
    /// [`ClientError::Server`] with `AuthenticationFailed` for a refused login,
    /// [`ClientError::Authentication`] if the node could not prove it knows the user.
    pub async fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Self, ClientError> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let origin = Origin {
            addr: addr.to_owned(),
            options: options.clone(),
        };
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

    fn start<R, W>(mut reader: R, mut writer: W, origin: Origin) -> Self
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
            origin,
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
    /// As [`Client::connect_with`].
    pub async fn login(&self, credentials: &Credentials) -> Result<(), ClientError> {
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
    pub fn start_call(
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
    pub async fn call(&self, request: &Request<'_>) -> Result<Response, ClientError> {
        self.start_call(request).await
    }

    /// Checks the node answers.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn ping(&self) -> Result<(), ClientError> {
        self.call(&Request::Ping).await.map(|_| ())
    }

    /// Creates a stream.
    ///
    /// # Errors
    /// As [`Client::call`]; `StreamExists` if it exists.
    pub async fn create_stream(&self, name: &str) -> Result<(), ClientError> {
        self.call(&Request::CreateStream { name }).await.map(|_| ())
    }

    /// Deletes a stream with its topics.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn delete_stream(&self, name: &str) -> Result<(), ClientError> {
        self.call(&Request::DeleteStream { name }).await.map(|_| ())
    }

    /// Lists streams.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_streams(&self) -> Result<Vec<StreamSummary>, ClientError> {
        match self.call(&Request::ListStreams).await? {
            Response::Streams(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// Creates a topic; settings left at 0 take the node's defaults.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn create_topic(
        &self,
        stream: &str,
        topic: &str,
        settings: TopicSettings,
    ) -> Result<(), ClientError> {
        let request = Request::CreateTopic {
            stream,
            topic,
            settings,
        };
        self.call(&request).await.map(|_| ())
    }

    /// Deletes a topic and its data.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn delete_topic(&self, stream: &str, topic: &str) -> Result<(), ClientError> {
        self.call(&Request::DeleteTopic { stream, topic })
            .await
            .map(|_| ())
    }

    /// Lists the topics of a stream.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_topics(&self, stream: &str) -> Result<Vec<TopicSummary>, ClientError> {
        match self.call(&Request::ListTopics { stream }).await? {
            Response::Topics(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// A topic's settings and partitions with their offsets.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn describe_topic(
        &self,
        stream: &str,
        topic: &str,
    ) -> Result<TopicInfo, ClientError> {
        match self.call(&Request::DescribeTopic { stream, topic }).await? {
            Response::Topic(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// Appends one encoded batch to a partition; returns (base offset, last offset).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn produce(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
        batch: &[u8],
    ) -> Result<(u64, u64), ClientError> {
        let request = Request::Produce {
            stream,
            topic,
            partition,
            batch,
        };
        match self.call(&request).await? {
            Response::Produced {
                base_offset,
                last_offset,
            } => Ok((base_offset, last_offset)),
            other => Err(unexpected(&other)),
        }
    }

    /// Reads committed batches from `offset`, waiting up to `max_wait_ms` at the end.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn fetch(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait_ms: u32,
    ) -> Result<Fetched, ClientError> {
        let request = Request::Fetch {
            stream,
            topic,
            partition,
            offset,
            max_bytes,
            max_wait_ms,
        };
        match self.call(&request).await? {
            Response::Fetched {
                high_watermark,
                start_offset,
                batches,
            } => Ok(Fetched {
                high_watermark,
                start_offset,
                batches,
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// The earliest, latest or by-timestamp offset of a partition.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_offset(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
        spec: OffsetSpec,
    ) -> Result<Option<u64>, ClientError> {
        let request = Request::ListOffsets {
            stream,
            topic,
            partition,
            spec,
        };
        match self.call(&request).await? {
            Response::Offset(offset) => Ok(offset),
            other => Err(unexpected(&other)),
        }
    }

    /// The consumer groups of a stream.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_groups(
        &self,
        stream: &str,
    ) -> Result<Vec<braid_proto::client::GroupSummary>, ClientError> {
        match self.call(&Request::ListGroups { stream }).await? {
            Response::Groups(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// A group's members, assignment, committed offsets and high watermarks.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn describe_group(
        &self,
        stream: &str,
        group: &str,
    ) -> Result<braid_proto::client::GroupDescription, ClientError> {
        match self.call(&Request::DescribeGroup { stream, group }).await? {
            Response::Group(description) => Ok(description),
            other => Err(unexpected(&other)),
        }
    }
}

impl Client {
    /// The cluster's members and each partition's primary, as the node connected to
    /// knows them (only topics of streams the user may see).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn cluster_info(&self) -> Result<braid_proto::client::ClusterInfo, ClientError> {
        match self.call(&Request::ClusterInfo).await? {
            Response::Cluster(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }
}

/// Users and permissions (the node permission `users` is needed for each).
impl Client {
    /// Creates `name` with `password`. The SCRAM credential is derived here, with a
    /// fresh salt and [`braid_proto::scram::ITERATIONS_DEFAULT`] iterations: the
    /// password itself is never sent.
    ///
    /// # Errors
    /// As [`Client::call`]; `UserExists` if the name is taken.
    pub async fn create_user(&self, name: &str, password: &str) -> Result<(), ClientError> {
        use braid_proto::scram::{ScramCredential, ITERATIONS_DEFAULT, SALT_BYTES};
        let mut salt = [0u8; SALT_BYTES];
        getrandom::getrandom(&mut salt)
            .map_err(|e| ClientError::Invalid(format!("drawing a salt: {e}")))?;
        let password = password.to_owned();
        let credential = tokio::task::spawn_blocking(move || {
            ScramCredential::derive(&password, &salt, ITERATIONS_DEFAULT)
        })
        .await
        .map_err(|e| ClientError::Invalid(e.to_string()))?;
        self.call(&Request::CreateUser {
            name,
            salt: &credential.salt,
            iterations: credential.iterations,
            stored_key: &credential.stored_key,
            server_key: &credential.server_key,
        })
        .await
        .map(|_| ())
    }

    /// Deletes a user and its grants; its open connections lose every permission.
    ///
    /// # Errors
    /// As [`Client::call`]; `UserNotFound`.
    pub async fn delete_user(&self, name: &str) -> Result<(), ClientError> {
        self.call(&Request::DeleteUser { name }).await.map(|_| ())
    }

    /// Every user with its grants.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_users(&self) -> Result<Vec<braid_proto::client::UserSummary>, ClientError> {
        match self.call(&Request::ListUsers).await? {
            Response::Users(users) => Ok(users),
            other => Err(unexpected(&other)),
        }
    }

    /// Adds permissions on a resource to a user; effective on its open connections at
    /// their next request.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn grant(
        &self,
        user: &str,
        grant: braid_proto::client::Grant,
    ) -> Result<(), ClientError> {
        self.call(&Request::GrantPermissions { user, grant })
            .await
            .map(|_| ())
    }

    /// Takes permissions on a resource from a user.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn revoke(
        &self,
        user: &str,
        grant: braid_proto::client::Grant,
    ) -> Result<(), ClientError> {
        self.call(&Request::RevokePermissions { user, grant })
            .await
            .map(|_| ())
    }
}

pub(crate) fn unexpected(response: &Response) -> ClientError {
    ClientError::Protocol(format!("unexpected response {response:?}"))
}

async fn read_loop<R: AsyncRead + Unpin>(reader: &mut R, pending: &Mutex<Pending>) -> ClientError {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        loop {
            let total = match frame_length(&buf, RESPONSE_HEADER_BYTES, RESPONSE_BYTES_MAX) {
                Ok(Some(total)) => total,
                Ok(None) => break,
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
                    let message = decode_error_message(body).unwrap_or_default();
                    return ClientError::Server {
                        code: error_code(header.status),
                        message,
                    };
                }
                continue;
            };
            let result = if header.status == 0 {
                // Fetched batches stay in the frame's buffer: no copy of a large read.
                Response::decode_shared(command, &frame.slice_ref(body))
                    .map_err(|e| ClientError::Protocol(e.to_string()))
            } else {
                Err(ClientError::Server {
                    code: error_code(header.status),
                    message: decode_error_message(body)
                        .unwrap_or_else(|e| format!("undecodable message: {e}")),
                })
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
