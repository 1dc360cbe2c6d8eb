//! A small, fast gRPC server over h2c (HTTP/2 with prior knowledge) for the benchmarks
//! (`scripts/bench-grpc`): the tests' grpcio server is far too slow to measure a proxy against.
//!
//! `grpc_upstream [ADDR]` (default 127.0.0.1:9003) prints `listening on ADDR` once bound (ADDR
//! may use port 0). Every call, whatever its method, is taken as unary: a request of exactly one
//! length-prefixed message gets `:status 200`, `content-type: application/grpc`, that message
//! back (prefix included) and the trailers `grpc-status: 0`; anything else gets a trailers-only
//! answer with `grpc-status: 13`. On SIGUSR1 it prints
//! `connections accepted=A open=O peak=P used=U calls=C`: connections accepted and calls
//! answered since the start, connections open now, and since the previous report the most
//! connections open at once and the connections that carried at least one call.

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, Request, Response};
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::net::{TcpListener, TcpStream};

static ACCEPTED: AtomicU64 = AtomicU64::new(0);
static OPEN: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);
/// The report period (one more at each report) and the connections that carried a call in it.
static PERIOD: AtomicU64 = AtomicU64::new(1);
static USED: AtomicU64 = AtomicU64::new(0);

/// One message of exactly the length its 5-byte prefix says (not compressed), or none.
fn one_message(body: &[u8]) -> bool {
    body.len() >= 5
        && body[0] == 0
        && u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize == body.len() - 5
}

async fn call(
    mut req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) -> Result<(), h2::Error> {
    let body = req.body_mut();
    let mut msg = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        // give the window back as the bytes are taken, so the client may send more
        let _ = body.flow_control().release_capacity(chunk.len());
        msg.extend_from_slice(&chunk);
    }
    CALLS.fetch_add(1, Relaxed);
    let head = Response::builder()
        .status(200)
        .header("content-type", "application/grpc");
    if !one_message(&msg) {
        let head = head
            .header("grpc-status", "13")
            .header("grpc-message", "expected%20one%20message");
        respond.send_response(head.body(()).expect("response"), true)?;
        return Ok(());
    }
    let mut send = respond.send_response(head.body(()).expect("response"), false)?;
    // send as the peer's window allows (messages here are small: usually at once)
    let mut msg = msg.freeze();
    while !msg.is_empty() {
        send.reserve_capacity(msg.len());
        let n = match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(n) => n?,
            None => return Ok(()), // the stream was reset
        };
        send.send_data(msg.split_to(n.min(msg.len())), false)?;
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    send.send_trailers(trailers)
}

async fn serve(sock: TcpStream) {
    let open = OPEN.fetch_add(1, Relaxed) + 1;
    PEAK.fetch_max(open, Relaxed);
    if let Ok(mut conn) = h2::server::handshake(sock).await {
        let mut counted_in = 0;
        while let Some(Ok((req, respond))) = conn.accept().await {
            let period = PERIOD.load(Relaxed);
            if counted_in != period {
                counted_in = period;
                USED.fetch_add(1, Relaxed);
            }
            tokio::spawn(async move {
                let _ = call(req, respond).await;
            });
        }
    }
    OPEN.fetch_sub(1, Relaxed);
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9003".to_string());
    let listener = match TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("grpc_upstream: cannot bind {addr}: {e}");
            std::process::exit(1);
        }
    };
    let local = listener.local_addr().map_or(addr, |a| a.to_string());
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        .expect("SIGUSR1");
    tokio::spawn(async move {
        while usr1.recv().await.is_some() {
            let open = OPEN.load(Relaxed);
            let peak = PEAK.swap(open, Relaxed).max(open);
            PERIOD.fetch_add(1, Relaxed);
            let used = USED.swap(0, Relaxed);
            println!(
                "connections accepted={} open={open} peak={peak} used={used} calls={}",
                ACCEPTED.load(Relaxed),
                CALLS.load(Relaxed)
            );
            let _ = std::io::stdout().flush();
        }
    });
    println!("listening on {local}");
    let _ = std::io::stdout().flush();
    loop {
        if let Ok((sock, _)) = listener.accept().await {
            ACCEPTED.fetch_add(1, Relaxed);
            let _ = sock.set_nodelay(true);
            tokio::spawn(serve(sock));
        }
    }
}
