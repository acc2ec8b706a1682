//! Client TLS, authentication and permissions against a real node in-process on
//! port 0, with certificates made in the test.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use braid_client::{Client, ClientError, ConnectOptions, Credentials, TlsOptions};
use braid_node::{FsyncSetting, Node, NodeConfig, Secret, StartError};
use braid_proto::client::{ErrorCode, Grant, Resource, TopicSettings, READ, WRITE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ADMIN_PASSWORD: &str = "correct horse battery staple";

#[path = "security/door.rs"]
mod door;
#[path = "security/sessions.rs"]
mod sessions;

fn secured_config(dir: &Path) -> NodeConfig {
    NodeConfig {
        authentication: true,
        admin_password: Some(Secret(ADMIN_PASSWORD.into())),
        ..common::config(dir, FsyncSetting::Never)
    }
}

fn login(user: &str, password: &str) -> ConnectOptions {
    ConnectOptions {
        tls: None,
        credentials: Some(Credentials {
            user: user.into(),
            password: password.into(),
        }),
        ..ConnectOptions::default()
    }
}

async fn connect(node: &Node, options: &ConnectOptions) -> Result<Client, ClientError> {
    Client::connect_with(&node.client_addr().to_string(), options).await
}

fn one_record_batch(value: &[u8]) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(1_000);
    builder.push(None, Some(value), &[], 1_000);
    builder.finish()
}

fn code(result: Result<impl std::fmt::Debug, ClientError>) -> ErrorCode {
    result.unwrap_err().code().expect("a server error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_but_ping_and_login_before_authentication_and_a_failed_login_closes() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(secured_config(dir.path())).unwrap();
    let anonymous = Client::connect(node.client_addr()).await.unwrap();
    anonymous.ping().await.unwrap();
    assert_eq!(
        code(anonymous.create_stream("s").await),
        ErrorCode::NotAuthenticated
    );
    assert_eq!(
        code(anonymous.list_streams().await),
        ErrorCode::NotAuthenticated
    );
    assert_eq!(
        code(anonymous.list_users().await),
        ErrorCode::NotAuthenticated
    );

    // A wrong password and an unknown user get the same answer, and the connection
    // is closed: every guess costs a connection and the guesser's own PBKDF2.
    for (user, password) in [("admin", "wrong"), ("mallory", ADMIN_PASSWORD)] {
        let client = Client::connect(node.client_addr()).await.unwrap();
        let refused = client
            .login(&Credentials {
                user: user.into(),
                password: password.into(),
            })
            .await;
        assert_eq!(code(refused), ErrorCode::AuthenticationFailed, "{user}");
        // The node closed it (a later call would dial a new connection).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !client.is_closed() {
            assert!(
                std::time::Instant::now() < deadline,
                "the connection stayed open"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(
        common::metric(node.http_addr(), "braid_authentication_failures_total").await,
        2
    );

    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    admin.create_stream("s").await.unwrap();
    // A second login on a logged-in connection is refused (and closes it).
    let again = admin
        .login(&Credentials {
            user: "admin".into(),
            password: ADMIN_PASSWORD.into(),
        })
        .await;
    assert_eq!(code(again), ErrorCode::AuthenticationFailed);
    assert!(common::metric(node.http_addr(), "braid_permission_denials_total").await >= 3);
    assert_eq!(
        common::metric(node.http_addr(), "braid_authentications_total").await,
        1
    );
    node.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_checks_the_permission_it_needs_and_grants_apply_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(secured_config(dir.path())).unwrap();
    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    for stream in ["orders", "payroll"] {
        common::create_topic(&admin, stream, "t", 1).await;
    }
    admin
        .create_user("alice", "alice's password")
        .await
        .unwrap();
    assert_eq!(
        code(admin.create_user("alice", "again").await),
        ErrorCode::UserExists
    );
    let alice = connect(&node, &login("alice", "alice's password"))
        .await
        .unwrap();
    let batch = one_record_batch(b"x");
    let produce = |client: &Client, stream: &'static str| {
        let client = client.clone();
        let batch = batch.clone();
        async move { client.produce(stream, "t", 0, &batch).await }
    };
    let fetch = |client: &Client, stream: &'static str| {
        let client = client.clone();
        async move { client.fetch(stream, "t", 0, 0, 1 << 20, 0).await }
    };

    // Nothing granted: alice sees no stream and may do nothing with one.
    assert!(alice.list_streams().await.unwrap().is_empty());
    assert_eq!(
        code(produce(&alice, "orders").await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(fetch(&alice, "orders").await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(alice.create_stream("mine").await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(code(alice.list_users().await), ErrorCode::PermissionDenied);
    let denied = alice.describe_topic("orders", "t").await.unwrap_err();
    assert!(
        denied.to_string().contains("alice"),
        "the denial names the user: {denied}"
    );

    // Write on orders: the same connection may produce there now, and only there.
    let orders = Resource::Stream("orders".into());
    let write = Grant {
        resource: orders.clone(),
        permissions: WRITE,
    };
    admin.grant("alice", write.clone()).await.unwrap();
    produce(&alice, "orders").await.unwrap();
    assert_eq!(
        code(fetch(&alice, "orders").await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(produce(&alice, "payroll").await),
        ErrorCode::PermissionDenied
    );
    let names: Vec<String> = alice
        .list_streams()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        ["orders"],
        "only the streams alice may use are listed"
    );
    let visible: Vec<String> = alice
        .cluster_info()
        .await
        .unwrap()
        .topics
        .into_iter()
        .map(|t| t.stream)
        .collect();
    assert_eq!(
        visible,
        ["orders"],
        "the cluster map shows only alice's streams"
    );
    admin
        .grant(
            "alice",
            Grant {
                resource: orders.clone(),
                permissions: READ,
            },
        )
        .await
        .unwrap();
    assert_eq!(fetch(&alice, "orders").await.unwrap().high_watermark, 1);
    let listed = admin.list_users().await.unwrap();
    let alice_grants = &listed.iter().find(|u| u.name == "alice").unwrap().grants;
    assert_eq!(
        alice_grants,
        &[Grant {
            resource: orders.clone(),
            permissions: READ | WRITE
        }]
    );

    // Revoked: the next request is refused; deleted: the connection has no user.
    admin.revoke("alice", write).await.unwrap();
    assert_eq!(
        code(produce(&alice, "orders").await),
        ErrorCode::PermissionDenied
    );
    fetch(&alice, "orders").await.unwrap();
    admin.delete_user("alice").await.unwrap();
    // Deleted: its connection is closed (`a_deleted_user_or_a_new_password_ends_its_
    // connections`), and a new one cannot log in.
    let refused = code(fetch(&alice, "orders").await);
    assert!(
        matches!(
            refused,
            ErrorCode::NotAuthenticated | ErrorCode::AuthenticationFailed
        ),
        "{refused:?}"
    );
    assert_eq!(
        code(admin.delete_user("alice").await),
        ErrorCode::UserNotFound
    );
    // The last user who can manage users stays.
    assert_eq!(
        code(admin.delete_user("admin").await),
        ErrorCode::InvalidArgument
    );
    node.shutdown();
}

/// Waits until the node has closed `client`'s connection.
async fn closed_by_the_node(client: &Client, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !client.is_closed() {
        assert!(std::time::Instant::now() < deadline, "{what}: still open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A login binds a connection to a credential, not to a name: deleting a user or
/// giving it a new password closes its connections at once (counted), and a user made
/// again under the same name never inherits the old connections (found by review:
/// the old connection worked again, with the new user's rights).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_user_or_a_new_password_ends_its_connections() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(secured_config(dir.path())).unwrap();
    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    common::create_topic(&admin, "orders", "t", 1).await;
    let orders = Resource::Stream("orders".into());
    let grant = |permissions| Grant {
        resource: orders.clone(),
        permissions,
    };
    admin.create_user("alice", "first").await.unwrap();
    admin.grant("alice", grant(READ)).await.unwrap();
    let old = connect(&node, &login("alice", "first")).await.unwrap();
    old.fetch("orders", "t", 0, 0, 1 << 10, 0).await.unwrap();

    // Deleted and made again with a new password and more rights: the old
    // connection is closed, before it can make a request, and never writes.
    admin.delete_user("alice").await.unwrap();
    admin.create_user("alice", "second").await.unwrap();
    admin.grant("alice", grant(READ | WRITE)).await.unwrap();
    closed_by_the_node(&old, "a deleted user's connection").await;
    assert_eq!(
        code(connect(&node, &login("alice", "first")).await),
        ErrorCode::AuthenticationFailed
    );

    // A new password, set by an administrator: the connection on the old one closes.
    let second = connect(&node, &login("alice", "second")).await.unwrap();
    second
        .produce("orders", "t", 0, &one_record_batch(b"y"))
        .await
        .unwrap();
    admin.change_password("alice", "third").await.unwrap();
    closed_by_the_node(&second, "a connection on the old password").await;
    assert_eq!(
        code(connect(&node, &login("alice", "second")).await),
        ErrorCode::AuthenticationFailed
    );

    // A credential's salt and iterations are bounded (a 15 MiB salt made every
    // stranger's 56-byte login start draw a 20 MB answer; 2^32-1 iterations were
    // taken): refused as arguments, for a new user and a new password alike.
    for (salt, iterations) in [(vec![7u8; 1024], 4096), (vec![7u8; 16], u32::MAX)] {
        for request in [
            braid_proto::client::Request::CreateUser {
                name: "bob",
                salt: &salt,
                iterations,
                stored_key: &[1; 32],
                server_key: &[2; 32],
            },
            braid_proto::client::Request::ChangePassword {
                name: "alice",
                salt: &salt,
                iterations,
                stored_key: &[1; 32],
                server_key: &[2; 32],
            },
        ] {
            assert_eq!(code(admin.call(&request).await), ErrorCode::InvalidArgument);
        }
    }

    // A user changes its own password: the answer arrives, then the connection
    // closes; it may not change another's.
    let third = connect(&node, &login("alice", "third")).await.unwrap();
    assert_eq!(
        code(third.change_password("admin", "mine now").await),
        ErrorCode::PermissionDenied
    );
    third.change_password("alice", "fourth").await.unwrap();
    closed_by_the_node(&third, "its own connection after a new password").await;
    let fourth = connect(&node, &login("alice", "fourth")).await.unwrap();
    fourth.fetch("orders", "t", 0, 0, 1 << 10, 0).await.unwrap();
    // The administrator's own connection is untouched by all of it.
    admin.list_users().await.unwrap();
    assert_eq!(
        code(admin.change_password("nobody", "x").await),
        ErrorCode::UserNotFound
    );
    assert_eq!(
        common::metric(node.http_addr(), "braid_logins_ended_total").await,
        3
    );
    node.shutdown();
}

/// An open node made no admin when turned secure, and any local process could have
/// made itself the only administrator first (found by review). Users, passwords and
/// grants are made only where logins are required; turned secure, the node bootstraps
/// `admin` as on a first start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_node_makes_no_users_so_turned_secure_it_has_only_its_admin() {
    let dir = tempfile::tempdir().unwrap();
    let open = Node::start(common::config(dir.path(), FsyncSetting::Never)).unwrap();
    let stranger = Client::connect(open.client_addr()).await.unwrap();
    stranger.create_stream("s").await.unwrap();
    assert_eq!(
        code(stranger.create_user("mallory", "mine").await),
        ErrorCode::PermissionDenied
    );
    let everything = Grant {
        resource: Resource::AllStreams,
        permissions: READ | WRITE,
    };
    assert_eq!(
        code(stranger.grant("admin", everything.clone()).await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(stranger.change_password("admin", "mine").await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(stranger.list_users().await),
        ErrorCode::PermissionDenied
    );
    drop(stranger);
    open.shutdown();

    let secured = Node::start(secured_config(dir.path())).unwrap();
    let admin = connect(&secured, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    let users = admin.list_users().await.unwrap();
    let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["admin"]);
    assert_eq!(
        code(connect(&secured, &login("mallory", "mine")).await),
        ErrorCode::AuthenticationFailed
    );
    admin.create_user("bob", "bobs").await.unwrap();
    admin.grant("bob", everything.clone()).await.unwrap();
    drop(admin);
    secured.shutdown();

    // Secure, then restarted open (found by review): a stranger could list the users
    // and grants, delete users and strip their grants.
    let open = Node::start(common::config(dir.path(), FsyncSetting::Never)).unwrap();
    let stranger = Client::connect(open.client_addr()).await.unwrap();
    assert_eq!(
        code(stranger.list_users().await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(stranger.revoke("bob", everything).await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(stranger.delete_user("bob").await),
        ErrorCode::PermissionDenied
    );
    drop(stranger);
    open.shutdown();
    let secured = Node::start(secured_config(dir.path())).unwrap();
    let bob = connect(&secured, &login("bob", "bobs")).await.unwrap();
    assert_eq!(
        bob.list_streams().await.unwrap().len(),
        1,
        "bob keeps his grant"
    );
    secured.shutdown();
}

/// A fetch parked at the end of the log before a revoke gets nothing written after
/// it (found by review: it answered with the record produced after the revoke).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_parked_before_a_revoke_gets_nothing_written_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(secured_config(dir.path())).unwrap();
    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    common::create_topic(&admin, "vault", "t", 1).await;
    admin.create_user("bob", "bobs").await.unwrap();
    let read = Grant {
        resource: Resource::Stream("vault".into()),
        permissions: READ,
    };
    admin.grant("bob", read.clone()).await.unwrap();
    let bob = connect(&node, &login("bob", "bobs")).await.unwrap();
    let parked = {
        let bob = bob.clone();
        tokio::spawn(async move { bob.fetch("vault", "t", 0, 0, 1 << 20, 10_000).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    admin.revoke("bob", read).await.unwrap();
    admin
        .produce("vault", "t", 0, &one_record_batch(b"secret"))
        .await
        .unwrap();
    let answer = parked.await.unwrap();
    assert_eq!(code(answer), ErrorCode::PermissionDenied);
    node.shutdown();
}

/// The data directory holds every record and the users' SCRAM keys: everything the
/// node makes in it is its owner's alone (found by review: 0755 and 0644, readable by
/// any local user).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_is_private_to_the_node_s_user() {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    let data = parent.path().join("data");
    let node = Node::start(secured_config(&data)).unwrap();
    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    common::create_topic(&admin, "s", "t", 2).await;
    admin.create_user("alice", "pw").await.unwrap();
    for partition in 0..2 {
        admin
            .produce("s", "t", partition, &one_record_batch(b"private"))
            .await
            .unwrap();
    }
    drop(admin);
    node.shutdown();
    let mut dirs = vec![data.clone()];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "{}", path.display());
                files += 1;
            }
        }
    }
    assert!(files > 10, "only {files} files");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_grants_survive_a_restart_and_a_drawn_admin_password_is_kept_private() {
    let dir = tempfile::tempdir().unwrap();
    let config = NodeConfig {
        authentication: true,
        ..common::config(dir.path(), FsyncSetting::Never)
    };
    let node = Node::start(config.clone()).unwrap();
    let password_file = dir.path().join("admin-password");
    let drawn = std::fs::read_to_string(&password_file).unwrap();
    let drawn = drawn.trim_end().to_owned();
    assert!(drawn.len() >= 20, "a short drawn password: {drawn:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&password_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the password file is readable by others"
        );
    }
    let admin = connect(&node, &login("admin", &drawn)).await.unwrap();
    admin.create_stream("s").await.unwrap();
    admin.create_user("bob", "bob-pw-1").await.unwrap();
    let read_s = Grant {
        resource: Resource::Stream("s".into()),
        permissions: READ,
    };
    admin.grant("bob", read_s.clone()).await.unwrap();
    drop(admin);
    node.shutdown();

    // The file is gone (as the log tells the operator to do); a restart keeps the
    // users and draws nothing new.
    std::fs::remove_file(&password_file).unwrap();
    let node = Node::start(config).unwrap();
    assert!(!password_file.exists(), "a second admin was drawn");
    let bob = connect(&node, &login("bob", "bob-pw-1")).await.unwrap();
    assert_eq!(bob.list_streams().await.unwrap().len(), 1);
    let admin = connect(&node, &login("admin", &drawn)).await.unwrap();
    let users = admin.list_users().await.unwrap();
    let bob_user = users.iter().find(|u| u.name == "bob").unwrap();
    assert_eq!(bob_user.grants, [read_s]);
    node.shutdown();
}

#[test]
fn a_node_beyond_loopback_refuses_to_start_without_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let open = NodeConfig {
        client_addr: "0.0.0.0:0".parse().unwrap(),
        ..common::config(dir.path(), FsyncSetting::Never)
    };
    let refused = Node::start(open.clone()).unwrap_err();
    assert!(matches!(refused, StartError::Config(_)), "{refused}");
    assert!(
        refused.to_string().contains("allow_unauthenticated"),
        "{refused}"
    );
    let node = Node::start(NodeConfig {
        allow_unauthenticated: true,
        ..open.clone()
    })
    .unwrap();
    node.shutdown();
    let node = Node::start(NodeConfig {
        authentication: true,
        admin_password: Some(Secret(ADMIN_PASSWORD.into())),
        ..open
    })
    .unwrap();
    node.shutdown();
}

/// A CA, a node certificate for `localhost` and a client certificate it signed, in PEM
/// files in `dir`.
struct Certificates {
    ca: PathBuf,
    node_cert: PathBuf,
    node_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    other_ca: PathBuf,
}

fn make_certificates(dir: &Path) -> Certificates {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let make_ca = || {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        (cert, key)
    };
    let (ca, ca_key) = make_ca();
    let (other_ca, _) = make_ca();
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let (node_cert, node_key) = leaf("localhost");
    let (client_cert, client_key) = leaf("a-client");
    Certificates {
        ca: write("ca.pem", &ca.pem()),
        node_cert: write("node.pem", &node_cert),
        node_key: write("node-key.pem", &node_key),
        client_cert: write("client.pem", &client_cert),
        client_key: write("client-key.pem", &client_key),
        other_ca: write("other-ca.pem", &other_ca.pem()),
    }
}

fn tls_config(dir: &Path, certs: &Certificates, client_ca: bool) -> NodeConfig {
    let mut config = secured_config(dir);
    config.tls.cert_file = Some(certs.node_cert.clone());
    config.tls.key_file = Some(certs.node_key.clone());
    config.tls.client_ca_file = client_ca.then(|| certs.ca.clone());
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_a_client_that_trusts_the_node_and_no_one_else() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certificates(dir.path());
    let node = Node::start(tls_config(&dir.path().join("data"), &certs, false)).unwrap();
    let options = |ca: &Path| ConnectOptions {
        tls: Some(TlsOptions::from_files(ca, Some("localhost"), None).unwrap()),
        ..login("admin", ADMIN_PASSWORD)
    };
    let client = connect(&node, &options(&certs.ca)).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    let batch = one_record_batch(&[7u8; 100_000]);
    for _ in 0..20 {
        client.produce("s", "t", 0, &batch).await.unwrap();
    }
    let fetched = client.fetch("s", "t", 0, 0, 4 << 20, 0).await.unwrap();
    assert_eq!(fetched.high_watermark, 20);
    assert!(fetched.batches.len() > 1_000_000, "a large answer over TLS");

    // A client that trusts another CA refuses the node; one that speaks plain TCP to
    // the TLS port is closed by it.
    let untrusted = connect(&node, &options(&certs.other_ca)).await;
    assert!(
        matches!(untrusted, Err(ClientError::Io { .. })),
        "{untrusted:?}"
    );
    let plain = Client::connect(node.client_addr()).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), plain.ping()).await;
    // Told why (it read the node's TLS alert as a frame of 352,518,912 bytes before).
    assert!(
        matches!(&answer, Ok(Err(ClientError::Protocol(message))) if message.contains("speaks TLS")),
        "{answer:?}"
    );
    let failures = common::metric(node.http_addr(), "braid_tls_handshake_failures_total").await;
    assert!(failures >= 1, "no handshake failure counted");
    node.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_a_client_certificate_from_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certificates(dir.path());
    let node = Node::start(tls_config(&dir.path().join("data"), &certs, true)).unwrap();
    let with_identity = ConnectOptions {
        tls: Some(
            TlsOptions::from_files(
                &certs.ca,
                Some("localhost"),
                Some((&certs.client_cert, &certs.client_key)),
            )
            .unwrap(),
        ),
        ..login("admin", ADMIN_PASSWORD)
    };
    let client = connect(&node, &with_identity).await.unwrap();
    client.create_stream("s").await.unwrap();
    // Without a certificate the handshake (or the first answer, with TLS 1.3) fails.
    let anonymous = ConnectOptions {
        tls: Some(TlsOptions::from_files(&certs.ca, Some("localhost"), None).unwrap()),
        ..login("admin", ADMIN_PASSWORD)
    };
    let refused = tokio::time::timeout(Duration::from_secs(5), connect(&node, &anonymous))
        .await
        .unwrap();
    assert!(refused.is_err(), "a client without a certificate got in");
    node.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_clone_of_a_client_closes_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(common::config(dir.path(), FsyncSetting::Never)).unwrap();
    let client = Client::connect(node.client_addr()).await.unwrap();
    let clone = client.clone();
    client.ping().await.unwrap();
    assert_eq!(
        common::metric(node.http_addr(), "braid_connections_active").await,
        1
    );
    drop(client);
    clone.ping().await.unwrap();
    drop(clone);
    let started = std::time::Instant::now();
    while common::metric(node.http_addr(), "braid_connections_active").await != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the dropped client's connection stayed open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_with_settings_stay_manageable_by_a_stream_manager() {
    // `manage` on one stream is enough to create and delete its topics and the
    // stream itself, and nothing on another.
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(secured_config(dir.path())).unwrap();
    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    admin.create_stream("team").await.unwrap();
    admin.create_stream("other").await.unwrap();
    admin.create_user("lead", "lead-pw").await.unwrap();
    admin
        .grant(
            "lead",
            Grant {
                resource: Resource::Stream("team".into()),
                permissions: braid_proto::client::MANAGE,
            },
        )
        .await
        .unwrap();
    let lead = connect(&node, &login("lead", "lead-pw")).await.unwrap();
    let settings = TopicSettings {
        partitions: 2,
        ..TopicSettings::default()
    };
    lead.create_topic("team", "events", settings).await.unwrap();
    assert_eq!(
        lead.describe_topic("team", "events")
            .await
            .unwrap()
            .partitions
            .len(),
        2
    );
    assert_eq!(
        code(lead.create_topic("other", "events", settings).await),
        ErrorCode::PermissionDenied
    );
    lead.delete_topic("team", "events").await.unwrap();
    lead.delete_stream("team").await.unwrap();
    assert_eq!(
        code(lead.delete_stream("other").await),
        ErrorCode::PermissionDenied
    );
    node.shutdown();
}

/// Reads until the node closes the socket (or `within` passes): the bytes read, and
/// how long the close took (`None`: still open).
async fn read_until_closed(
    stream: &mut tokio::net::TcpStream,
    within: Duration,
) -> (Vec<u8>, Option<Duration>) {
    let started = std::time::Instant::now();
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = within.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (bytes, Some(started.elapsed())),
            Ok(Ok(n)) => bytes.extend_from_slice(&chunk[..n]),
            Err(_) => return (bytes, None),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_hold_a_connection_or_send_large_frames() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(NodeConfig {
        connection_login_ms: 300,
        ..secured_config(dir.path())
    })
    .unwrap();
    // Pings keep a connection busy but do not log it in: closed at the login deadline.
    let mut stranger = tokio::net::TcpStream::connect(node.client_addr())
        .await
        .unwrap();
    let mut ping = Vec::new();
    braid_proto::client::Request::Ping.encode(1, &mut ping);
    stranger.write_all(&ping).await.unwrap();
    let (answers, closed) = read_until_closed(&mut stranger, Duration::from_secs(5)).await;
    assert!(!answers.is_empty(), "the ping was answered");
    let closed = closed.expect("a connection that never logged in stayed open");
    assert!(
        closed >= Duration::from_millis(200),
        "closed after {closed:?}"
    );

    // Before the login, a frame over 64 KiB is refused and the connection closed...
    let mut stranger = tokio::net::TcpStream::connect(node.client_addr())
        .await
        .unwrap();
    let mut header = Vec::new();
    header.extend_from_slice(&(1u32 << 20).to_be_bytes());
    header.extend_from_slice(&7u64.to_be_bytes());
    header.extend_from_slice(&(braid_proto::client::Command::Produce as u16).to_be_bytes());
    stranger.write_all(&header).await.unwrap();
    let (answer, closed) = read_until_closed(&mut stranger, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "the stranger's connection stayed open");
    let status = u16::from_be_bytes([answer[14], answer[15]]);
    assert_eq!(status, ErrorCode::FrameTooLarge as u16);

    // ...while a logged-in client sends a 1 MiB batch, and stays past the deadline.
    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    common::create_topic(&admin, "s", "t", 1).await;
    admin
        .produce("s", "t", 0, &one_record_batch(&[1u8; 1 << 20]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    admin.ping().await.unwrap();
    node.shutdown();
}

/// A client that opens a TLS port and never finishes the handshake holds its socket no
/// longer than the first-frame deadline, however it stalls: silent, or mid-hello.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_tls_handshake_is_closed_at_the_first_frame_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certificates(dir.path());
    let mut config = tls_config(&dir.path().join("data"), &certs, false);
    config.connection_first_frame_ms = 300;
    let node = Node::start(config).unwrap();
    // Silent, then a TLS record header announcing a hello that never comes.
    for opening in [&[][..], &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01][..]] {
        let mut stalled = tokio::net::TcpStream::connect(node.client_addr())
            .await
            .unwrap();
        stalled.write_all(opening).await.unwrap();
        let (_, closed) = read_until_closed(&mut stalled, Duration::from_secs(5)).await;
        let closed = closed.expect("a stalled handshake kept its socket");
        assert!(
            closed >= Duration::from_millis(250),
            "closed after {closed:?}"
        );
    }
    // Counted once the shard has dropped the connection (under load, a moment after
    // the client saw it closed).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while common::metric(node.http_addr(), "braid_tls_handshake_failures_total").await < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the stalled handshakes were not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.shutdown();
}
