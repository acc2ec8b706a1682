//! The metadata group's state machine: [`Metadata::apply`] behind the
//! `braid_vsr::StateMachine` interface, so group 0 of every node applies the same
//! committed ops in the same order and holds the same streams, topics, offsets, users
//! and grants. Checkpoints are the metadata snapshot encoding.
//!
//! A request carries a batch of ops (a node sends what queued while its last request
//! was in flight, so offset commits share one round and one sync): `count: u32`, then
//! each [`MetaOp`] encoding as a byte string. Its result is the op number it applied at
//! (`u64`: a node that hears the answer from a remote primary waits until its own
//! replica has applied that far, so its client then sees the change on this node), then
//! `count: u32` and one outcome per op, in order: `status: u16` (0, or an `ErrorCode`)
//! then, for an error, the message as a wire string. A refused op (bad name, missing stream) changes nothing and is refused
//! alike on every replica; the others in its batch still apply.

use braid_proto::client::ErrorCode;
use braid_proto::wire::{WireReader, WireWrite};

use std::collections::{BTreeSet, VecDeque};

use crate::error::NodeError;
use crate::metadata::{MetaOp, Metadata, Touch};

/// Touches a machine keeps for the shell ([`MetadataMachine::news_since`]): a shell
/// further behind rebuilds the whole layout instead.
const TOUCHES_KEPT: usize = 4096;

/// The metadata as a replicated state machine.
#[derive(Debug, Clone, Default)]
pub(crate) struct MetadataMachine {
    state: Metadata,
    /// What the last applied ops touched ([`TOUCHES_KEPT`] at most), the last one being
    /// number `touched_end - 1`: the shell changes each shard's layout by them. Local
    /// to this replica, not part of the replicated state.
    touches: VecDeque<Touch>,
    touched_end: u64,
    /// `touched_end` just after the last restore (an installed checkpoint may change
    /// anything).
    restored_at: u64,
}

/// How the layout moved since the shell last looked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum LayoutNews {
    /// Nothing the layout is built from changed.
    #[default]
    Unchanged,
    /// These parts changed (read them from the metadata as it is now).
    Touched(BTreeSet<Touch>),
    /// Anything may have changed: rebuild it whole.
    Whole,
}

impl PartialEq for MetadataMachine {
    fn eq(&self, other: &Self) -> bool {
        self.state == other.state
    }
}

impl Eq for MetadataMachine {}

impl MetadataMachine {
    /// The metadata now.
    pub(crate) fn state(&self) -> &Metadata {
        &self.state
    }

    /// Counts the touches applied so far (and restores): a shell compares it with what
    /// it last saw.
    pub(crate) fn touched_end(&self) -> u64 {
        self.touched_end
    }

    /// How the layout moved since the shell saw `touched_end` equal to `seen`.
    pub(crate) fn news_since(&self, seen: u64) -> LayoutNews {
        let behind = self.touched_end.saturating_sub(seen);
        if behind == 0 {
            LayoutNews::Unchanged
        } else if self.restored_at > seen || behind > self.touches.len() as u64 {
            LayoutNews::Whole
        } else {
            let first = self.touches.len() - behind as usize;
            LayoutNews::Touched(self.touches.range(first..).cloned().collect())
        }
    }

    /// The input that proposes `ops`, in order.
    pub(crate) fn input(ops: &[MetaOp]) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u32_be(ops.len() as u32);
        let mut op_bytes = Vec::new();
        for op in ops {
            op_bytes.clear();
            op.encode(&mut op_bytes);
            out.put_bytes(&op_bytes);
        }
        out
    }

    /// The op a batch applied at and the outcome of each of its ops, from its result
    /// bytes.
    ///
    /// # Errors
    /// The result does not decode (a bug or a damaged reply).
    pub(crate) fn outcomes(result: &[u8]) -> Result<(u64, Vec<Result<(), NodeError>>), NodeError> {
        let malformed = |e: braid_proto::wire::WireError| {
            NodeError::new(ErrorCode::Internal, format!("metadata result: {e}"))
        };
        let mut r = WireReader::new(result);
        let op = r.u64("op").map_err(malformed)?;
        let count = r.count("outcomes", 2).map_err(malformed)?;
        let mut outcomes = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let status = r.u16("status").map_err(malformed)?;
            if status == 0 {
                outcomes.push(Ok(()));
                continue;
            }
            let message = r.string("message").map_err(malformed)?.to_owned();
            let code = ErrorCode::from_u16(status).unwrap_or(ErrorCode::Internal);
            outcomes.push(Err(NodeError::new(code, message)));
        }
        r.finish().map_err(malformed)?;
        Ok((op, outcomes))
    }

    /// The outcome of a batch of one op.
    #[cfg(test)]
    pub(crate) fn outcome(result: &[u8]) -> Result<(), NodeError> {
        let (_, mut outcomes) = Self::outcomes(result)?;
        match (outcomes.pop(), outcomes.is_empty()) {
            (Some(outcome), true) => outcome,
            _ => Err(NodeError::new(ErrorCode::Internal, "not one outcome")),
        }
    }

    fn apply_one(&mut self, bytes: &[u8]) -> Result<(), NodeError> {
        let op = MetaOp::decode(bytes).map_err(|err| {
            NodeError::new(ErrorCode::MalformedRequest, format!("metadata op: {err}"))
        })?;
        let touches = self.state.touches(&op);
        self.state.apply(&op).map_err(NodeError::from)?;
        for touch in touches {
            if self.touches.len() == TOUCHES_KEPT {
                self.touches.pop_front();
            }
            self.touches.push_back(touch);
            self.touched_end += 1;
        }
        Ok(())
    }
}

fn put_outcome(out: &mut Vec<u8>, outcome: Result<(), NodeError>) {
    match outcome {
        Ok(()) => out.put_u16_be(0),
        Err(err) => {
            out.put_u16_be(err.code as u16);
            out.put_string(&err.message);
        }
    }
}

impl braid_vsr::StateMachine for MetadataMachine {
    fn apply(&mut self, op: u64, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u64_be(op);
        self.state.begin_op(op);
        let mut r = WireReader::new(input);
        let mut outcomes = Vec::new();
        // A batch that does not decode whole applies nothing: one malformed outcome.
        let batch: Result<Vec<&[u8]>, _> = r.count("ops", 4).and_then(|count| {
            let ops = (0..count)
                .map(|_| r.bytes("op"))
                .collect::<Result<Vec<_>, _>>()?;
            r.finish()?;
            Ok(ops)
        });
        match batch {
            Ok(ops) => {
                for op in ops {
                    outcomes.push(self.apply_one(op));
                }
            }
            Err(err) => outcomes.push(Err(NodeError::new(
                ErrorCode::MalformedRequest,
                format!("metadata batch: {err}"),
            ))),
        }
        out.put_u32_be(outcomes.len() as u32);
        for outcome in outcomes {
            put_outcome(&mut out, outcome);
        }
        out
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.state.encode(&mut out);
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.state = Metadata::decode(snapshot).map_err(|e| e.to_string())?;
        self.touched_end += 1;
        self.restored_at = self.touched_end;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::metadata::op;
    use braid_proto::client::{Grant, Resource, TopicSettings, READ};
    use braid_proto::scram::ScramCredential;
    use braid_vsr::StateMachine;
    use proptest::prelude::*;

    /// Ops over a few names, so that many collide (exists, not found) and are refused.
    pub(crate) fn op() -> impl Strategy<Value = MetaOp> {
        let name = prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned);
        prop_oneof![
            name.clone()
                .prop_map(|name| MetaOp::CreateStream(op::CreateStream { name })),
            name.clone()
                .prop_map(|name| MetaOp::DeleteStream(op::DeleteStream { name })),
            (name.clone(), name.clone(), 0u32..4).prop_map(|(stream, name, partitions)| {
                MetaOp::CreateTopic(op::CreateTopic {
                    stream,
                    name,
                    settings: TopicSettings {
                        partitions,
                        ..TopicSettings::default()
                    },
                })
            }),
            (name.clone(), name.clone())
                .prop_map(|(stream, name)| MetaOp::DeleteTopic(op::DeleteTopic { stream, name })),
            (name.clone(), name.clone(), name.clone(), 0u32..3, 0u64..100).prop_map(
                |(stream, group, topic, partition, offset)| MetaOp::CommitOffsets(
                    op::CommitOffsets {
                        stream,
                        group,
                        topic,
                        offsets: vec![(partition, offset)],
                    }
                )
            ),
            name.clone()
                .prop_map(|name| MetaOp::CreateUser(op::CreateUser {
                    name,
                    credential: ScramCredential {
                        salt: b"salt".to_vec(),
                        iterations: 4096,
                        stored_key: [1; 32],
                        server_key: [2; 32],
                    },
                })),
            (name.clone(), 1u8..4).prop_map(|(name, key)| MetaOp::SetCredential(
                op::SetCredential {
                    name,
                    credential: ScramCredential {
                        salt: vec![key; 16],
                        iterations: 4096,
                        stored_key: [key; 32],
                        server_key: [key; 32],
                    },
                }
            )),
            name.clone()
                .prop_map(|name| MetaOp::DeleteUser(op::DeleteUser { name })),
            (500u32..700_000)
                .prop_map(|timeout_ms| MetaOp::RegisterSession(op::RegisterSession { timeout_ms })),
            (name.clone(), 500u32..700_000).prop_map(|(user, timeout_ms)| {
                MetaOp::RegisterOwnedSession(op::RegisterOwnedSession { timeout_ms, user })
            }),
            (0u64..12).prop_map(|session| MetaOp::EndSession(op::EndSession { session })),
            (name.clone(), name.clone()).prop_map(|(user, stream)| MetaOp::Grant(op::Grant {
                user,
                grant: Grant {
                    resource: Resource::Stream(stream),
                    permissions: READ,
                },
            })),
            (name.clone(), name.clone()).prop_map(|(user, stream)| MetaOp::Revoke(op::Revoke {
                user,
                grant: Grant {
                    resource: Resource::Stream(stream),
                    permissions: READ,
                },
            })),
            // Node permissions (the wire refuses bits that do not apply): taking USERS
            // from the last user who has it is refused.
            (name.clone(), any::<u8>(), any::<bool>()).prop_map(|(user, bits, give)| {
                let allowed = Resource::Node.permissions_allowed();
                let grant = Grant {
                    resource: Resource::Node,
                    permissions: Some(bits & allowed).filter(|b| *b != 0).unwrap_or(allowed),
                };
                if give {
                    MetaOp::Grant(op::Grant { user, grant })
                } else {
                    MetaOp::Revoke(op::Revoke { user, grant })
                }
            }),
            (0u32..8).prop_map(|floor| MetaOp::RaiseTopicIdFloor(op::RaiseTopicIdFloor { floor })),
            (name.clone(), name.clone(), name.clone(), 0u64..12).prop_map(
                |(stream, group, topic, session)| MetaOp::JoinGroup(op::JoinGroup {
                    stream,
                    group,
                    topic,
                    name: "m".into(),
                    session,
                    timeout_ms: 1_000,
                    user: if session % 2 == 0 {
                        String::new()
                    } else {
                        "a".into()
                    },
                })
            ),
            (name.clone(), name.clone(), 0u64..60).prop_map(|(stream, group, member)| {
                MetaOp::LeaveGroup(op::LeaveGroup {
                    stream,
                    group,
                    member,
                })
            }),
        ]
    }

    proptest! {
        /// Replicas that apply the same ops (some refused, and a garbage input) agree
        /// on every result and every state, and one restored from a checkpoint taken
        /// halfway goes on to the same results and state.
        #[test]
        fn replicas_agree_and_a_checkpoint_resumes_the_same(
            ops in prop::collection::vec(op(), 1..60),
            cut in 0usize..60,
            garbage in prop::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut inputs: Vec<Vec<u8>> = ops.chunks(2).map(MetadataMachine::input).collect();
            let cut = cut.min(inputs.len() - 1);
            inputs.insert(cut, garbage);
            let (mut first, mut second) = (MetadataMachine::default(), MetadataMachine::default());
            let mut restored = None;
            for (i, input) in inputs.iter().enumerate() {
                if i == cut {
                    let mut machine = MetadataMachine::default();
                    machine.restore(&first.snapshot()).unwrap();
                    prop_assert_eq!(&machine, &first);
                    restored = Some(machine);
                }
                let a = first.apply(i as u64 + 1, input);
                prop_assert_eq!(&a, &second.apply(i as u64 + 1, input));
                if let Some(machine) = restored.as_mut() {
                    prop_assert_eq!(&a, &machine.apply(i as u64 + 1, input));
                }
            }
            prop_assert_eq!(first.state(), second.state());
            prop_assert_eq!(Some(&first), restored.as_ref());
        }
    }

    #[test]
    fn results_carry_the_client_error_code() {
        let mut machine = MetadataMachine::default();
        let create =
            MetadataMachine::input(&[MetaOp::CreateStream(op::CreateStream { name: "s".into() })]);
        assert_eq!(MetadataMachine::outcome(&machine.apply(1, &create)), Ok(()));
        let again = MetadataMachine::outcome(&machine.apply(2, &create)).unwrap_err();
        assert_eq!(again.code, ErrorCode::StreamExists);
        let garbage = MetadataMachine::outcome(&machine.apply(3, &[0xff])).unwrap_err();
        assert_eq!(garbage.code, ErrorCode::MalformedRequest);
        assert!(MetadataMachine::outcome(&[0]).is_err(), "a cut result");
        // In a batch each op has its own outcome; a refused one does not stop the rest.
        let batch = MetadataMachine::input(&[
            MetaOp::CreateStream(op::CreateStream { name: "s".into() }),
            MetaOp::CreateStream(op::CreateStream { name: "t".into() }),
        ]);
        let (at, outcomes) = MetadataMachine::outcomes(&machine.apply(4, &batch)).unwrap();
        assert_eq!(at, 4, "the result names the op it applied at");
        assert_eq!(outcomes.len(), 2);
        assert_eq!(
            outcomes[0].as_ref().unwrap_err().code,
            ErrorCode::StreamExists
        );
        assert_eq!(outcomes[1], Ok(()));
        machine.restore(&machine.snapshot()).unwrap();
        assert!(machine.restore(b"not a snapshot").is_err());
        assert_eq!(
            machine.state().streams.len(),
            2,
            "a failed restore kept the state"
        );
    }

    #[test]
    fn news_name_what_changed_until_a_restore_or_too_many() {
        let mut machine = MetadataMachine::default();
        let create = |name: &str| {
            MetadataMachine::input(&[MetaOp::CreateStream(op::CreateStream {
                name: name.to_owned(),
            })])
        };
        assert_eq!(machine.news_since(0), LayoutNews::Unchanged);
        machine.apply(1, &create("a"));
        machine.apply(2, &create("a")); // refused: touches nothing
        machine.apply(3, &create("b"));
        let touched = [Touch::Stream("a".into()), Touch::Stream("b".into())];
        assert_eq!(
            machine.news_since(0),
            LayoutNews::Touched(touched.iter().cloned().collect())
        );
        assert_eq!(
            machine.news_since(1),
            LayoutNews::Touched(touched[1..].iter().cloned().collect())
        );
        let seen = machine.touched_end();
        assert_eq!(machine.news_since(seen), LayoutNews::Unchanged);
        let snapshot = machine.snapshot();
        machine.restore(&snapshot).unwrap();
        assert_eq!(machine.news_since(seen), LayoutNews::Whole);
        let seen = machine.touched_end();
        for i in 0..=TOUCHES_KEPT {
            machine.apply(4 + i as u64, &create(&format!("s{i}")));
        }
        assert_eq!(
            machine.news_since(seen),
            LayoutNews::Whole,
            "more than are kept"
        );
        assert!(
            matches!(machine.news_since(seen + 1), LayoutNews::Touched(t) if t.len() == TOUCHES_KEPT)
        );
    }
}
