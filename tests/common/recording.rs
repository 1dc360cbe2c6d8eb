//! An HTTP/1.1 upstream that records the bytes it receives and parses them as strictly as
//! h11 or uvicorn do: every request it reads whole (head, then a Content-Length or chunked
//! body) is kept byte for byte and answered `200` with its request line as the body; anything
//! that is not a request where one must start is answered `400` and the connection closed, as
//! a strict server would. What reached the upstream can then be asserted exactly.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A whole request, as its bytes arrived.
    Request(Vec<u8>),
    /// Bytes where a request had to start but none did (answered 400, connection closed).
    Garbage(Vec<u8>),
}

#[derive(Default)]
pub struct Record {
    pub seen: Vec<Seen>,
    /// When each whole request was read, with its request line.
    pub arrivals: Vec<(std::time::Instant, String)>,
}

pub struct RecordingUpstream {
    pub addr: SocketAddr,
    record: Arc<Mutex<Record>>,
}

impl RecordingUpstream {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let record = Arc::new(Mutex::new(Record::default()));
        let r = record.clone();
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                let r = r.clone();
                std::thread::spawn(move || serve(s, &r));
            }
        });
        RecordingUpstream { addr, record }
    }

    /// Every whole request received, in order of arrival.
    pub fn requests(&self) -> Vec<Vec<u8>> {
        self.seen(true)
    }

    /// Bytes that were not a request where one had to start.
    pub fn garbage(&self) -> Vec<Vec<u8>> {
        self.seen(false)
    }

    fn seen(&self, requests: bool) -> Vec<Vec<u8>> {
        let rec = self.record.lock().unwrap();
        rec.seen
            .iter()
            .filter_map(|s| match (s, requests) {
                (Seen::Request(b), true) | (Seen::Garbage(b), false) => Some(b.clone()),
                _ => None,
            })
            .collect()
    }

    /// When each whole request was read, with its request line, in order of arrival.
    #[allow(dead_code)]
    pub fn arrivals(&self) -> Vec<(std::time::Instant, String)> {
        self.record.lock().unwrap().arrivals.clone()
    }

    /// The request lines (`GET /a HTTP/1.1`) of every whole request received.
    pub fn request_lines(&self) -> Vec<String> {
        self.requests().iter().map(|r| request_line(r)).collect()
    }
}

pub fn request_line(raw: &[u8]) -> String {
    let end = raw
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// The body bytes of a recorded request, as on the wire (chunked framing included).
pub fn body_on_wire(raw: &[u8]) -> &[u8] {
    match raw.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => &raw[i + 4..],
        None => &[],
    }
}

fn is_request_line(line: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(line) else {
        return false;
    };
    let mut parts = text.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    !method.is_empty()
        && method.bytes().all(|b| b.is_ascii_uppercase())
        && !target.is_empty()
        && (version == "HTTP/1.1" || version == "HTTP/1.0")
}

enum Parse {
    Need,
    Bad,
    Whole(usize),
}

/// The end of a strictly framed chunked body starting at `i`.
fn chunked_end(buf: &[u8], mut i: usize) -> Parse {
    loop {
        let Some(nl) = buf[i..].windows(2).position(|w| w == b"\r\n") else {
            return Parse::Need;
        };
        let line = &buf[i..i + nl];
        let size_part = line.split(|&b| b == b';').next().unwrap_or(&[]);
        let Some(size) = std::str::from_utf8(size_part)
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|s| usize::from_str_radix(s, 16).ok())
        else {
            return Parse::Bad;
        };
        i += nl + 2;
        if size == 0 {
            // trailers, then an empty line
            loop {
                let Some(e) = buf[i..].windows(2).position(|w| w == b"\r\n") else {
                    return Parse::Need;
                };
                i += e + 2;
                if e == 0 {
                    return Parse::Whole(i);
                }
            }
        }
        if buf.len() < i + size + 2 {
            return Parse::Need;
        }
        if &buf[i + size..i + size + 2] != b"\r\n" {
            return Parse::Bad;
        }
        i += size + 2;
    }
}

fn parse(buf: &[u8]) -> Parse {
    // A request line must start at once (RFC 9112 lets a server skip one leading CRLF; a
    // strict one does not need to, and every byte here is a sign of a framing bug).
    if let Some(nl) = buf.windows(2).position(|w| w == b"\r\n") {
        if !is_request_line(&buf[..nl]) {
            return Parse::Bad;
        }
    } else if buf.len() > 8192 || buf.contains(&b'\n') {
        return Parse::Bad;
    } else {
        return Parse::Need;
    }
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4) else {
        return Parse::Need;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let mut lengths = head
        .lines()
        .filter_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse::<usize>());
    let chunked = head
        .lines()
        .any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked"));
    let length = match (lengths.next(), lengths.next()) {
        (Some(Ok(n)), None) => Some(n),
        (None, None) => None,
        _ => return Parse::Bad,
    };
    match (chunked, length) {
        (true, Some(_)) => Parse::Bad,
        (true, None) => chunked_end(buf, head_end),
        (false, n) => {
            let end = head_end + n.unwrap_or(0);
            if buf.len() >= end {
                Parse::Whole(end)
            } else {
                Parse::Need
            }
        }
    }
}

fn serve(mut s: TcpStream, record: &Mutex<Record>) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 65536];
    loop {
        match parse(&buf) {
            Parse::Whole(end) => {
                let raw: Vec<u8> = buf.drain(..end).collect();
                let line = request_line(&raw);
                let mut rec = record.lock().unwrap();
                rec.arrivals
                    .push((std::time::Instant::now(), request_line(&raw)));
                rec.seen.push(Seen::Request(raw));
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{line}",
                    line.len()
                );
                if s.write_all(answer.as_bytes()).is_err() {
                    return;
                }
            }
            Parse::Bad => {
                record
                    .lock()
                    .unwrap()
                    .seen
                    .push(Seen::Garbage(std::mem::take(&mut buf)));
                let _ = s.write_all(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 19\r\nconnection: close\r\n\r\nnot a request here\n",
                );
                return;
            }
            Parse::Need => match s.read(&mut tmp) {
                Ok(0) | Err(_) => {
                    if !buf.is_empty() {
                        record.lock().unwrap().seen.push(Seen::Garbage(buf));
                    }
                    return;
                }
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            },
        }
    }
}
