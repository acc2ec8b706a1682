//! What the real-process tests share: free loopback ports, signals, HTTP reads, a
//! cluster of real processes under load, network namespaces for network faults.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, TcpListener};
use std::process::Command;

pub(crate) mod cluster;
pub(crate) mod netns;

/// A base port whose 30 ports (clients, HTTP, replicas) are free now, below Linux's
/// ephemeral range (32768 up): a port in it may be taken by an outgoing connection
/// while its member is down, and the member could not restart on it.
pub(crate) fn free_base() -> u16 {
    const BLOCKS: u16 = 120; // 20000 to 31999
    for attempt in 0..BLOCKS {
        let base = 20_000 + (std::process::id() as u16 % BLOCKS + attempt) % BLOCKS * 100;
        let free = (0..30).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if free {
            return base;
        }
    }
    panic!("no free block of 30 loopback ports");
}

/// Sends signal `name` (KILL, TERM, INT) to `pid`.
pub(crate) fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

/// `GET path` on an HTTP port: the status code and the body (None if nothing answers).
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}
