//! A bound on the log lines anyone outside can cause: warnings and errors of one source (a
//! module's log target) that clients can reach, the libraries' and the request path's
//! ([`client_reachable`]), are written at most [`PER_SECOND`] a second; the rest of that
//! second's are counted, and the first line of a later second says how many were left out. A
//! client that makes a dependency log an error per connection or per stream (a failed TLS
//! handshake, a reset HTTP/2 stream) thus writes a few lines a second, not megabytes. Lines
//! below warning (the access log among them), and what the operator's own acts cause (a reload,
//! the start, the Redis sync), pass untouched.

use log::{Level, Log, Metadata, Record};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Instant;

/// Warnings and errors written per source and second, at most.
pub const PER_SECOND: u32 = 3;

/// What one source wrote in its current second.
#[derive(Debug, Clone, Copy)]
struct Second {
    started: Instant,
    written: u32,
    left_out: u64,
}

/// The decision for one line: write it, after saying how many lines of its source were left
/// out before it (0: none), or leave it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Write { left_out: u64 },
    LeaveOut,
}

/// The seconds of each source, a pure function of the time it is given.
#[derive(Default)]
pub struct Budget {
    sources: HashMap<String, Second>,
}

impl Budget {
    pub fn judge(&mut self, source: &str, now: Instant) -> Verdict {
        if !self.sources.contains_key(source) {
            self.sources.insert(
                source.to_string(),
                Second {
                    started: now,
                    written: 0,
                    left_out: 0,
                },
            );
        }
        let Some(s) = self.sources.get_mut(source) else {
            return Verdict::Write { left_out: 0 };
        };
        let mut left_out = 0;
        if now.saturating_duration_since(s.started).as_secs() >= 1 {
            left_out = std::mem::take(&mut s.left_out);
            s.started = now;
            s.written = 0;
        }
        if s.written < PER_SECOND {
            s.written += 1;
            Verdict::Write { left_out }
        } else {
            s.left_out += 1;
            Verdict::LeaveOut
        }
    }
}

/// Whether clients can make `target` log: every library, and the gateway's request path.
pub fn client_reachable(target: &str) -> bool {
    !target.starts_with("tollgate") || target.starts_with("tollgate::request")
}

/// A logger that passes lines to `inner`, warnings and errors within their [`Budget`].
pub struct Limited<L> {
    pub inner: L,
    budget: Mutex<Budget>,
}

impl<L: Log> Limited<L> {
    pub fn new(inner: L) -> Self {
        Limited {
            inner,
            budget: Mutex::new(Budget::default()),
        }
    }
}

impl<L: Log> Log for Limited<L> {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if record.level() > Level::Warn
            || !client_reachable(record.target())
            || !self.inner.enabled(record.metadata())
        {
            self.inner.log(record);
            return;
        }
        let verdict = self.budget.lock().judge(record.target(), Instant::now());
        match verdict {
            Verdict::LeaveOut => {}
            Verdict::Write { left_out } => {
                if left_out > 0 {
                    self.inner.log(
                        &Record::builder()
                            .args(format_args!(
                                "{left_out} more warnings and errors of {} were left out in the last second (at most {PER_SECOND} a second are written)",
                                record.target()
                            ))
                            .level(Level::Warn)
                            .target(record.target())
                            .build(),
                    );
                }
                self.inner.log(record);
            }
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_source_writes_its_share_a_second_and_then_says_what_it_left_out() {
        let mut b = Budget::default();
        let t0 = Instant::now();
        for _ in 0..PER_SECOND {
            assert_eq!(b.judge("pingora", t0), Verdict::Write { left_out: 0 });
        }
        for _ in 0..500 {
            assert_eq!(
                b.judge("pingora", t0 + Duration::from_millis(900)),
                Verdict::LeaveOut
            );
        }
        // another source has its own share
        assert_eq!(b.judge("tollgate", t0), Verdict::Write { left_out: 0 });
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.judge("pingora", t1), Verdict::Write { left_out: 500 });
        assert_eq!(b.judge("pingora", t1), Verdict::Write { left_out: 0 });
    }

    #[test]
    fn only_what_clients_can_reach_is_bounded() {
        for t in [
            "pingora_core::services::listening",
            "h2::proto",
            "tollgate::request::edge",
        ] {
            assert!(client_reachable(t), "{t}");
        }
        for t in [
            "tollgate::services::reload",
            "tollgate::cli",
            "tollgate::services::fleet_sync",
        ] {
            assert!(!client_reachable(t), "{t}");
        }
    }
}
