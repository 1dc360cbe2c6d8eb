//! A small, fast HTTP/1.1 upstream for the demo (`make run`), the tests and the benchmarks.
//!
//! `upstream [ADDR] [NAME]` (default 127.0.0.1:9001, name = ADDR) prints `listening on ADDR`
//! once bound (ADDR may use port 0). Every request gets 200 with a JSON body naming the server
//! and echoing the method, path and request headers, so tests can see what reached the
//! upstream. `/healthz` answers 200 `ok`; `/status/NNN` (or any path with the request header
//! `x-answer-status: NNN`) answers with status NNN; `/delay/MS`
//! (anywhere in the path) answers after MS milliseconds, and may be combined with `/bytes/N`,
//! which answers N bytes; `/usage/N` adds `x-usage-tokens: N` to the answer (a cost the
//! answer carries); `/hits` answers how many requests it served before (but `/healthz` and `/hits`). With
//! `UPSTREAM_TLS=CERT:KEY` (PEM files) it speaks HTTPS.

use pingora::tls::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod};
use pingora::tls::tokio_ssl::SslStream;
use std::io::Write as _;
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// What `/bytes/N` answers, a chunk at a time.
static CHUNK: [u8; 64 << 10] = [b'x'; 64 << 10];

/// Requests served, but `/healthz` and `/hits` (which reports it).
static HITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Skip a chunked body in `buf[start..]`; returns the end offset once complete.
fn chunked_end(buf: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let line_end = buf[i..].windows(2).position(|w| w == b"\r\n")? + i;
        let size_txt = std::str::from_utf8(&buf[i..line_end]).ok()?;
        let size = usize::from_str_radix(size_txt.split(';').next()?.trim(), 16).ok()?;
        i = line_end + 2;
        if size == 0 {
            // trailers until an empty line
            loop {
                let e = buf[i..].windows(2).position(|w| w == b"\r\n")? + i;
                if e == i {
                    return Some(e + 2);
                }
                i = e + 2;
            }
        }
        if buf.len() < i + size + 2 {
            return None;
        }
        i += size + 2;
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut sock: S, name: String) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut tmp = [0u8; 8192];
    loop {
        // read one request (head + body)
        let (head_end, body_end) = loop {
            if let Some(h) = find_head_end(&buf) {
                let head = String::from_utf8_lossy(&buf[..h]).to_ascii_lowercase();
                let cl = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                let chunked = head
                    .lines()
                    .any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked"));
                let end = if chunked {
                    chunked_end(&buf, h)
                } else {
                    let n = cl.unwrap_or(0);
                    (buf.len() >= h + n).then_some(h + n)
                };
                if let Some(e) = end {
                    break (h, e);
                }
            }
            match sock.read(&mut tmp).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default();
        let mut parts = request_line.split(' ');
        let method = parts.next().unwrap_or_default();
        let path = parts.next().unwrap_or_default();
        let mut headers = Vec::new();
        let mut close = false;
        for l in lines.filter(|l| !l.is_empty()) {
            if let Some((k, v)) = l.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
                if k == "connection" && v.eq_ignore_ascii_case("close") {
                    close = true;
                }
                headers.push((k, v));
            }
        }
        if let Some(ms) = path
            .split_once("/delay/")
            .and_then(|(_, m)| m.split('/').next())
            .and_then(|m| m.parse::<u64>().ok())
        {
            tokio::time::sleep(std::time::Duration::from_millis(ms.min(60_000))).await;
        }
        if path != "/healthz" && path != "/hits" {
            HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // `/bytes/N`: N bytes written a chunk at a time as the socket takes them (answers held
        // whole would make the upstream, not the gateway, the machine's work under many of them)
        let streamed = path
            .split_once("/bytes/")
            .and_then(|(_, n)| n.split('/').next())
            .and_then(|n| n.parse::<usize>().ok())
            .map(|n| n.min(64 << 20));
        let (status, body) = if path == "/healthz" {
            (200u16, "ok\n".to_string())
        } else if path == "/hits" {
            let n = HITS.load(std::sync::atomic::Ordering::Relaxed);
            (
                200,
                format!("{{\"server\":{},\"hits\":{n}}}", json_str(&name)),
            )
        } else if streamed.is_some() {
            (200, String::new())
        } else if let Some(code) = path
            .strip_prefix("/status/")
            .or_else(|| {
                headers
                    .iter()
                    .find(|(k, _)| k == "x-answer-status")
                    .map(|(_, v)| v.as_str())
            })
            .and_then(|c| c.parse::<u16>().ok())
            .filter(|c| (200..=599).contains(c))
        {
            (
                code,
                format!("{{\"server\":{},\"status\":{code}}}", json_str(&name)),
            )
        } else {
            let hs: Vec<String> = headers
                .iter()
                .map(|(k, v)| format!("[{},{}]", json_str(k), json_str(v)))
                .collect();
            (
                200,
                format!(
                    "{{\"server\":{},\"method\":{},\"path\":{},\"headers\":[{}]}}",
                    json_str(&name),
                    json_str(method),
                    json_str(path),
                    hs.join(",")
                ),
            )
        };
        let reason = match status {
            200 => "OK",
            404 => "Not Found",
            500 => "Internal Server Error",
            503 => "Service Unavailable",
            _ => "Status",
        };
        // `/usage/N` anywhere in the path: the answer says it cost N (`x-usage-tokens`)
        let usage = path
            .split_once("/usage/")
            .and_then(|(_, n)| n.split('/').next())
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .map_or(String::new(), |n| format!("x-usage-tokens: {n}\r\n"));
        let resp = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{usage}{}\r\n{body}",
            streamed.unwrap_or(body.len()),
            if close { "connection: close\r\n" } else { "" }
        );
        if sock.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        let mut left = streamed.unwrap_or(0);
        while left > 0 {
            let n = left.min(CHUNK.len());
            if sock.write_all(&CHUNK[..n]).await.is_err() {
                return;
            }
            left -= n;
        }
        if close {
            return;
        }
        buf.drain(..body_end);
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:9001".to_string());
    let listener = match TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("upstream: cannot bind {addr}: {e}");
            std::process::exit(1);
        }
    };
    let local = listener
        .local_addr()
        .map_or(addr.clone(), |a| a.to_string());
    let name = args.next().unwrap_or_else(|| local.clone());
    let tls = std::env::var("UPSTREAM_TLS").ok().map(|v| {
        let (cert, key) = v.split_once(':').expect("UPSTREAM_TLS=CERT:KEY");
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).expect("tls");
        b.set_certificate_chain_file(cert).expect("certificate");
        b.set_private_key_file(key, SslFiletype::PEM).expect("key");
        b.build()
    });
    println!("listening on {local}");
    let _ = std::io::stdout().flush();
    loop {
        if let Ok((sock, _)) = listener.accept().await {
            let _ = sock.set_nodelay(true);
            match &tls {
                None => {
                    tokio::spawn(serve(sock, name.clone()));
                }
                Some(acceptor) => {
                    let Ok(ssl) = Ssl::new(acceptor.context()) else {
                        continue;
                    };
                    let name = name.clone();
                    tokio::spawn(async move {
                        let Ok(mut stream) = SslStream::new(ssl, sock) else {
                            return;
                        };
                        if Pin::new(&mut stream).accept().await.is_ok() {
                            serve(stream, name).await;
                        }
                    });
                }
            }
        }
    }
}
