//! The bare Pingora baseline for `scripts/bench-cost`: a `ProxyHttp` that only picks one fixed
//! upstream (plain HTTP), with no filters, no logging and no rate limiting, built with the same
//! pingora features and release profile as the gateway.
//!
//! `passthrough LISTEN_ADDR UPSTREAM_ADDR [THREADS]` (UPSTREAM_ADDR an IP:port, threads default 1).
//! SIGINT exits at once.

use async_trait::async_trait;
use pingora::prelude::{HttpPeer, Opt, ProxyHttp, Result, Server, Session};
use pingora::server::configuration::ServerConf;
use std::net::SocketAddr;

struct Passthrough {
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Passthrough {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 || args.len() > 3 {
        eprintln!("usage: passthrough LISTEN_ADDR UPSTREAM_ADDR [THREADS]");
        std::process::exit(2);
    }
    let upstream: SocketAddr = match args[1].parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("passthrough: UPSTREAM_ADDR {:?}: {e}", args[1]);
            std::process::exit(2);
        }
    };
    let threads = match args.get(2).map(|t| t.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("passthrough: THREADS must be a positive integer");
            std::process::exit(2);
        }
    };
    // As src/cli.rs: worker threads from the command line, no daemon, work stealing on.
    let mut conf = ServerConf {
        threads,
        daemon: false,
        ..ServerConf::default()
    };
    conf.work_stealing = true;
    let opt = Opt {
        upgrade: false,
        daemon: false,
        nocapture: false,
        test: false,
        conf: None,
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Passthrough { upstream },
        "passthrough",
    );
    proxy.add_tcp(&args[0]);
    server.add_service(proxy);
    server.run_forever();
}
