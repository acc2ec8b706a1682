//! Accepting links: the peer address filter, the handshake cap, one admission per link,
//! the preamble's deadline, and the hand-over to the link's owner shard.

use super::*;

pub(super) async fn accept_loop(
    config: Arc<BusConfig>,
    tls: Arc<Option<Tls>>,
    placement: Arc<Placement>,
    listener: TcpListener,
    peers: Arc<Vec<Option<Arc<PeerHandle>>>>,
    metrics: Arc<BusMetrics>,
) {
    let slots = Arc::new(Semaphore::new(INBOUND_HANDSHAKES_MAX));
    let pending = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    loop {
        let Ok((stream, remote)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        // Only configured peers' addresses take an admission slot: a flood from
        // elsewhere cannot crowd out a real peer.
        if !from_a_peer(&config, remote) {
            metrics.failed("unknown_address");
            continue;
        }
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            metrics.failed("too_many_handshakes");
            continue;
        };
        let config = Arc::clone(&config);
        let tls = Arc::clone(&tls);
        let placement = Arc::clone(&placement);
        let peers = Arc::clone(&peers);
        let metrics = Arc::clone(&metrics);
        tokio::spawn(admit(
            Admission {
                config,
                tls,
                peers,
                metrics,
                _slot: slot,
                pending: Arc::clone(&pending),
                claim: None,
            },
            placement,
            stream,
            remote,
        ));
    }
}

/// What one inbound socket's admission needs, wherever it runs; holding it holds one
/// of the [`INBOUND_HANDSHAKES_MAX`] slots.
pub(super) struct Admission {
    config: Arc<BusConfig>,
    tls: Arc<Option<Tls>>,
    peers: Arc<Vec<Option<Arc<PeerHandle>>>>,
    metrics: Arc<BusMetrics>,
    _slot: OwnedSemaphorePermit,
    /// The (replica, link) admissions in progress: one at a time each.
    pending: Arc<Mutex<std::collections::BTreeSet<(u8, u16)>>>,
    /// The (replica, link) this admission holds, released when it ends.
    claim: Option<(u8, u16)>,
}

impl Admission {
    /// Claims `(replica, link)`; false if another admission of it is in progress.
    fn claim(&mut self, replica: u8, link: u16) -> bool {
        let Ok(mut pending) = self.pending.lock() else {
            return false;
        };
        if !pending.insert((replica, link)) {
            return false;
        }
        self.claim = Some((replica, link));
        true
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let (Some(claim), Ok(mut pending)) = (self.claim, self.pending.lock()) {
            pending.remove(&claim);
        }
    }
}

/// The preamble's own deadline, inside the admission's: a socket that connects and
/// sends nothing is closed long before a grace.
pub(super) fn preamble_deadline(grace: Duration) -> Duration {
    (grace / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1))
        .min(grace)
}

/// Runs admission for one inbound socket under one deadline: the preamble here (the
/// accepting shard), the rest on the link's owner shard.
pub(super) async fn admit(
    mut admission: Admission,
    placement: Arc<Placement>,
    mut tcp: TcpStream,
    remote: SocketAddr,
) {
    let accepted = Instant::now();
    let deadline = tokio::time::Instant::now() + admission.config.handshake_grace;
    let preamble_by =
        tokio::time::Instant::now() + preamble_deadline(admission.config.handshake_grace);
    let config = Arc::clone(&admission.config);
    let metrics = Arc::clone(&admission.metrics);
    let grace_ms = config.handshake_grace.as_millis() as u64;
    tune(&tcp, config.heartbeat_timeout);
    let mut preamble = [0u8; PREAMBLE_BYTES];
    if tokio::time::timeout_at(preamble_by, tcp.read_exact(&mut preamble))
        .await
        .map_or(true, |r| r.is_err())
    {
        metrics.preamble_refusals.fetch_add(1, Ordering::Relaxed);
        metrics.failed("timeout");
        return;
    }
    let now = accepted.elapsed().as_millis() as u64;
    let awaiting = match accept_preamble(handshake_config(&config), &preamble, now, grace_ms) {
        Ok(awaiting) => awaiting,
        Err(refusal) => {
            metrics.preamble_refusals.fetch_add(1, Ordering::Relaxed);
            metrics.failed(reason(&refusal));
            return;
        }
    };
    let peer = awaiting.preamble().replica;
    let link = u16::from(awaiting.preamble().link);
    // The preamble's replica must be the one at that address.
    let known = config.addresses.get(usize::from(peer)).map(SocketAddr::ip);
    if known.is_some_and(|ip| !ip.is_unspecified() && ip != remote.ip()) {
        metrics.preamble_refusals.fetch_add(1, Ordering::Relaxed);
        metrics.failed("address_mismatch");
        return;
    }
    if !admission.claim(peer, link) {
        metrics.preamble_refusals.fetch_add(1, Ordering::Relaxed);
        metrics.failed("admission_pending");
        return;
    }
    let Some(owner) = placement.owner(link, peer) else {
        finish_admission(admission, awaiting, tcp, accepted, deadline).await;
        return;
    };
    // Hand the socket to the owner shard: it is re-registered with that runtime's
    // reactor, so every later read and write of this link happens there.
    let std = match tcp.into_std() {
        Ok(std) => std,
        Err(_) => {
            metrics.failed("handoff");
            return;
        }
    };
    owner.spawn(async move {
        match TcpStream::from_std(std) {
            Ok(tcp) => finish_admission(admission, awaiting, tcp, accepted, deadline).await,
            Err(_) => admission.metrics.failed("handoff"),
        }
    });
}

/// TLS, hello, reply and confirm for an accepted preamble, then the link goes to its
/// peer's manager; all under the deadline set at accept.
pub(super) async fn finish_admission(
    admission: Admission,
    awaiting: AcceptorAwaitHello,
    tcp: TcpStream,
    accepted: Instant,
    deadline: tokio::time::Instant,
) {
    let now = || accepted.elapsed().as_millis() as u64;
    let peer = awaiting.preamble().replica;
    let link = u16::from(awaiting.preamble().link);
    let rest = async {
        let mut stream: BoxStream = match admission.tls.as_ref() {
            Some(tls) => Box::new(tls.acceptor.accept(tcp).await.map_err(|_| "tls")?),
            None => Box::new(tcp),
        };
        let mut hello = [0u8; HELLO_BYTES];
        stream
            .read_exact(&mut hello)
            .await
            .map_err(|_| "malformed")?;
        let (confirming, reply) = awaiting
            .on_hello(&hello, random_nonce(), now())
            .map_err(|r| reason(&r))?;
        stream.write_all(&reply).await.map_err(|_| "malformed")?;
        stream.flush().await.map_err(|_| "malformed")?;
        let mut confirm = [0u8; CONFIRM_BYTES];
        stream
            .read_exact(&mut confirm)
            .await
            .map_err(|_| "malformed")?;
        let established = confirming
            .on_confirm(&confirm, now())
            .map_err(|r| reason(&r))?;
        Ok::<_, &'static str>((stream, established))
    };
    match tokio::time::timeout_at(deadline, rest).await {
        Ok(Ok((stream, established))) => {
            if let Some(Some(handle)) = admission.peers.get(usize::from(peer)) {
                let _ = handle.inner.events.send(PeerEvent::LinkUp {
                    link,
                    generation: established.generation,
                    incarnation: established.peer_incarnation,
                    stream,
                });
            }
        }
        Ok(Err(why)) => admission.metrics.failed(why),
        Err(_) => admission.metrics.failed("timeout"),
    }
}
