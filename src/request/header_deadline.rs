//! The `server.client_header_timeout` deadline of an HTTP/1 session, for a few hundred
//! instructions per request (issue 9: a tokio timer armed and dropped per request, with a
//! task-local flag, cost about 2,500).
//!
//! [`HeaderDeadline`] wraps the proxy's session future. The first time that future waits before
//! the proxy's first phase has run (the request header is not complete yet), it takes a slot in
//! one process-wide table with the deadline and the task's waker; once the header is read, or the
//! session ends, the slot is given back. A thread started on first use looks at the table every
//! [`RESOLUTION`] and wakes the sessions whose deadline passed; a woken session whose header is
//! still incomplete ends without an answer, which closes the connection (as nginx does). A
//! connection is therefore closed between the deadline and one [`RESOLUTION`] after it.
//!
//! The proxy's first phase calls [`header_read`]; it learns which session it belongs to from a
//! thread-local flag that the wrapper sets before, and reads back after, each poll of the
//! session (a poll runs on one thread from start to end).

use parking_lot::Mutex;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often the table is looked at: a session is closed at most this long after its deadline.
pub const RESOLUTION: Duration = Duration::from_millis(100);

thread_local! {
    /// Whether the session being polled on this thread has read its request header.
    static HEADER_READ: Cell<bool> = const { Cell::new(false) };
}

/// Called by the proxy's first phase: the request header of the session being polled is complete.
pub fn header_read() {
    HEADER_READ.with(|h| h.set(true));
}

struct Watch {
    at: Instant,
    waker: Waker,
    woken: bool,
}

#[derive(Default)]
struct Table {
    slots: Vec<Option<Watch>>,
    free: Vec<usize>,
}

impl Table {
    fn take(&mut self, watch: Watch) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(watch);
                i
            }
            None => {
                self.slots.push(Some(watch));
                self.slots.len() - 1
            }
        }
    }

    fn give_back(&mut self, i: usize) {
        if let Some(slot) = self.slots.get_mut(i) {
            if slot.take().is_some() {
                self.free.push(i);
            }
        }
    }

    /// The wakers of the sessions whose deadline passed by `now`, each returned once.
    fn due(&mut self, now: Instant, out: &mut Vec<Waker>) {
        for w in self.slots.iter_mut().flatten() {
            if !w.woken && w.at <= now {
                w.woken = true;
                out.push(w.waker.clone());
            }
        }
    }
}

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("header deadlines".into())
            .spawn(|| {
                let mut due = Vec::new();
                loop {
                    std::thread::sleep(RESOLUTION);
                    table().lock().due(Instant::now(), &mut due);
                    for w in due.drain(..) {
                        w.wake();
                    }
                }
            });
        if let Err(e) = spawned {
            // sessions still end at pingora's own read and keep-alive timeouts
            log::error!("client_header_timeout is not enforced: no thread to watch it: {e}");
        }
        Mutex::new(Table::default())
    })
}

/// A session future that ends (with `None`) when its request header is not complete within
/// `timeout` of the first time it waits.
pub struct HeaderDeadline<F> {
    work: F,
    timeout: Duration,
    header_read: bool,
    /// The table slot and the deadline, while one is held.
    watch: Option<(usize, Instant)>,
}

impl<F> HeaderDeadline<F> {
    pub fn new(work: F, timeout: Duration) -> Self {
        HeaderDeadline {
            work,
            timeout,
            header_read: false,
            watch: None,
        }
    }

    fn release(&mut self) {
        if let Some((slot, _)) = self.watch.take() {
            table().lock().give_back(slot);
        }
    }
}

impl<F, T> Future for HeaderDeadline<F>
where
    F: Future<Output = Option<T>> + Unpin,
{
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        let before = HEADER_READ.with(|h| h.replace(this.header_read));
        let polled = Pin::new(&mut this.work).poll(cx);
        this.header_read = HEADER_READ.with(|h| h.replace(before));
        if let Poll::Ready(v) = polled {
            this.release();
            return Poll::Ready(v);
        }
        if this.header_read {
            this.release();
            return Poll::Pending;
        }
        match this.watch {
            None => {
                // a timeout too long for the clock is no deadline (never a panic on a config value)
                let Some(at) = Instant::now().checked_add(this.timeout) else {
                    return Poll::Pending;
                };
                let watch = Watch {
                    at,
                    waker: cx.waker().clone(),
                    woken: false,
                };
                this.watch = Some((table().lock().take(watch), at));
                Poll::Pending
            }
            Some((_, at)) if Instant::now() >= at => {
                log::debug!(
                    "client header not complete in {:?}: connection closed",
                    this.timeout
                );
                this.release();
                Poll::Ready(None)
            }
            Some((slot, _)) => {
                let mut t = table().lock();
                if let Some(Some(w)) = t.slots.get_mut(slot) {
                    if !w.waker.will_wake(cx.waker()) {
                        w.waker = cx.waker().clone();
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl<F> Drop for HeaderDeadline<F> {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A session that reads its header on the `read_at`-th poll (never if `None`) and ends on the
    /// `end_at`-th; it is woken by nothing but the deadline thread.
    struct Session {
        polls: Arc<AtomicUsize>,
        read_at: Option<usize>,
        end_at: usize,
    }

    impl Future for Session {
        type Output = Option<&'static str>;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let n = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
            if self.read_at == Some(n) {
                header_read();
            }
            if n >= self.end_at {
                return Poll::Ready(Some("served"));
            }
            if n == 1 {
                cx.waker().wake_by_ref(); // the header's bytes arrive
            }
            Poll::Pending
        }
    }

    fn run(
        read_at: Option<usize>,
        end_at: usize,
        timeout: Duration,
        give_up: Duration,
    ) -> (Option<&'static str>, Duration, usize) {
        let polls = Arc::new(AtomicUsize::new(0));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let t = Instant::now();
        let s = Session {
            polls: polls.clone(),
            read_at,
            end_at,
        };
        // the session is not polled when the give-up time comes (`biased`: that branch first)
        let out = rt.block_on(async {
            tokio::select! {
                biased;
                _ = tokio::time::sleep(give_up) => Some("never woken"),
                out = HeaderDeadline::new(s, timeout) => out,
            }
        });
        (out, t.elapsed(), polls.load(Ordering::SeqCst))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_incomplete_header_ends_the_session_at_its_deadline() {
        let (out, took, _) = run(None, usize::MAX, ms(300), Duration::from_secs(5));
        assert_eq!(out, None);
        assert!(took >= Duration::from_millis(300), "{took:?}");
        // one look of the deadline thread late at most, and a scheduling margin
        assert!(took < ms(300) + RESOLUTION + ms(150), "{took:?}");
    }

    #[test]
    fn a_header_read_in_time_lifts_the_deadline() {
        // read on the 2nd poll; nothing wakes the session after that (the deadline thread must
        // not), so the outer timeout answers, past the deadline
        let (out, took, polls) = run(Some(2), usize::MAX, ms(200), ms(700));
        assert_eq!(out, Some("never woken"), "after {took:?}");
        assert_eq!(
            polls, 2,
            "the deadline woke a session whose header was read"
        );
        let (out, _, _) = run(Some(1), 2, ms(200), Duration::from_secs(5));
        assert_eq!(out, Some("served"));
    }

    #[test]
    fn the_flag_of_one_session_is_not_seen_by_another() {
        HEADER_READ.with(|h| h.set(true));
        let (out, _, _) = run(None, usize::MAX, ms(100), Duration::from_secs(5));
        assert_eq!(out, None);
        assert!(HEADER_READ.with(Cell::get), "the caller's flag is restored");
    }

    #[test]
    fn a_timeout_beyond_the_clock_is_no_deadline() {
        let (out, _, _) = run(Some(2), usize::MAX, Duration::MAX, ms(300));
        assert_eq!(out, Some("never woken"));
        let (out, _, _) = run(None, usize::MAX, Duration::MAX, ms(300));
        assert_eq!(out, Some("never woken"));
    }

    #[test]
    fn slots_are_reused() {
        let mut t = Table::default();
        let w = || Watch {
            at: Instant::now(),
            waker: Waker::noop().clone(),
            woken: false,
        };
        let a = t.take(w());
        let b = t.take(w());
        t.give_back(a);
        t.give_back(a);
        assert_eq!(t.take(w()), a);
        assert_eq!(t.free.len(), 0);
        let mut due = Vec::new();
        t.due(Instant::now(), &mut due);
        assert_eq!(due.len(), 2);
        t.due(Instant::now(), &mut due);
        assert_eq!(due.len(), 2, "each deadline wakes once");
        t.give_back(b);
        assert_eq!(t.slots.iter().flatten().count(), 1);
    }
}
