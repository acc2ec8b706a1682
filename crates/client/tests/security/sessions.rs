//! Whose client session it is (part of `security.rs`, one test binary).

use super::*;

/// A logged-in user's client session is its own: another user, even one allowed to
/// write to the same stream, can neither produce under it (a retry under it would be
/// answered the owner's offsets, and a request number taken would make the owner's
/// own request look sent again), nor heartbeat it, end it or join a group with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_client_session_is_its_own() {
    use braid_proto::client::{Request, Response};
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(secured_config(dir.path())).unwrap();
    let admin = connect(&node, &login("admin", ADMIN_PASSWORD))
        .await
        .unwrap();
    common::create_topic(&admin, "orders", "t", 1).await;
    let everything = Grant {
        resource: Resource::Stream("orders".into()),
        permissions: READ | WRITE,
    };
    for user in ["alice", "bob"] {
        admin
            .create_user(user, &format!("{user}-pw"))
            .await
            .unwrap();
        admin.grant(user, everything.clone()).await.unwrap();
    }
    let alice = connect(&node, &login("alice", "alice-pw")).await.unwrap();
    let bob = connect(&node, &login("bob", "bob-pw")).await.unwrap();
    let session = alice
        .register_session(Duration::from_secs(30))
        .await
        .unwrap();
    let tagged = |request, value: &[u8]| {
        let mut builder = braid_proto::BatchBuilder::new(1_000);
        builder.push(None, Some(value), &[], 1_000);
        builder.producer(session as i64, -1, request);
        builder.finish()
    };
    let join = Request::JoinGroup {
        stream: "orders",
        group: "g",
        topic: "t",
        member_name: "m",
        session_timeout_ms: 30_000,
        session,
    };

    let denied = ErrorCode::PermissionDenied;
    let produced = bob.produce("orders", "t", 0, &tagged(0, b"bob's")).await;
    assert_eq!(code(produced), denied);
    assert_eq!(code(bob.session_heartbeat(session).await), denied);
    assert_eq!(code(bob.end_session(session).await), denied);
    assert_eq!(code(bob.call(&join).await), denied);

    // The owner's request 0 is its own, stored once; the rest works for it alone.
    let first = tagged(0, b"alice's");
    assert_eq!(
        alice.produce("orders", "t", 0, &first).await.unwrap(),
        (0, 0)
    );
    assert_eq!(
        alice.produce("orders", "t", 0, &first).await.unwrap(),
        (0, 0)
    );
    alice.session_heartbeat(session).await.unwrap();
    let Response::Assignment {
        member_id,
        generation,
        ..
    } = alice.call(&join).await.unwrap()
    else {
        panic!("not an assignment");
    };
    // The member alice joined is hers too: bob cannot keep it (and its session)
    // alive, commit as it or take it out (found by review: group heartbeats kept
    // another user's session open).
    let member = braid_proto::client::GroupMemberRequest {
        stream: "orders",
        group: "g",
        member_id,
        generation,
    };
    let heartbeat = Request::Heartbeat {
        member: member.clone(),
        owned: Vec::new(),
    };
    let commit = Request::CommitOffsets {
        member,
        offsets: vec![(0, 1)],
    };
    let leave = Request::LeaveGroup {
        stream: "orders",
        group: "g",
        member_id,
    };
    for request in [&heartbeat, &commit, &leave] {
        assert_eq!(code(bob.call(request).await), denied, "{request:?}");
    }
    alice.call(&heartbeat).await.unwrap();
    let read = common::read_partition(&admin, "orders", "t", 0).await;
    assert_eq!(read, [b"alice's".to_vec()]);

    // alice is deleted and made again: the new alice inherits neither the session
    // nor the member (found by review: ownership followed the name).
    admin.delete_user("alice").await.unwrap();
    admin.create_user("alice", "new-pw").await.unwrap();
    admin.grant("alice", everything.clone()).await.unwrap();
    let again = connect(&node, &login("alice", "new-pw")).await.unwrap();
    let ended = ErrorCode::SessionNotFound;
    assert_eq!(code(again.session_heartbeat(session).await), ended);
    let produced = again.produce("orders", "t", 0, &tagged(1, b"new")).await;
    assert_eq!(code(produced), ended);
    assert_eq!(code(again.call(&heartbeat).await), ErrorCode::UnknownMember);
}
