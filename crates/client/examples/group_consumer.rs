//! Consumes as a member of consumer group `workers`: start several copies and the
//! topic's partitions are shared among them; progress is committed.
//!
//! ```sh
//! cargo run -p braid-client --example group_consumer -- 127.0.0.1:7070 worker-1
//! ```

use std::time::Duration;

use braid_client::{Client, ClientError, Consumer, ConsumerConfig};

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:7070".into());
    let name = args.next().unwrap_or_else(|| "worker".into());
    let client = Client::connect(addr.as_str()).await?;
    let mut consumer = Consumer::join_group(
        &client,
        "demo",
        "events",
        "workers",
        &name,
        ConsumerConfig::default(),
    )
    .await?;
    let mut idle = 0;
    while idle < 5 {
        let records = consumer.poll(Duration::from_secs(1)).await?;
        idle = if records.is_empty() { idle + 1 } else { 0 };
        for r in records {
            println!("{name}: partition {} offset {}", r.partition, r.offset);
        }
    }
    println!("{name}: owns {:?}", consumer.positions());
    consumer.close().await
}
