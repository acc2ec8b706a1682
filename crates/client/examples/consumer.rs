//! Reads every partition of a topic from the start and prints the records.
//!
//! ```sh
//! cargo run -p braid-client --example consumer -- 127.0.0.1:7070
//! ```

use std::time::Duration;

use braid_client::{Client, ClientError, Consumer, ConsumerConfig};

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7070".into());
    let client = Client::connect(addr.as_str()).await?;
    let mut consumer =
        Consumer::all_partitions(&client, "demo", "events", ConsumerConfig::default()).await?;
    loop {
        let records = consumer.poll(Duration::from_secs(1)).await?;
        if records.is_empty() {
            break;
        }
        for r in records {
            let value =
                String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
            println!("partition {} offset {}: {value}", r.partition, r.offset);
        }
    }
    Ok(())
}
