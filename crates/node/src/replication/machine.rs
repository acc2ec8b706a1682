//! The metadata group's state machine: [`Metadata::apply`] behind the
//! `braid_vsr::StateMachine` interface, so group 0 of every node applies the same
//! committed ops in the same order and holds the same streams, topics, offsets, users
//! and grants. Checkpoints are the metadata snapshot encoding.
//!
//! An op's input is a [`MetaOp`] encoding; its result is `status: u16` (0, or an
//! `ErrorCode`) then, for an error, the message as a wire string. A refused op (bad
//! name, missing stream) changes nothing and is refused alike on every replica.

// Group 0's replicas run this once the replication host is in; until then only the
// tests do.
#![cfg_attr(not(test), allow(dead_code))]

use braid_proto::client::ErrorCode;
use braid_proto::wire::{WireReader, WireWrite};

use crate::error::NodeError;
use crate::metadata::{MetaOp, Metadata};

/// The metadata as a replicated state machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MetadataMachine {
    state: Metadata,
}

impl MetadataMachine {
    /// The metadata now.
    pub(crate) fn state(&self) -> &Metadata {
        &self.state
    }

    /// The input that proposes `op`.
    pub(crate) fn input(op: &MetaOp) -> Vec<u8> {
        let mut out = Vec::new();
        op.encode(&mut out);
        out
    }

    /// The outcome of an op from its result bytes.
    pub(crate) fn outcome(result: &[u8]) -> Result<(), NodeError> {
        let mut r = WireReader::new(result);
        let malformed = |e: braid_proto::wire::WireError| {
            NodeError::new(ErrorCode::Internal, format!("metadata result: {e}"))
        };
        let status = r.u16("status").map_err(malformed)?;
        if status == 0 {
            return r.finish().map_err(malformed);
        }
        let message = r.string("message").map_err(malformed)?.to_owned();
        r.finish().map_err(malformed)?;
        let code = ErrorCode::from_u16(status).unwrap_or(ErrorCode::Internal);
        Err(NodeError::new(code, message))
    }
}

fn result(outcome: Result<(), NodeError>) -> Vec<u8> {
    let mut out = Vec::new();
    match outcome {
        Ok(()) => out.put_u16_be(0),
        Err(err) => {
            out.put_u16_be(err.code as u16);
            out.put_string(&err.message);
        }
    }
    out
}

impl braid_vsr::StateMachine for MetadataMachine {
    fn apply(&mut self, _op: u64, input: &[u8]) -> Vec<u8> {
        let outcome = match MetaOp::decode(input) {
            Ok(op) => self.state.apply(&op).map_err(NodeError::from),
            Err(err) => Err(NodeError::new(
                ErrorCode::MalformedRequest,
                format!("metadata op: {err}"),
            )),
        };
        result(outcome)
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.state.encode(&mut out);
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.state = Metadata::decode(snapshot).map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::client::{Grant, Resource, TopicSettings, READ};
    use braid_proto::scram::ScramCredential;
    use braid_vsr::StateMachine;
    use proptest::prelude::*;

    /// Ops over a few names, so that many collide (exists, not found) and are refused.
    fn op() -> impl Strategy<Value = MetaOp> {
        let name = prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned);
        prop_oneof![
            name.clone().prop_map(|name| MetaOp::CreateStream { name }),
            name.clone().prop_map(|name| MetaOp::DeleteStream { name }),
            (name.clone(), name.clone(), 0u32..4).prop_map(|(stream, name, partitions)| {
                MetaOp::CreateTopic {
                    stream,
                    name,
                    settings: TopicSettings {
                        partitions,
                        ..TopicSettings::default()
                    },
                }
            }),
            (name.clone(), name.clone())
                .prop_map(|(stream, name)| MetaOp::DeleteTopic { stream, name }),
            (name.clone(), name.clone(), name.clone(), 0u32..3, 0u64..100).prop_map(
                |(stream, group, topic, partition, offset)| MetaOp::CommitOffsets {
                    stream,
                    group,
                    topic,
                    offsets: vec![(partition, offset)],
                }
            ),
            name.clone().prop_map(|name| MetaOp::CreateUser {
                name,
                credential: ScramCredential {
                    salt: b"salt".to_vec(),
                    iterations: 4096,
                    stored_key: [1; 32],
                    server_key: [2; 32],
                },
            }),
            name.clone().prop_map(|name| MetaOp::DeleteUser { name }),
            (name.clone(), name).prop_map(|(user, stream)| MetaOp::Grant {
                user,
                grant: Grant {
                    resource: Resource::Stream(stream),
                    permissions: READ,
                },
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
            let cut = cut.min(ops.len() - 1);
            let mut inputs: Vec<Vec<u8>> = ops.iter().map(MetadataMachine::input).collect();
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
                let a = first.apply(i as u64, input);
                prop_assert_eq!(&a, &second.apply(i as u64, input));
                if let Some(machine) = restored.as_mut() {
                    prop_assert_eq!(&a, &machine.apply(i as u64, input));
                }
            }
            prop_assert_eq!(first.state(), second.state());
            prop_assert_eq!(Some(&first), restored.as_ref());
        }
    }

    #[test]
    fn results_carry_the_client_error_code() {
        let mut machine = MetadataMachine::default();
        let create = MetadataMachine::input(&MetaOp::CreateStream { name: "s".into() });
        assert_eq!(MetadataMachine::outcome(&machine.apply(1, &create)), Ok(()));
        let again = MetadataMachine::outcome(&machine.apply(2, &create)).unwrap_err();
        assert_eq!(again.code, ErrorCode::StreamExists);
        let garbage = MetadataMachine::outcome(&machine.apply(3, &[0xff])).unwrap_err();
        assert_eq!(garbage.code, ErrorCode::MalformedRequest);
        assert!(MetadataMachine::outcome(&[0]).is_err(), "a cut result");
        assert!(machine.restore(b"not a snapshot").is_err());
        assert_eq!(
            machine.state().streams.len(),
            1,
            "a failed restore kept the state"
        );
    }
}
