use super::*;

fn settings(partitions: u32) -> TopicSettings {
    TopicSettings {
        partitions,
        ..TopicSettings::default()
    }
}

#[test]
fn ops_apply_replay_and_round_trip() {
    let ops = [
        MetaOp::CreateStream(op::CreateStream { name: "s".into() }),
        MetaOp::CreateTopic(op::CreateTopic {
            stream: "s".into(),
            name: "t".into(),
            settings: settings(4),
        }),
        MetaOp::CommitOffsets(op::CommitOffsets {
            stream: "s".into(),
            group: "g".into(),
            topic: "t".into(),
            offsets: vec![(0, 10), (3, 7)],
        }),
        MetaOp::CreateTopic(op::CreateTopic {
            stream: "s".into(),
            name: "u".into(),
            settings: settings(1),
        }),
        MetaOp::DeleteTopic(op::DeleteTopic {
            stream: "s".into(),
            name: "u".into(),
        }),
    ];
    let mut meta = Metadata::default();
    for (at, op) in ops.iter().enumerate() {
        meta.begin_op(at as u64 + 1);
        meta.apply(op).unwrap();
        let mut bytes = Vec::new();
        op.encode(&mut bytes);
        assert_eq!(&MetaOp::decode(&bytes).unwrap(), op);
    }
    let topic = meta.topic("s", "t").unwrap();
    assert_eq!(topic.partitions.len(), 4);
    assert!(
        topic.partitions.iter().all(|p| p.created_op == 2),
        "each partition keeps the op that created it"
    );
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
        MetaOp::CreateStream(op::CreateStream {
            name: "orders".into(),
        }),
        MetaOp::CreateUser(op::CreateUser {
            name: "alice".into(),
            credential: ScramCredential::derive("pw", b"salt", 4096),
        }),
        MetaOp::Grant(op::Grant {
            user: "alice".into(),
            grant: grant(orders.clone(), READ | WRITE),
        }),
        MetaOp::Grant(op::Grant {
            user: "alice".into(),
            grant: grant(Resource::Node, USERS),
        }),
        MetaOp::Revoke(op::Revoke {
            user: "alice".into(),
            grant: grant(orders.clone(), WRITE),
        }),
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
    // Without session owners (a count of none): written before they were kept.
    bytes.truncate(bytes.len() - 4);
    assert_eq!(Metadata::decode(&bytes).unwrap(), old);
    // Without memberships (a count of none): written before they were kept.
    bytes.truncate(bytes.len() - 4);
    assert_eq!(Metadata::decode(&bytes).unwrap(), old);
    // Without create ops (a count of none): written before they were kept.
    bytes.truncate(bytes.len() - 4);
    assert_eq!(Metadata::decode(&bytes).unwrap(), old);
    // Without retirement (retired through, no reports, no debts): written before it.
    bytes.truncate(bytes.len() - 16);
    assert_eq!(Metadata::decode(&bytes).unwrap(), old);
    // Without sessions (an op number and a count of none): written before sessions.
    bytes.truncate(bytes.len() - 12);
    assert_eq!(Metadata::decode(&bytes).unwrap(), old);
    bytes.truncate(bytes.len() - 4);
    assert_eq!(Metadata::decode(&bytes).unwrap(), old);
    // Refused: a duplicate user, a grant to nobody, on a missing stream, or of a
    // node permission on a stream.
    let before = meta.clone();
    for bad in [
        &ops[1],
        &MetaOp::Grant(op::Grant {
            user: "bob".into(),
            grant: grant(orders.clone(), READ),
        }),
        &MetaOp::Grant(op::Grant {
            user: "alice".into(),
            grant: grant(Resource::Stream("nope".into()), READ),
        }),
        &MetaOp::Grant(op::Grant {
            user: "alice".into(),
            grant: grant(orders.clone(), USERS),
        }),
    ] {
        assert!(meta.apply(bad).is_err(), "{bad:?}");
    }
    assert_eq!(meta, before);
    // A deleted stream takes its grants along: a new stream of that name is new.
    meta.apply(&MetaOp::DeleteStream(op::DeleteStream {
        name: "orders".into(),
    }))
    .unwrap();
    meta.apply(&ops[0]).unwrap();
    assert!(!meta.user("alice").unwrap().grants.contains_key(&orders));
    // The last user who can manage users cannot be deleted or lose that right.
    let delete_alice = MetaOp::DeleteUser(op::DeleteUser {
        name: "alice".into(),
    });
    assert!(meta.apply(&delete_alice).is_err());
    let revoke_users = MetaOp::Revoke(op::Revoke {
        user: "alice".into(),
        grant: grant(Resource::Node, USERS),
    });
    assert!(meta.apply(&revoke_users).is_err());
    meta.apply(&MetaOp::CreateUser(op::CreateUser {
        name: "bob".into(),
        credential: ScramCredential::derive("pw", b"salt", 4096),
    }))
    .unwrap();
    meta.apply(&MetaOp::Grant(op::Grant {
        user: "bob".into(),
        grant: grant(Resource::Node, USERS),
    }))
    .unwrap();
    meta.apply(&delete_alice).unwrap();
    assert_eq!(meta.users.keys().collect::<Vec<_>>(), ["bob"]);
}

#[test]
fn bad_ops_are_refused_and_change_nothing() {
    let mut meta = Metadata::default();
    meta.apply(&MetaOp::CreateStream(op::CreateStream { name: "s".into() }))
        .unwrap();
    let before = meta.clone();
    for op in [
        MetaOp::CreateStream(op::CreateStream { name: "s".into() }),
        MetaOp::CreateStream(op::CreateStream {
            name: "bad name".into(),
        }),
        MetaOp::CreateTopic(op::CreateTopic {
            stream: "nope".into(),
            name: "t".into(),
            settings: settings(1),
        }),
        MetaOp::CreateTopic(op::CreateTopic {
            stream: "s".into(),
            name: "t".into(),
            settings: settings(0),
        }),
        MetaOp::DeleteTopic(op::DeleteTopic {
            stream: "s".into(),
            name: "t".into(),
        }),
        MetaOp::CommitOffsets(op::CommitOffsets {
            stream: "s".into(),
            group: "g".into(),
            topic: "t".into(),
            offsets: vec![],
        }),
    ] {
        assert!(meta.apply(&op).is_err(), "{op:?}");
        assert_eq!(meta, before);
    }
}

proptest::proptest! {
    /// Every op decodes from its encoding to itself, and from any shorter prefix to an
    /// error (never a panic); two metadata states given the same ops agree on every
    /// result, every touch and every state; a refused op changes nothing; and the
    /// state survives its snapshot encoding. What keeps the metadata group's replicas
    /// equal, for every op the [`op`] module defines.
    #[test]
    fn every_op_round_trips_and_applies_deterministically(
        ops in proptest::collection::vec(crate::replication::machine::tests::op(), 0..60),
    ) {
        let (mut one, mut other) = (Metadata::default(), Metadata::default());
        for (at, op) in ops.iter().enumerate() {
            // Each op its own log op, but now and then two in one (a second session
            // register in one op is refused).
            if at % 3 != 2 {
                one.begin_op(at as u64 + 1);
                other.begin_op(at as u64 + 1);
            }
            let mut bytes = Vec::new();
            op.encode(&mut bytes);
            let decoded = MetaOp::decode(&bytes).unwrap();
            proptest::prop_assert_eq!(&decoded, op);
            for cut in 0..bytes.len() {
                proptest::prop_assert!(MetaOp::decode(&bytes[..cut]).is_err());
            }
            proptest::prop_assert_eq!(one.touches(op), other.touches(&decoded));
            let before = one.clone();
            let applied = one.apply(op);
            proptest::prop_assert_eq!(&applied, &other.apply(&decoded));
            if applied.is_err() {
                proptest::prop_assert_eq!(&one, &before);
            }
            proptest::prop_assert_eq!(&one, &other);
        }
        let mut bytes = Vec::new();
        one.encode(&mut bytes);
        proptest::prop_assert_eq!(Metadata::decode(&bytes).unwrap(), one);
    }
}

#[test]
fn an_unknown_op_code_is_refused_by_name() {
    let err = MetaOp::decode(&[200]).unwrap_err();
    assert!(err.to_string().contains("op"), "{err}");
    // A known op with bytes after it is refused too.
    let mut bytes = Vec::new();
    MetaOp::from(op::RaiseTopicIdFloor { floor: 3 }).encode(&mut bytes);
    bytes.push(0);
    assert!(MetaOp::decode(&bytes).is_err());
}

#[test]
fn a_sessions_id_is_the_op_that_registered_it_and_its_end_is_kept() {
    let mut meta = Metadata::default();
    let register = MetaOp::RegisterSession(op::RegisterSession { timeout_ms: 10_000 });
    meta.begin_op(7);
    meta.apply(&register).unwrap();
    let second = meta.apply(&register).unwrap_err();
    assert!(second.to_string().contains("op 7"), "{second}");
    let too_short = MetaOp::RegisterSession(op::RegisterSession { timeout_ms: 999 });
    meta.begin_op(8);
    assert!(meta.apply(&too_short).is_err());
    meta.begin_op(9);
    let end = MetaOp::EndSession(op::EndSession { session: 7 });
    meta.apply(&end).unwrap();
    meta.begin_op(10);
    meta.apply(&end).unwrap();
    assert_eq!(
        meta.sessions.get(&7),
        Some(&ClientSession {
            timeout_ms: 10_000,
            ended_at: Some(9)
        }),
        "the first end counts"
    );
    assert_eq!(
        meta.apply(&MetaOp::EndSession(op::EndSession { session: 8 })),
        Err(MetaError::SessionNotFound(8))
    );
    // A logged-in user's session keeps its owner (a user that exists), through a
    // snapshot, until it is retired.
    let owned = |user: &str| {
        MetaOp::RegisterOwnedSession(op::RegisterOwnedSession {
            timeout_ms: 10_000,
            user: user.into(),
        })
    };
    meta.begin_op(11);
    assert_eq!(
        meta.apply(&owned("alice")),
        Err(MetaError::UserNotFound("alice".into()))
    );
    meta.apply(&MetaOp::CreateUser(op::CreateUser {
        name: "alice".into(),
        credential: ScramCredential::derive("pw", b"salt", 4096),
    }))
    .unwrap();
    meta.begin_op(12);
    meta.apply(&owned("alice")).unwrap();
    assert_eq!(
        meta.session_owners.get(&12).map(String::as_str),
        Some("alice")
    );
    assert!(meta.apply(&register).is_err(), "one numbered op per log op");
    let mut bytes = Vec::new();
    meta.encode(&mut bytes);
    assert_eq!(Metadata::decode(&bytes).unwrap(), meta);
    meta.begin_op(13);
    meta.apply(&MetaOp::EndSession(op::EndSession { session: 12 }))
        .unwrap();
    meta.begin_op(14);
    meta.apply(&MetaOp::FinalizeSession(op::FinalizeSession {
        retired_through: 13,
        debt: Vec::new(),
    }))
    .unwrap();
    assert!(meta.session_owners.is_empty(), "forgotten with its session");
}

/// Reports gather per node; the finalize is due through the lowest watermark once
/// every member reported past what is retired, forgets every session ended at or
/// below it (open ones and later ends stay), replaces the debts, and all of it
/// rides the snapshot and the op encoding.
#[test]
fn a_finalize_forgets_the_sessions_every_member_proved_and_records_debt() {
    let mut meta = Metadata::default();
    let register = MetaOp::RegisterSession(op::RegisterSession { timeout_ms: 10_000 });
    for id in 1..=4 {
        meta.begin_op(id);
        meta.apply(&register).unwrap();
    }
    for (at, session) in [(5, 1), (6, 2), (8, 4)] {
        meta.begin_op(at);
        meta.apply(&MetaOp::EndSession(op::EndSession { session }))
            .unwrap();
    }
    let report = |node, watermark, debt: Vec<PartitionRef>| {
        MetaOp::ReportRetirement(op::ReportRetirement {
            node,
            watermark,
            debt,
        })
    };
    meta.begin_op(9);
    assert!(meta.apply(&report(0, 10, vec![])).is_err(), "past the op");
    meta.apply(&report(0, 8, vec![])).unwrap();
    meta.begin_op(10);
    meta.apply(&report(1, 6, vec![(3, 1)])).unwrap();
    assert_eq!(
        meta.retirement.due([0, 1, 2]),
        None,
        "node 2 has not reported"
    );
    let due = meta.retirement.due([0, 1]).unwrap();
    assert_eq!(
        due,
        op::FinalizeSession {
            retired_through: 6,
            debt: vec![(3, 1)]
        }
    );
    for finalize in [MetaOp::FinalizeSession(due.clone()), report(1, 8, vec![])] {
        let mut bytes = Vec::new();
        finalize.encode(&mut bytes);
        assert_eq!(MetaOp::decode(&bytes).unwrap(), finalize);
    }
    meta.begin_op(11);
    let touched = meta.touches(&MetaOp::FinalizeSession(due.clone()));
    assert!(touched.contains(&Touch::Session(1)) && touched.contains(&Touch::Debts));
    meta.apply(&MetaOp::FinalizeSession(due.clone())).unwrap();
    assert_eq!(meta.sessions.keys().copied().collect::<Vec<_>>(), [3, 4]);
    assert_eq!(meta.retirement.retired_through, 6);
    assert_eq!(meta.retirement.debts.get(&(3, 1)), Some(&6));
    assert_eq!(
        meta.retirement.reports.keys().copied().collect::<Vec<_>>(),
        [0],
        "node 1's report is used up, node 0's reaches further"
    );
    meta.begin_op(12);
    assert!(
        meta.apply(&MetaOp::FinalizeSession(due)).is_err(),
        "not past what is retired"
    );
    let mut bytes = Vec::new();
    meta.encode(&mut bytes);
    assert_eq!(Metadata::decode(&bytes).unwrap(), meta);
    meta.apply(&report(1, 8, vec![])).unwrap();
    let due = meta.retirement.due([0, 1]).unwrap();
    meta.begin_op(13);
    meta.apply(&MetaOp::FinalizeSession(due)).unwrap();
    assert_eq!(meta.sessions.keys().copied().collect::<Vec<_>>(), [3]);
    assert!(
        meta.retirement.debts.is_empty(),
        "a walk that proved it cleared it"
    );
}
