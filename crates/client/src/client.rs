//! [`Client`]: a handle on a Braid cluster (or one node, a cluster of one). It keeps a
//! connection to each member it can reach and the map of who leads what from the last
//! `ClusterInfo`, and sends each request to the member that serves it (see
//! [`crate::routes`]). A `NotLeader` answer or a dead connection marks the map stale;
//! [`Client::refresh`] asks again, and the producer and consumer call it before they
//! retry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use braid_proto::client::{ClusterInfo, ErrorCode, Request, Response};

use crate::connection::{unexpected, Connection};
use crate::error::ClientError;
use crate::options::{ConnectOptions, Credentials};
use crate::routes::{Routes, Target};

/// How long dialling one member may take before the client moves on (a blackholed
/// member would otherwise hold a refresh for the OS's connect timeout).
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one open connection may take to say who leads what before a refresh asks
/// the next: a member that vanished without a FIN (its link down) still looks open
/// until the dead-peer timeout, and would hold every refresh that long.
const INFO_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a refresh waits for more answers once one member has answered.
const ANSWER_GRACE: Duration = Duration::from_millis(50);

/// How long a refresh waits for members it dials; the dials go on in the background
/// (a member that is down must not hold every refresh for a dial timeout).
const DIAL_WAIT: Duration = Duration::from_millis(200);

/// How long, and how far apart at most, [`Client::call`] sends a request again that
/// went to the wrong member (see [`Client::may_repeat`]): a failover takes a
/// heartbeat timeout and a view change.
const REPEAT_FOR: Duration = Duration::from_secs(10);
const REPEAT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A handle on a Braid cluster. Cheap to clone; clones share connections and routes.
#[derive(Debug, Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// TLS and login for every connection (a later [`Client::login`] joins it).
    options: Mutex<ConnectOptions>,
    /// The addresses the caller gave, tried when no known member answers.
    seeds: Vec<String>,
    state: Mutex<State>,
    /// One refresh at a time; callers that queued behind it reuse its answer.
    refreshing: tokio::sync::Mutex<u64>,
}

#[derive(Debug)]
struct State {
    /// The connection for requests any member serves.
    home: Connection,
    /// Open connections by member id.
    links: HashMap<u8, Connection>,
    routes: Routes,
    /// Set by a `NotLeader` or a lost connection: the routes may be wrong.
    stale: bool,
    /// Refreshes done (a caller that waited for one need not start another).
    generation: u64,
    /// Members being dialled in the background.
    dialling: std::collections::HashSet<u8>,
}

impl Client {
    /// Connects to a node over plain TCP, without a login, and learns the cluster
    /// from it.
    ///
    /// # Errors
    /// [`ClientError::Io`] if the connection fails.
    pub async fn connect(addr: impl tokio::net::ToSocketAddrs) -> Result<Self, ClientError> {
        let addr = tokio::net::lookup_host(addr)
            .await?
            .next()
            .ok_or_else(|| ClientError::Invalid("the address resolves to nothing".into()))?;
        Self::connect_with(&addr.to_string(), &ConnectOptions::default()).await
    }

    /// Connects to the node at `addr` (`HOST:PORT`) with TLS and a login as `options`
    /// say, and learns the cluster from it.
    ///
    /// # Errors
    /// [`ClientError::Io`] if the connection or the TLS handshake fails,
    /// [`ClientError::Server`] with `AuthenticationFailed` for a refused login,
    /// [`ClientError::Authentication`] if the node could not prove it knows the user.
    pub async fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Self, ClientError> {
        Self::connect_cluster(&[addr], options).await
    }

    /// Connects to the first of `seeds` (`HOST:PORT` of cluster members) that answers,
    /// and learns the rest of the cluster from it.
    ///
    /// # Errors
    /// The last member's error if none answers; [`ClientError::Invalid`] for no seeds.
    pub async fn connect_cluster(
        seeds: &[&str],
        options: &ConnectOptions,
    ) -> Result<Self, ClientError> {
        let mut last = ClientError::Invalid("no address to connect to".into());
        for seed in seeds {
            match Connection::connect_with(seed, options).await {
                Ok(home) => {
                    let client = Self {
                        shared: Arc::new(Shared {
                            options: Mutex::new(options.clone()),
                            seeds: seeds.iter().map(|s| (*s).to_owned()).collect(),
                            state: Mutex::new(State {
                                home,
                                links: HashMap::new(),
                                routes: Routes::default(),
                                stale: true,
                                generation: 0,
                                dialling: std::collections::HashSet::new(),
                            }),
                            refreshing: tokio::sync::Mutex::new(0),
                        }),
                    };
                    // A node that will not say (it needs a login first) is still
                    // served: every request then goes to it.
                    if let Err(err) = client.refresh().await {
                        tracing::debug!(%err, "no cluster map yet");
                    }
                    return Ok(client);
                }
                Err(err) => last = err,
            }
        }
        Err(last)
    }

    /// Whether the connection requests without a partition go on has failed (the
    /// next [`Client::refresh`] replaces it).
    pub fn is_closed(&self) -> bool {
        self.state().is_none_or(|state| state.home.is_closed())
    }

    /// Whether a `NotLeader` or a lost connection since the last refresh says the
    /// routes may be out of date.
    pub fn is_stale(&self) -> bool {
        self.state().is_none_or(|state| state.stale)
    }

    fn state(&self) -> Option<std::sync::MutexGuard<'_, State>> {
        self.shared.state.lock().ok()
    }

    fn options(&self) -> ConnectOptions {
        self.shared
            .options
            .lock()
            .map(|o| o.clone())
            .unwrap_or_default()
    }

    /// The connection `request` goes on now.
    fn connection_for(&self, request: &Request<'_>) -> Result<Connection, ClientError> {
        let state = self.state().ok_or(ClientError::Closed)?;
        let member = state.routes.member_for(Target::of(request));
        let link = member
            .and_then(|m| state.links.get(&m))
            .filter(|c| !c.is_closed());
        Ok(link.unwrap_or(&state.home).clone())
    }

    /// Sends a request now, to the member that serves it (so calls made in order for
    /// one partition reach its primary in order), and returns a future of its
    /// response. A `NotLeader` answer or a lost connection refreshes the routes before
    /// the error is returned, so a retry goes to the right member.
    pub fn start_call(
        &self,
        request: &Request<'_>,
    ) -> impl std::future::Future<Output = Result<Response, ClientError>> + Send + 'static {
        let connection = self.connection_for(request);
        let answer = connection.as_ref().ok().map(|c| c.start_call(request));
        let shared = Arc::clone(&self.shared);
        async move {
            let result = match answer {
                Some(answer) => answer.await,
                None => Err(ClientError::Closed),
            };
            if let Err(err) = &result {
                if misrouted(err) {
                    if let Ok(mut state) = shared.state.lock() {
                        state.stale = true;
                    }
                    // The next call goes right: the map is asked for again before this
                    // error is handed back (refreshes running at once are shared).
                    let client = Client { shared };
                    if let Err(err) = client.refresh().await {
                        tracing::debug!(%err, "refresh after a misrouted call failed");
                    }
                }
            }
            result
        }
    }

    /// Sends a request and waits for its response. A request that went to the wrong
    /// member, or a read whose connection was lost, is sent again after a refresh,
    /// with backoff, for up to 10 s; a produce is not (it may have been stored: the
    /// [`crate::Producer`] retries and counts what it sends twice).
    ///
    /// # Errors
    /// [`ClientError::Server`] with the node's code and message, or a connection error.
    pub async fn call(&self, request: &Request<'_>) -> Result<Response, ClientError> {
        let started = std::time::Instant::now();
        let mut backoff = Duration::from_millis(25);
        loop {
            let result = self.start_call(request).await;
            match result {
                Err(err) if self.may_repeat(request, &err) && started.elapsed() < REPEAT_FOR => {
                    // `start_call` refreshed the map already if the member was wrong.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(REPEAT_BACKOFF_MAX);
                }
                other => return other,
            }
        }
    }

    /// Whether `request`, failed with `err`, is safe and worth sending again: a
    /// refusal by a member that does not serve it (nothing was done; for a produce
    /// that is not certain, so never a produce), a read on a lost connection, and, in
    /// a cluster, a read of a topic this member has not heard of yet (its metadata
    /// replica applies a creation a moment after the member that made it).
    fn may_repeat(&self, request: &Request<'_>, err: &ClientError) -> bool {
        let read = is_read(request);
        match err.code() {
            Some(ErrorCode::NotLeader) => !matches!(request, Request::Produce { .. }),
            Some(
                ErrorCode::StreamNotFound | ErrorCode::TopicNotFound | ErrorCode::PartitionNotFound,
            ) => read && self.is_cluster(),
            _ => read && misrouted(err),
        }
    }

    /// Whether the cluster has more than one member (as the last map said).
    pub fn is_cluster(&self) -> bool {
        self.state()
            .is_some_and(|state| state.routes.members().nth(1).is_some())
    }

    /// Asks the cluster who leads what (the home member first, then any member, then
    /// the seeds), reconnects to members whose connection is gone, and replaces a
    /// failed home connection. Callers that arrive while a refresh runs share it.
    ///
    /// # Errors
    /// The last error if no member answers.
    pub async fn refresh(&self) -> Result<(), ClientError> {
        let seen = self.state().map_or(0, |s| s.generation);
        let mut done = self.shared.refreshing.lock().await;
        if *done > seen {
            // A refresh finished while this caller waited: its answer is as new.
            return Ok(());
        }
        let result = self.refresh_now().await;
        *done += 1;
        if let Ok(mut state) = self.shared.state.lock() {
            state.generation = *done;
        }
        result
    }

    async fn refresh_now(&self) -> Result<(), ClientError> {
        let options = self.options();
        if options.direct {
            return self.redial_home(&options).await;
        }
        let (mut candidates, mut addresses) = {
            let state = self.state().ok_or(ClientError::Closed)?;
            let mut open = vec![state.home.clone()];
            open.extend(state.links.values().cloned());
            open.retain(|c| !c.is_closed());
            let mut addresses: Vec<String> =
                state.routes.members().map(|(_, a)| a.to_owned()).collect();
            addresses.extend(self.shared.seeds.iter().cloned());
            (open, addresses)
        };
        addresses.dedup();
        let mut last = ClientError::Closed;
        // Every open connection is asked at once and the answers merged (see
        // `routes`): one member may be cut off and name a primary the others replaced.
        let mut asked = tokio::task::JoinSet::new();
        for (order, connection) in candidates.drain(..).enumerate() {
            asked.spawn(async move {
                let answer = ask_map(&connection).await;
                (order, connection, answer)
            });
        }
        let mut answers = Vec::new();
        loop {
            // Once one has answered, the others get a moment more, not a timeout each.
            let next = if answers.is_empty() {
                asked.join_next().await
            } else {
                match tokio::time::timeout(ANSWER_GRACE, asked.join_next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            };
            match next {
                None => break,
                Some(Ok((order, connection, Ok(info)))) => answers.push((order, connection, info)),
                Some(Ok((_, _, Err(err)))) => last = err,
                Some(Err(err)) => tracing::debug!(%err, "asking a member for the map failed"),
            }
        }
        answers.sort_by_key(|(order, _, _)| *order);
        let mut answers = answers
            .into_iter()
            .map(|(_, connection, info)| (connection, info));
        let mut answered = answers.next();
        let others: Vec<ClusterInfo> = answers.map(|(_, info)| info).collect();
        if answered.is_none() {
            for addr in &addresses {
                match dial(addr, &options).await {
                    Ok(connection) => match ask_map(&connection).await {
                        Ok(info) => {
                            answered = Some((connection, info));
                            break;
                        }
                        Err(err) => last = err,
                    },
                    Err(err) => last = err,
                }
            }
        }
        let Some((reached, info)) = answered else {
            return Err(last);
        };
        let mut routes = Routes::new(&info, reached.addr());
        for other in &others {
            routes.merge(other);
        }
        let missing: Vec<(u8, String)> = {
            let mut state = self.shared.state.lock().map_err(|_| ClientError::Closed)?;
            state.links.insert(info.node_id, reached.clone());
            state
                .links
                .retain(|id, c| routes.addr_of(*id).is_some() && !c.is_closed());
            if state.home.is_closed() {
                state.home = reached;
            }
            let missing: Vec<(u8, String)> = routes
                .members()
                .filter(|(id, _)| *id != info.node_id)
                .filter(|(id, _)| !state.links.contains_key(id))
                .filter(|(id, _)| !state.dialling.contains(id))
                .map(|(id, addr)| (id, addr.to_owned()))
                .collect();
            state.dialling.extend(missing.iter().map(|(id, _)| *id));
            state.routes = routes;
            state.stale = false;
            missing
        };
        let mut dials = Vec::new();
        for (id, addr) in missing {
            let options = options.clone();
            let shared = Arc::clone(&self.shared);
            dials.push(tokio::spawn(async move {
                let dialled = dial(&addr, &options).await;
                let Ok(mut state) = shared.state.lock() else {
                    return;
                };
                state.dialling.remove(&id);
                match dialled {
                    // Still a member at that address (a later map may have moved it).
                    Ok(connection) if state.routes.addr_of(id) == Some(addr.as_str()) => {
                        state.links.insert(id, connection);
                    }
                    Ok(_) => {}
                    Err(err) => tracing::debug!(member = id, %err, "member unreachable"),
                }
            }));
        }
        // Members that answer at once are linked before the caller goes on; one that
        // is down is dialled on in the background.
        let _ = tokio::time::timeout(DIAL_WAIT, futures_join(dials)).await;
        Ok(())
    }

    /// A direct client's refresh: a new connection to the same node if it failed.
    async fn redial_home(&self, options: &ConnectOptions) -> Result<(), ClientError> {
        let addr = {
            let state = self.state().ok_or(ClientError::Closed)?;
            if !state.home.is_closed() {
                return Ok(());
            }
            state.home.addr().to_owned()
        };
        let home = dial(&addr, options).await?;
        let mut state = self.shared.state.lock().map_err(|_| ClientError::Closed)?;
        state.home = home;
        state.stale = false;
        Ok(())
    }

    /// Logs in as `credentials.user` on every open connection, and on those made
    /// later (SCRAM-SHA-256).
    ///
    /// # Errors
    /// As [`Client::connect_with`].
    pub async fn login(&self, credentials: &Credentials) -> Result<(), ClientError> {
        let open: Vec<Connection> = {
            let state = self.state().ok_or(ClientError::Closed)?;
            let mut open = vec![state.home.clone()];
            open.extend(
                state
                    .links
                    .values()
                    .filter(|c| c.addr() != state.home.addr())
                    .cloned(),
            );
            open
        };
        for connection in open {
            connection.login(credentials).await?;
        }
        if let Ok(mut options) = self.shared.options.lock() {
            options.credentials = Some(credentials.clone());
        }
        // The map may have been refused before the login.
        self.refresh().await
    }

    /// The cluster's members and each partition's primary, as the member at hand
    /// knows them (only topics of streams the user may see).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn cluster_info(&self) -> Result<ClusterInfo, ClientError> {
        match self.call(&Request::ClusterInfo).await? {
            Response::Cluster(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// Every member's own account of its replicas and its bundle to each peer
    /// (`NodeStatus`), asked of all at once, each within 2 s, over its open connection
    /// or a new one; a member that does not answer comes back with its error. By
    /// member id; the member at hand alone if no map is known (or the client is
    /// direct).
    pub async fn member_statuses(&self) -> Vec<MemberStatus> {
        let options = self.options();
        let (members, open) = {
            let Some(state) = self.state() else {
                return Vec::new();
            };
            let mut members: Vec<(Option<u8>, String)> = state
                .routes
                .members()
                .map(|(id, addr)| (Some(id), addr.to_owned()))
                .collect();
            if members.is_empty() || options.direct {
                members = vec![(None, state.home.addr().to_owned())];
            }
            let open: HashMap<String, Connection> = state
                .links
                .values()
                .chain(std::iter::once(&state.home))
                .filter(|c| !c.is_closed())
                .map(|c| (c.addr().to_owned(), c.clone()))
                .collect();
            (members, open)
        };
        let mut asked = tokio::task::JoinSet::new();
        for (id, addr) in members {
            let connection = open.get(&addr).cloned();
            let options = options.clone();
            asked.spawn(async move {
                let status = tokio::time::timeout(STATUS_TIMEOUT, async {
                    let connection = match connection {
                        Some(c) => c,
                        None => dial(&addr, &options).await?,
                    };
                    match connection.call(&Request::NodeStatus).await? {
                        Response::Node(status) => Ok(status),
                        other => Err(unexpected(&other)),
                    }
                })
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::Io {
                        kind: std::io::ErrorKind::TimedOut,
                        message: format!("{addr} did not answer within {STATUS_TIMEOUT:?}"),
                    })
                });
                let id = id.or(status.as_ref().ok().map(|s| s.node_id));
                MemberStatus {
                    id,
                    client_addr: addr,
                    status,
                }
            });
        }
        let mut statuses = Vec::new();
        while let Some(answer) = asked.join_next().await {
            if let Ok(status) = answer {
                statuses.push(status);
            }
        }
        statuses.sort_by_key(|s| s.id);
        statuses
    }
}

/// How long [`Client::member_statuses`] waits for each member.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// One member's answer to [`Client::member_statuses`].
#[derive(Debug)]
pub struct MemberStatus {
    /// Its member id (from the map, or from its answer).
    pub id: Option<u8>,
    /// Where it was asked.
    pub client_addr: String,
    /// What it said, or why it did not.
    pub status: Result<braid_proto::client::NodeStatus, ClientError>,
}

/// Whether `err` says the request went to the wrong member or a connection is gone:
/// a refresh may send it right.
pub(crate) fn misrouted(err: &ClientError) -> bool {
    match err {
        ClientError::Io { .. } | ClientError::Closed => true,
        ClientError::Server { code, .. } => {
            matches!(code, ErrorCode::NotLeader | ErrorCode::ShuttingDown)
        }
        _ => false,
    }
}

/// Whether sending `request` twice changes nothing a single send would not.
fn is_read(request: &Request<'_>) -> bool {
    matches!(
        request,
        Request::Ping
            | Request::ClusterInfo
            | Request::NodeStatus
            | Request::ListStreams
            | Request::ListTopics { .. }
            | Request::DescribeTopic { .. }
            | Request::Fetch { .. }
            | Request::ListOffsets { .. }
            | Request::FetchOffsets { .. }
            | Request::DescribeGroup { .. }
            | Request::ListGroups { .. }
            | Request::ListUsers
            // Not reads, but each may be sent twice: a second changes nothing.
            | Request::SessionHeartbeat { .. }
            | Request::EndSession { .. }
    )
}

async fn cluster_info(connection: &Connection) -> Result<ClusterInfo, ClientError> {
    match connection.call(&Request::ClusterInfo).await? {
        Response::Cluster(info) => Ok(info),
        other => Err(unexpected(&other)),
    }
}

/// `ClusterInfo` on `connection`, within [`INFO_TIMEOUT`].
async fn ask_map(connection: &Connection) -> Result<ClusterInfo, ClientError> {
    match tokio::time::timeout(INFO_TIMEOUT, cluster_info(connection)).await {
        Ok(result) => result,
        Err(_) => Err(ClientError::Io {
            kind: std::io::ErrorKind::TimedOut,
            message: format!(
                "{} did not say who leads what within {INFO_TIMEOUT:?}",
                connection.addr()
            ),
        }),
    }
}

/// Waits for every task in `tasks`.
async fn futures_join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        let _ = task.await;
    }
}

async fn dial(addr: &str, options: &ConnectOptions) -> Result<Connection, ClientError> {
    match tokio::time::timeout(DIAL_TIMEOUT, Connection::connect_with(addr, options)).await {
        Ok(result) => result,
        Err(_) => Err(ClientError::Io {
            kind: std::io::ErrorKind::TimedOut,
            message: format!("connecting to {addr} took over {DIAL_TIMEOUT:?}"),
        }),
    }
}
