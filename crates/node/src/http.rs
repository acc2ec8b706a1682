//! The HTTP admin endpoint: `/health` (alive, and whether every group is caught up),
//! `/ready` (the same, 503 until caught up), `/replication` (each group's view, status
//! and commit point with its checksum) and `/metrics` (Prometheus text format). It runs
//! on its own small thread so a scrape never waits behind a shard. With a token
//! (`http_token_file`), `/replication` and `/metrics` answer only a request that
//! carries it (`Authorization: Bearer TOKEN`); `/health` and `/ready`, which load
//! balancers ask without one, show only counts.

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;

use crate::mailbox::NodeShared;
use crate::metrics::render;

/// A running HTTP admin server.
#[derive(Debug)]
pub(crate) struct HttpServer {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    pub(crate) fn start(
        listener: std::net::TcpListener,
        shared: Arc<NodeShared>,
        token: Option<String>,
    ) -> std::io::Result<Self> {
        let token: Option<Arc<str>> = token.map(Arc::from);
        let replication_token = token.clone();
        let metrics_token = token;
        listener.set_nonblocking(true)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("braid-http".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let health = Arc::clone(&shared);
                    let replication = Arc::clone(&shared);
                    let ready = Arc::clone(&shared);
                    let metrics = shared;
                    let json = |body: String| ([(header::CONTENT_TYPE, "application/json")], body);
                    let app = Router::new()
                        .route(
                            "/health",
                            get(move || {
                                let summary = health.board.summary(health.cluster.node_id);
                                async move { json(summary.health_json()) }
                            }),
                        )
                        .route(
                            // 200 once caught up, 503 before (for load balancers and
                            // rolling restarts: wait for it before taking the next node).
                            "/ready",
                            get(move || {
                                let summary = ready.board.summary(ready.cluster.node_id);
                                async move {
                                    let code = if summary.caught_up() {
                                        StatusCode::OK
                                    } else {
                                        StatusCode::SERVICE_UNAVAILABLE
                                    };
                                    (code, json(summary.health_json())).into_response()
                                }
                            }),
                        )
                        .route(
                            "/replication",
                            get(move |headers: axum::http::HeaderMap| {
                                let allowed = authorized(&headers, replication_token.as_deref());
                                let node = replication.cluster.node_id;
                                let rows = allowed.then(|| replication.board.rows());
                                async move {
                                    match rows {
                                        Some(rows) => {
                                            json(crate::replication::status::rows_json(node, &rows))
                                                .into_response()
                                        }
                                        None => unauthorized(),
                                    }
                                }
                            }),
                        )
                        .route(
                            "/metrics",
                            get(move |headers: axum::http::HeaderMap| {
                                let allowed = authorized(&headers, metrics_token.as_deref());
                                let metrics = Arc::clone(&metrics);
                                async move {
                                    if !allowed {
                                        return unauthorized();
                                    }
                                    let summary = metrics.board.summary(metrics.cluster.node_id);
                                    (
                                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                                        render(&metrics.metrics, metrics.bus.get(), &summary),
                                    )
                                        .into_response()
                                }
                            }),
                        );
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(err) => {
                            tracing::error!(%err, "adopting the HTTP listener");
                            return;
                        }
                    };
                    let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    });
                    if let Err(err) = serve.await {
                        tracing::error!(%err, "HTTP admin server failed");
                    }
                });
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub(crate) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether `headers` carry `token` as a bearer token (always, when there is none).
fn authorized(headers: &axum::http::HeaderMap, token: Option<&str>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("");
    // The whole length compared whatever differs, so a guesser learns nothing from
    // the time an answer takes.
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn unauthorized() -> axum::response::Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "a bearer token is needed (http_token_file)\n",
    )
        .into_response()
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}
