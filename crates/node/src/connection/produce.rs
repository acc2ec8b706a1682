//! A produce on a connection: the batch checked against its topic (size, key range)
//! and its client session, then handed to the partition's shard, and answered when it
//! commits.

use std::sync::Arc;

use braid_proto::client::{Command, ErrorCode, Response};
use braid_proto::ValidatedBatch;
use bytes::BytesMut;
use tokio::sync::oneshot;

use super::{error_frame, in_flight, shutting_down, Env, Outgoing};
use crate::error::NodeError;
use crate::layout::{PartitionKey, TopicRoute};
use crate::mailbox::ShardRequest;
use crate::replication::group_client::Checked;
use crate::replication::partition_machine::slices::{SessionTag, Tagged};

pub(super) async fn produce(
    env: &Env,
    request_id: u64,
    route: Arc<TopicRoute>,
    key: PartitionKey,
    batch: BytesMut,
) -> Result<(), NodeError> {
    if batch.len() > route.settings.max_batch_bytes as usize {
        return Err(NodeError::new(
            ErrorCode::BatchTooLarge,
            format!(
                "batch of {} bytes exceeds the topic's {}",
                batch.len(),
                route.settings.max_batch_bytes
            ),
        ));
    }
    // A key's records must all go to the one partition whose range holds its hash, or
    // its order across splits and merges cannot hold: checked in the validation walk.
    let (start, end) = route
        .partition(key.partition)
        .map_or((0, u16::MAX), |meta| (meta.hash_start, meta.hash_end));
    let batch = ValidatedBatch::for_key_range(batch, start, end).map_err(|e| match e {
        braid_proto::BatchError::KeyOutOfRange { .. } => NodeError::new(
            ErrorCode::KeyOutOfRange,
            format!(
                "{e} {start}..={end} of partition {}: refresh the layout and route again",
                key.partition
            ),
        ),
        other => NodeError::new(ErrorCode::InvalidBatch, other.to_string()),
    })?;
    let checked = match SessionTag::of(batch.header()) {
        Tagged::Yes(tag) => {
            let layout = env.layout.borrow();
            if let Some(refusal) = layout.owner_refusal(tag.session, env.login.borrow().user()) {
                return Err(refusal);
            }
            layout.session_check(tag, key)?
        }
        Tagged::No | Tagged::Invalid => Checked::default(),
    };
    let (reply, wait) = oneshot::channel();
    let owner = key.shard(env.shared.shards());
    env.shared.inboxes[owner]
        .send(ShardRequest::Produce {
            key,
            batch,
            reply,
            checked,
        })
        .await
        .map_err(|_| shutting_down())?;
    let out = env.out.clone();
    let metrics = Arc::clone(&env.metrics);
    in_flight(env, async move {
        let mut frame = Vec::new();
        match wait.await {
            Ok(Ok((base_offset, last_offset))) => Response::Produced {
                base_offset,
                last_offset,
            }
            .encode(request_id, Command::Produce, &mut frame),
            Ok(Err(err)) => {
                metrics.error(err.code);
                frame = error_frame(request_id, Command::Produce as u16, &err);
            }
            Err(_) => {
                let err = shutting_down();
                frame = error_frame(request_id, Command::Produce as u16, &err);
            }
        }
        let _ = out.send(Outgoing::Frame(frame)).await;
    })
    .await;
    Ok(())
}
