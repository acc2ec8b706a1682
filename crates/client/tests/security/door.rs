//! Who gets in, and how fast: strangers' budgets, login delays, each user's
//! connections and the HTTP port's token (part of `security.rs`, one test binary).

use super::*;

/// Connections that never log in have a budget of their own, per source address too:
/// a stranger holding many of them cannot take the slots logins need (found by
/// review: at `connections_max` = 100, 100 of them refused 48 of 50 good logins).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_that_never_log_in_cannot_lock_users_out() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(NodeConfig {
        connections_max: 64,
        connections_unauthenticated_per_source_max: 8,
        ..secured_config(dir.path())
    })
    .unwrap();
    // 64 connections from one address (127.0.0.2) that never log in: 8 are held (32
    // strangers at most over the node, a quarter of that from one address), the rest
    // closed at once.
    let mut strangers = Vec::new();
    for _ in 0..64 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        strangers.push(socket.connect(node.client_addr()).await.unwrap());
    }
    let mut held = 0;
    for stranger in &mut strangers {
        let (_, closed) = read_until_closed(stranger, Duration::from_millis(200)).await;
        if closed.is_none() {
            held += 1;
        }
    }
    assert_eq!(held, 8, "strangers held from one address");
    // Users from elsewhere still log in, every one.
    let mut users = Vec::new();
    for _ in 0..10 {
        users.push(
            connect(&node, &login("admin", ADMIN_PASSWORD))
                .await
                .unwrap(),
        );
    }
    for user in &users {
        user.list_streams().await.unwrap();
    }
    assert_eq!(
        common::metric(
            node.http_addr(),
            "braid_connections_refused_unauthenticated_total"
        )
        .await,
        56
    );
    node.shutdown();
}

/// Login guessing is slowed down: past three recent failures of a source address or
/// of a user, each login waits before it is answered, doubling to at most 5 s, so the
/// right password still gets in (found by review: 173 guesses a second, and the right
/// one accepted 9 ms after 3,004 failures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_make_the_next_ones_wait() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(secured_config(dir.path())).unwrap();
    let mut waits = Vec::new();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let refused = connect(&node, &login("admin", "a guess")).await;
        assert_eq!(code(refused), ErrorCode::AuthenticationFailed);
        waits.push(started.elapsed());
    }
    // The fourth waits at least 100 ms, the fifth at least 200 ms.
    assert!(waits[3] >= Duration::from_millis(100), "{waits:?}");
    assert!(waits[4] >= Duration::from_millis(200), "{waits:?}");
    let started = std::time::Instant::now();
    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "the right password waits too, but gets in"
    );
    admin.list_streams().await.unwrap();
    assert_eq!(
        common::metric(node.http_addr(), "braid_logins_delayed_total").await,
        3
    );
    node.shutdown();
}

/// `GET path` with optional extra header lines; the status line and the body.
async fn http_status(http: std::net::SocketAddr, path: &str, headers: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(http).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let status = text.lines().next().unwrap_or("").to_owned();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The HTTP admin port shows every group and counter: off loopback it needs a token
/// (protected mode, as the client port), and with one `/metrics` and `/replication`
/// answer only a request that carries it; `/health` and `/ready` stay open to load
/// balancers (found by review: no authentication, any address, silently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_asks_for_its_token_and_refuses_to_be_exposed_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let exposed = Node::start(NodeConfig {
        http_addr: "0.0.0.0:0".parse().unwrap(),
        ..secured_config(&dir.path().join("exposed"))
    });
    let Err(refused) = exposed else {
        panic!("an exposed HTTP port without a token started");
    };
    assert!(refused.to_string().contains("http_token_file"), "{refused}");

    let token_file = dir.path().join("http-token");
    std::fs::write(&token_file, "a token of at least sixteen bytes\n").unwrap();
    let node = Node::start(NodeConfig {
        http_token_file: Some(token_file),
        ..secured_config(&dir.path().join("data"))
    })
    .unwrap();
    let http = node.http_addr();
    for path in ["/metrics", "/replication"] {
        let (status, _) = http_status(http, path, "").await;
        assert!(status.contains(" 401 "), "{path} without a token: {status}");
        let (status, _) = http_status(http, path, "Authorization: Bearer wrong\r\n").await;
        assert!(
            status.contains(" 401 "),
            "{path} with a wrong token: {status}"
        );
        let bearer = "Authorization: Bearer a token of at least sixteen bytes\r\n";
        let (status, body) = http_status(http, path, bearer).await;
        assert!(status.contains(" 200 "), "{path} with the token: {status}");
        assert!(!body.is_empty());
    }
    // (200, or 503 while the node catches up: never 401.)
    for path in ["/health", "/ready"] {
        let (status, _) = http_status(http, path, "").await;
        assert!(!status.contains(" 401 "), "{path}: {status}");
    }
    let (status, _) = http_status(http, "/health", "").await;
    assert!(status.contains(" 200 "), "/health: {status}");
    node.shutdown();
}

/// One user cannot take every connection of the node (found by review: one user, from
/// many source addresses, held all 10,000 slots and no other user could log in):
/// `connections_per_user_max` refuses its next login `QuotaExceeded`, counted, while
/// other users still get in, and a closed connection gives its slot back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_cannot_take_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(NodeConfig {
        connections_per_user_max: 2,
        ..secured_config(dir.path())
    })
    .unwrap();
    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    admin.create_user("mallory", "hers").await.unwrap();
    let first = connect(&node, &login("mallory", "hers")).await.unwrap();
    let second = connect(&node, &login("mallory", "hers")).await.unwrap();
    assert_eq!(
        code(connect(&node, &login("mallory", "hers")).await),
        ErrorCode::QuotaExceeded
    );
    let other_admin = connect(&node, &login("admin", ADMIN_PASSWORD)).await;
    assert!(other_admin.is_ok(), "another user still logs in");
    assert!(common::metric(node.http_addr(), "braid_logins_refused_per_user_total").await >= 1);
    drop(first);
    let mut again = None;
    for _ in 0..50 {
        if let Ok(client) = connect(&node, &login("mallory", "hers")).await {
            again = Some(client);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(again.is_some(), "a closed connection gives its slot back");
    drop((second, again));
    node.shutdown();
}
