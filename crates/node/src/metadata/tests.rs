use super::*;

fn settings(partitions: u32) -> TopicSettings {
    TopicSettings {
        partitions,
        ..TopicSettings::default()
    }
}

#[test]
fn ops_apply_replay_and_round_trip() {
    let ops = vec![
        MetaOp::CreateStream { name: "s".into() },
        MetaOp::CreateTopic {
            stream: "s".into(),
            name: "t".into(),
            settings: settings(4),
        },
        MetaOp::CommitOffsets {
            stream: "s".into(),
            group: "g".into(),
            topic: "t".into(),
            offsets: vec![(0, 10), (3, 7)],
        },
        MetaOp::CreateTopic {
            stream: "s".into(),
            name: "u".into(),
            settings: settings(1),
        },
        MetaOp::DeleteTopic {
            stream: "s".into(),
            name: "u".into(),
        },
    ];
    let mut meta = Metadata::default();
    for op in &ops {
        meta.apply(op).unwrap();
        let mut bytes = Vec::new();
        op.encode(&mut bytes);
        assert_eq!(&MetaOp::decode(&bytes).unwrap(), op);
    }
    let topic = meta.topic("s", "t").unwrap();
    assert_eq!(topic.partitions.len(), 4);
    assert_eq!(topic.partitions[3].hash_end, 0xffff);
    assert_eq!(meta.stream("s").unwrap().groups["g"].offsets[&3], 7);
    let mut bytes = Vec::new();
    meta.encode(&mut bytes);
    assert_eq!(Metadata::decode(&bytes).unwrap(), meta);
    // Ids are never reused: a new topic gets the next one.
    meta.apply(&ops[3]).unwrap();
    assert_eq!(meta.topic("s", "u").unwrap().id, 2);
}

#[test]
fn users_and_grants_apply_round_trip_and_follow_their_stream() {
    use braid_proto::client::{READ, USERS, WRITE};
    let grant = |resource: Resource, permissions| Grant {
        resource,
        permissions,
    };
    let orders = Resource::Stream("orders".into());
    let ops = vec![
        MetaOp::CreateStream {
            name: "orders".into(),
        },
        MetaOp::CreateUser {
            name: "alice".into(),
            credential: ScramCredential::derive("pw", b"salt", 4096),
        },
        MetaOp::Grant {
            user: "alice".into(),
            grant: grant(orders.clone(), READ | WRITE),
        },
        MetaOp::Grant {
            user: "alice".into(),
            grant: grant(Resource::Node, USERS),
        },
        MetaOp::Revoke {
            user: "alice".into(),
            grant: grant(orders.clone(), WRITE),
        },
    ];
    let mut meta = Metadata::default();
    for op in &ops {
        meta.apply(op).unwrap();
        let mut bytes = Vec::new();
        op.encode(&mut bytes);
        assert_eq!(&MetaOp::decode(&bytes).unwrap(), op);
    }
    assert_eq!(meta.user("alice").unwrap().grants[&orders], READ);
    let mut bytes = Vec::new();
    meta.encode(&mut bytes);
    assert_eq!(Metadata::decode(&bytes).unwrap(), meta);
    // A snapshot written before users existed (no users section) still opens.
    let mut old = Metadata::default();
    old.apply(&ops[0]).unwrap();
    let mut bytes = Vec::new();
    old.encode(&mut bytes);
    bytes.truncate(bytes.len() - 4);
    assert_eq!(Metadata::decode(&bytes).unwrap(), old);
    // Refused: a duplicate user, a grant to nobody, on a missing stream, or of a
    // node permission on a stream.
    let before = meta.clone();
    for bad in [
        &ops[1],
        &MetaOp::Grant {
            user: "bob".into(),
            grant: grant(orders.clone(), READ),
        },
        &MetaOp::Grant {
            user: "alice".into(),
            grant: grant(Resource::Stream("nope".into()), READ),
        },
        &MetaOp::Grant {
            user: "alice".into(),
            grant: grant(orders.clone(), USERS),
        },
    ] {
        assert!(meta.apply(bad).is_err(), "{bad:?}");
    }
    assert_eq!(meta, before);
    // A deleted stream takes its grants along: a new stream of that name is new.
    meta.apply(&MetaOp::DeleteStream {
        name: "orders".into(),
    })
    .unwrap();
    meta.apply(&ops[0]).unwrap();
    assert!(!meta.user("alice").unwrap().grants.contains_key(&orders));
    // The last user who can manage users cannot be deleted or lose that right.
    let delete_alice = MetaOp::DeleteUser {
        name: "alice".into(),
    };
    assert!(meta.apply(&delete_alice).is_err());
    let revoke_users = MetaOp::Revoke {
        user: "alice".into(),
        grant: grant(Resource::Node, USERS),
    };
    assert!(meta.apply(&revoke_users).is_err());
    meta.apply(&MetaOp::CreateUser {
        name: "bob".into(),
        credential: ScramCredential::derive("pw", b"salt", 4096),
    })
    .unwrap();
    meta.apply(&MetaOp::Grant {
        user: "bob".into(),
        grant: grant(Resource::Node, USERS),
    })
    .unwrap();
    meta.apply(&delete_alice).unwrap();
    assert_eq!(meta.users.keys().collect::<Vec<_>>(), ["bob"]);
}

#[test]
fn bad_ops_are_refused_and_change_nothing() {
    let mut meta = Metadata::default();
    meta.apply(&MetaOp::CreateStream { name: "s".into() })
        .unwrap();
    let before = meta.clone();
    for op in [
        MetaOp::CreateStream { name: "s".into() },
        MetaOp::CreateStream {
            name: "bad name".into(),
        },
        MetaOp::CreateTopic {
            stream: "nope".into(),
            name: "t".into(),
            settings: settings(1),
        },
        MetaOp::CreateTopic {
            stream: "s".into(),
            name: "t".into(),
            settings: settings(0),
        },
        MetaOp::DeleteTopic {
            stream: "s".into(),
            name: "t".into(),
        },
        MetaOp::CommitOffsets {
            stream: "s".into(),
            group: "g".into(),
            topic: "t".into(),
            offsets: vec![],
        },
    ] {
        assert!(meta.apply(&op).is_err(), "{op:?}");
        assert_eq!(meta, before);
    }
}
