//! Bad input on one connection never hurts another, and never the node.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use braid_client::{Client, Consumer, ConsumerConfig, Producer, ProducerConfig};
use braid_node::FsyncSetting;
use braid_proto::client::{
    decode_error_message, error_code, frame_length, split_response, Command, ErrorCode, Request,
    TopicSettings, RESPONSE_HEADER_BYTES,
};
use common::TestNode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw connection that reads response frames one at a time.
struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// The next response frame: (request id, status, body); `None` at a close.
    async fn response(&mut self) -> Option<(u64, u16, Vec<u8>)> {
        loop {
            if let Ok(Some(total)) = frame_length(&self.buf, RESPONSE_HEADER_BYTES, 1 << 20) {
                let frame: Vec<u8> = self.buf.drain(..total).collect();
                let (header, body) = split_response(&frame).unwrap();
                return Some((header.request_id, header.status, body.to_vec()));
            }
            let mut chunk = [0u8; 4096];
            let read =
                tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut chunk)).await;
            let n = read.ok()?.ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn expect_error(&mut self, request_id: u64, code: ErrorCode) {
        let (id, status, body) = self.response().await.expect("an error response");
        assert_eq!(id, request_id);
        assert_eq!(
            error_code(status),
            code,
            "{}",
            decode_error_message(&body).unwrap()
        );
    }

    async fn expect_closed(&mut self) {
        assert!(
            self.response().await.is_none(),
            "the node closed the connection"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_get_errors_or_a_close_and_other_connections_carry_on() {
    let node = TestNode::start(FsyncSetting::Never);
    let good = Client::connect(node.addr()).await.unwrap();
    good.create_stream("s").await.unwrap();
    good.create_topic(
        "s",
        "t",
        TopicSettings {
            partitions: 2,
            ..TopicSettings::default()
        },
    )
    .await
    .unwrap();
    let producer = Producer::new(&good, "s", "t", ProducerConfig::default())
        .await
        .unwrap();

    // The healthy connection keeps producing while the bad ones misbehave.
    let background = {
        let producer = producer.clone();
        tokio::spawn(async move {
            let mut stored = 0;
            for round in 0..20u32 {
                let sends: Vec<_> = (0..100u32)
                    .map(|i| producer.send(Some(&(round * 100 + i).to_be_bytes()), b"value"))
                    .collect();
                for send in sends {
                    send.await.unwrap();
                    stored += 1;
                }
            }
            stored
        })
    };

    // An unknown command: an error with the request id, and the connection goes on.
    let mut bad = Raw::connect(node.addr()).await;
    let mut frame = Vec::new();
    frame.extend_from_slice(&10u32.to_be_bytes());
    frame.extend_from_slice(&77u64.to_be_bytes());
    frame.extend_from_slice(&999u16.to_be_bytes());
    bad.send(&frame).await;
    bad.expect_error(77, ErrorCode::UnknownCommand).await;

    // A malformed body (trailing bytes): an error, and the connection goes on.
    let mut frame = Vec::new();
    Request::CreateStream { name: "x" }.encode(78, &mut frame);
    frame.push(0xff);
    let length = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&length.to_be_bytes());
    bad.send(&frame).await;
    bad.expect_error(78, ErrorCode::MalformedRequest).await;

    // A produce whose batch is garbage: an error, and the connection goes on.
    let mut frame = Vec::new();
    Request::Produce {
        stream: "s",
        topic: "t",
        partition: 0,
        batch: &[1, 2, 3, 4, 5],
    }
    .encode(79, &mut frame);
    bad.send(&frame).await;
    bad.expect_error(79, ErrorCode::InvalidBatch).await;

    // A ping still works on that connection.
    let mut frame = Vec::new();
    Request::Ping.encode(80, &mut frame);
    bad.send(&frame).await;
    let (id, status, _) = bad.response().await.unwrap();
    assert_eq!((id, status), (80, 0));

    // An oversize frame: an error, then the node closes (the stream cannot be framed).
    let mut frame = Vec::new();
    frame.extend_from_slice(&(64u32 << 20).to_be_bytes());
    frame.extend_from_slice(&81u64.to_be_bytes());
    frame.extend_from_slice(&(Command::Produce as u16).to_be_bytes());
    bad.send(&frame).await;
    // Request id 0: the refusal is for the whole stream.
    bad.expect_error(0, ErrorCode::FrameTooLarge).await;
    bad.expect_closed().await;

    // Plain garbage (an HTTP request) reads as an absurd length: refused and closed.
    let mut garbage = Raw::connect(node.addr()).await;
    garbage.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    garbage.expect_error(0, ErrorCode::FrameTooLarge).await;
    garbage.expect_closed().await;

    // A frame cut short by a closed connection: nothing to answer, nothing breaks.
    let mut truncated = TcpStream::connect(node.addr()).await.unwrap();
    truncated.write_all(&[0, 0, 1, 0, 0, 0, 0]).await.unwrap();
    drop(truncated);

    // Random bytes that happen to frame.
    let mut random = Raw::connect(node.addr()).await;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..50 {
        let mut body = vec![0u8; 30];
        for byte in &mut body {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        let mut frame = Vec::new();
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&body);
        random.send(&frame).await;
    }
    for _ in 0..50 {
        let (_, status, _) = random
            .response()
            .await
            .expect("every framed request is answered");
        assert_ne!(status, 0);
    }

    assert_eq!(background.await.unwrap(), 2_000);
    let mut consumer = Consumer::all_partitions(&good, "s", "t", ConsumerConfig::default())
        .await
        .unwrap();
    let mut read = 0;
    while read < 2_000 {
        read += consumer
            .poll(Duration::from_millis(200))
            .await
            .unwrap()
            .len();
    }
    assert_eq!(read, 2_000);
    good.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics_over_http() {
    let node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    let producer = Producer::new(&client, "s", "t", ProducerConfig::default())
        .await
        .unwrap();
    producer.send(None, b"hello").await.unwrap();
    let get = |path: &'static str| {
        let addr = node.http_addr();
        async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            response
        }
    };
    let health = get("/health").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains("\"status\":\"ok\""));
    let metrics = get("/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("braid_produce_records_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("braid_requests_total{command=\"Produce\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("braid_partitions 1"), "{metrics}");
    assert!(metrics.contains("# TYPE braid_fsync_requests_total counter"));
}
