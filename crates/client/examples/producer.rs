//! Produces keyed records and prints where each was stored.
//!
//! ```sh
//! cargo run -p braid-client --example producer -- 127.0.0.1:7070
//! ```

use braid_client::{Client, ClientError, Producer, ProducerConfig};
use braid_proto::client::{ErrorCode, TopicSettings};

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7070".into());
    let client = Client::connect(addr.as_str()).await?;
    // Creating what exists already is fine for an example.
    ignore_exists(client.create_stream("demo").await)?;
    let settings = TopicSettings {
        partitions: 4,
        ..TopicSettings::default()
    };
    ignore_exists(client.create_topic("demo", "events", settings).await)?;
    let producer = Producer::new(&client, "demo", "events", ProducerConfig::default()).await?;
    let sends: Vec<_> = (0..10)
        .map(|i| {
            let key = format!("user-{}", i % 3);
            producer.send(Some(key.as_bytes()), format!("event {i}").as_bytes())
        })
        .collect();
    for (i, send) in sends.into_iter().enumerate() {
        let stored = send.await?;
        println!(
            "event {i} -> partition {} offset {}",
            stored.partition, stored.offset
        );
    }
    Ok(())
}

fn ignore_exists(result: Result<(), ClientError>) -> Result<(), ClientError> {
    match result {
        Err(err)
            if matches!(
                err.code(),
                Some(ErrorCode::StreamExists | ErrorCode::TopicExists)
            ) =>
        {
            Ok(())
        }
        other => other,
    }
}
