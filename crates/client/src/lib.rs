//! The Braid Rust SDK.
//!
//! - [`Client`]: a handle on a cluster (or one node): a pipelined connection to each
//!   member, each produce and fetch sent to its partition's primary and each group
//!   call to the coordinator, with the admin calls (streams, topics, groups, users)
//!   and raw produce and fetch.
//! - [`Producer`]: routes records by key, batches per partition by size and linger,
//!   keeps several batches in flight, and answers each record with its offset.
//! - [`Consumer`]: reads assigned partitions or joins a consumer group, and commits.
//!
//! ```no_run
//! # async fn tour() -> Result<(), braid_client::ClientError> {
//! use braid_client::{Client, Consumer, ConsumerConfig, Producer, ProducerConfig};
//! use braid_proto::client::TopicSettings;
//!
//! let client = Client::connect("127.0.0.1:7070").await?;
//! client.create_stream("shop").await?;
//! client.create_topic("shop", "orders", TopicSettings { partitions: 4, ..Default::default() }).await?;
//! let producer = Producer::new(&client, "shop", "orders", ProducerConfig::default()).await?;
//! let stored = producer.send(Some(b"customer-7"), b"2 apples").await?;
//! println!("stored at partition {} offset {}", stored.partition, stored.offset);
//! let mut consumer = Consumer::join_group(&client, "shop", "orders", "billing", "worker-1", ConsumerConfig::default()).await?;
//! for record in consumer.poll(std::time::Duration::from_secs(1)).await? {
//!     println!("{}:{} {:?}", record.partition, record.offset, record.value);
//! }
//! consumer.close().await?;
//! # Ok(()) }
//! ```

mod admin;
mod client;
mod connection;
mod consumer;
mod error;
mod options;
mod producer;
mod routes;
mod session;

pub use client::{Client, MemberStatus};
pub use connection::{default_addr, Fetched};
pub use consumer::{
    decode_records, Consumer, ConsumerConfig, ConsumerRecord, RecordView, StartFrom,
};
pub use error::ClientError;
pub use options::{ConnectOptions, Credentials, TlsOptions};
pub use producer::{Producer, ProducerConfig, RecordMetadata, Router};

/// The README's Rust snippet, compiled as a doctest so it cannot drift from the SDK.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeSnippets;
