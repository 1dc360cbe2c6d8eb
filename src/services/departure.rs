//! SIGTERM's end. Pingora stops accepting, then sleeps the whole `grace_period` before it
//! exits, even with nothing left to serve. The [`Departure`] service ends the process sooner:
//! once the server terminates (SIGTERM; not SIGQUIT, whose listeners go to a new process), it
//! waits until no client connection is left on the data plane listeners (the requests in
//! flight answered, the kept-alive connections closed by the edge's drain), lets the Redis
//! sync make its last round ([`Leaving::served`], [`Leaving::reported`]), sends the queued
//! trace spans, and exits with status 0. Pingora's own end of the grace period still bounds it
//! all: whatever is not done by then is cut there, as before.

use crate::request::connections::Connections;
use crate::request::trace;
use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::server::{ExecutionPhase, ShutdownWatch};
use pingora::services::background::BackgroundService;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, watch};

/// How long no client connection must be open before the process leaves: a connection
/// accepted as the listeners stopped is counted a moment after its accept.
pub const QUIET: Duration = Duration::from_millis(100);

/// How often the connections are counted while the process waits to leave.
const POLL: Duration = Duration::from_millis(10);

/// Between the departure and the Redis sync: the last client connection is gone (the sync's
/// last round may start), and that round has ended.
pub struct Leaving {
    served: watch::Sender<bool>,
    reported: watch::Sender<bool>,
}

impl Default for Leaving {
    fn default() -> Self {
        Leaving {
            served: watch::channel(false).0,
            reported: watch::channel(false).0,
        }
    }
}

impl Leaving {
    /// Returns once a terminating process has no client connection left (never for one that
    /// hands its listeners over, or serves on).
    pub async fn served(&self) {
        let _ = self.served.subscribe().wait_for(|&s| s).await;
    }

    /// The sync's last round has ended (or there was none to make: no `redis`).
    pub fn reported(&self) {
        self.reported.send_replace(true);
    }

    async fn wait_reported(&self) {
        let _ = self.reported.subscribe().wait_for(|&r| r).await;
    }
}

/// The background service that ends a terminating process once nothing is in flight.
pub struct Departure {
    pub leaving: Arc<Leaving>,
    pub connections: Arc<Connections>,
    /// Pingora's phases (`Server::watch_execution_phase`), taken by `start`.
    pub phases: Mutex<Option<broadcast::Receiver<ExecutionPhase>>>,
}

/// Until Pingora says the server terminates (SIGTERM); false when it never will.
async fn terminating(phases: &mut broadcast::Receiver<ExecutionPhase>) -> bool {
    loop {
        match phases.recv().await {
            Ok(ExecutionPhase::GracefulTerminate) => return true,
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return false,
        }
    }
}

/// Until no client connection has been open for [`QUIET`].
async fn quiet(connections: &Connections) {
    let mut since: Option<tokio::time::Instant> = None;
    loop {
        if connections.held() > 0 {
            since = None;
        } else if since
            .get_or_insert_with(tokio::time::Instant::now)
            .elapsed()
            >= QUIET
        {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[async_trait]
impl BackgroundService for Departure {
    async fn start(&self, _shutdown: ShutdownWatch) {
        let Some(mut phases) = self.phases.lock().take() else {
            return;
        };
        if !terminating(&mut phases).await {
            return;
        }
        quiet(&self.connections).await;
        self.leaving.served.send_replace(true);
        self.leaving.wait_reported().await;
        if let Some(t) = trace::traces() {
            let _ = tokio::task::spawn_blocking(|| t.flush()).await;
        }
        log::info!("SIGTERM: no request left in flight, the last counts sent; exiting");
        log::logger().flush();
        std::process::exit(0);
    }
}
