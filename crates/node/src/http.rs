//! The HTTP admin endpoint: `/health` and `/metrics` (Prometheus text format). It runs
//! on its own small thread so a scrape never waits behind a shard.

use std::sync::Arc;

use axum::http::header;
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
    ) -> std::io::Result<Self> {
        listener.set_nonblocking(true)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("braid-http".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let metrics = shared;
                    let app = Router::new()
                        .route(
                            "/health",
                            get(|| async {
                                (
                                    [(header::CONTENT_TYPE, "application/json")],
                                    "{\"status\":\"ok\"}\n",
                                )
                            }),
                        )
                        .route(
                            "/metrics",
                            get(move || {
                                let metrics = Arc::clone(&metrics);
                                async move {
                                    (
                                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                                        render(&metrics.metrics, metrics.bus_metrics.get()),
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

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}
