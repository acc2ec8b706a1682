//! Dialing one link of a peer: connect, preamble, TLS, handshake, and the acceptor's word.

use super::*;

pub(super) async fn dial(
    config: Arc<BusConfig>,
    tls: Arc<Option<Tls>>,
    peer: u8,
    link: u16,
    generation: u32,
    events: mpsc::UnboundedSender<PeerEvent>,
    metrics: Arc<BusMetrics>,
) {
    let closed = PeerEvent::LinkClosed { link, generation };
    let Some(addr) = config.addresses.get(usize::from(peer)).copied() else {
        return;
    };
    let attempt = async {
        let own = config.addresses.get(usize::from(config.replica)).copied();
        let mut tcp = connect_from(own, addr).await.map_err(|_| "connect")?;
        tune(&tcp, config.heartbeat_timeout);
        let (state, hello) = DialerAwaitReply::start(
            handshake_config(&config),
            peer,
            link,
            generation,
            random_nonce(),
        );
        // The preamble goes in the clear: it tells the acceptor which shard takes over.
        tcp.write_all(&hello[..PREAMBLE_BYTES])
            .await
            .map_err(|_| "io")?;
        let mut stream: BoxStream = match tls.as_ref() {
            Some(tls) => Box::new(
                tls.connector
                    .connect(tls.server_name.clone(), tcp)
                    .await
                    .map_err(|_| "tls")?,
            ),
            None => Box::new(tcp),
        };
        stream
            .write_all(&hello[PREAMBLE_BYTES..])
            .await
            .map_err(|_| "io")?;
        stream.flush().await.map_err(|_| "io")?;
        let mut reply = [0u8; REPLY_BYTES];
        stream.read_exact(&mut reply).await.map_err(|_| "io")?;
        let (established, confirm) = state.on_reply(&reply).map_err(|r| reason(&r))?;
        stream.write_all(&confirm).await.map_err(|_| "io")?;
        stream.flush().await.map_err(|_| "io")?;
        // The link is up only once the acceptor took it into its bundle.
        let mut taken = [0u8; FRAME_HEADER_BYTES];
        stream
            .read_exact(&mut taken)
            .await
            .map_err(|_| "not_taken")?;
        let whole = Frame::check(&taken, config.frame_bytes_max);
        if !(matches!(whole, Ok(Some(_))) && taken[12] == KIND_LINK_TAKEN) {
            return Err("not_taken");
        }
        Ok::<(BoxStream, u64), &'static str>((stream, established.peer_incarnation))
    };
    match tokio::time::timeout(config.handshake_grace, attempt).await {
        Ok(Ok((stream, incarnation))) => {
            let _ = events.send(PeerEvent::LinkUp {
                link,
                generation,
                incarnation,
                stream,
            });
        }
        Ok(Err(why)) => {
            metrics.failed(why);
            let _ = events.send(closed);
        }
        Err(_) => {
            metrics.failed("timeout");
            let _ = events.send(closed);
        }
    }
}
