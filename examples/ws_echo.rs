//! A WebSocket echo upstream for the tests: `ws_echo [ADDR]` (default 127.0.0.1:9002) prints
//! `listening on ADDR` once bound, accepts WebSocket handshakes on any path and sends every
//! text or binary message back, prefixed with `echo: ` for text. The handshake request's
//! `x-tenant-id` (set by the gateway) is sent first as a text message `tenant: ID`.

use futures_util::{SinkExt, StreamExt};
use std::io::Write as _;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9002".to_string());
    let listener = match TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ws_echo: cannot bind {addr}: {e}");
            std::process::exit(1);
        }
    };
    let local = listener.local_addr().map_or(addr, |a| a.to_string());
    println!("listening on {local}");
    let _ = std::io::stdout().flush();
    while let Ok((sock, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut tenant = String::new();
            #[allow(clippy::result_large_err)] // the signature tungstenite asks for
            let seen = |req: &Request, resp: Response| {
                tenant = req
                    .headers()
                    .get("x-tenant-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                Ok(resp)
            };
            let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(sock, seen).await else {
                return;
            };
            if ws
                .send(Message::text(format!("tenant: {tenant}")))
                .await
                .is_err()
            {
                return;
            }
            while let Some(Ok(msg)) = ws.next().await {
                let reply = match msg {
                    Message::Text(t) => Message::text(format!("echo: {}", t.as_str())),
                    Message::Binary(b) => Message::Binary(b),
                    Message::Close(_) => break,
                    _ => continue,
                };
                if ws.send(reply).await.is_err() {
                    break;
                }
            }
        });
    }
}
