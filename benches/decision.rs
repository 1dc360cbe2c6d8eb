//! The pieces of the request path that issue 9 measured: the rate-limit decision for a request
//! that matches 3 rules (one with 2 tiers) on the allow path over 25 tenants (with its heap
//! allocations counted), and for one rule of each of the five algorithms, the five quota headers added to an upstream's response, and the
//! choice of a server in a one-server pool and in a two-server round-robin pool; the path's
//! normal-form check; the client header deadline around a session (next to the tokio timer it
//! replaced).

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, Method};
use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tollgate::config;
use tollgate::limits::{CounterRegistry, LimitRequest, Limiter, SystemClock};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const CONFIG: &str = r#"
server: { listen: ["127.0.0.1:1"] }
upstreams: { app: { servers: ["127.0.0.1:2"] } }
routes: [{ id: all, path: /**, upstream: app }]
limits:
  - id: get-product
    methods: [GET]
    pathPattern: /v1/organizations/*/product/*
    tiers: [{ period: 1, threshold: 1000000000 }, { period: 1h, threshold: 1000000000000 }]
  - id: org-wide
    pathPattern: /v1/organizations/**
    tiers: [{ period: 10, threshold: 1000000000 }]
  - id: per-ip
    pathPattern: /**
    per: ip
    algorithm: sliding_window
    tiers: [{ period: 60, threshold: 1000000000000 }]
"#;

fn bench(c: &mut Criterion) {
    let cfg = config::load_str(Path::new("bench.yaml"), CONFIG).expect("valid config");
    let metrics = tollgate::metrics::Metrics::new().unwrap();
    let registry = CounterRegistry::new(metrics.evictions.clone(), metrics.untracked.clone());
    let limiter = Limiter::build(
        &cfg.rules,
        &cfg.plans,
        &registry,
        &metrics.decisions,
        100_000,
        Arc::new(SystemClock),
        Arc::new(tollgate::services::fleet_sync::Fleet::default()),
    );
    let tenants: Vec<Vec<u8>> = (0..25)
        .map(|i| format!("tenant-{i}").into_bytes())
        .collect();
    let headers = HeaderMap::new();
    let method = Method::GET;
    let path = "/v1/organizations/tenant-7/product/42";
    let client_ip = "10.1.2.3".parse().unwrap();
    // the path is split once per request (routing shares it): counted here
    let decide_on = |limiter: &Limiter, plans: &tollgate::config::model::Plans, i: usize| {
        let segments = tollgate::matching::Segments::new(path);
        let req = LimitRequest {
            method: &method,
            host: Some("api.example.com"),
            path: &segments,
            tenant: &tenants[i % tenants.len()],
            plan: None,
            client_ip,
            headers: &headers,
        };
        limiter.decide(&req, plans)
    };
    let decide = |i: usize| decide_on(&limiter, &cfg.plans, i);
    // warm: create the counters, then count allocations of steady-state decisions
    for i in 0..100 {
        assert_eq!(decide(i).tiers.len(), 4, "3 rules, 4 tiers apply");
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    for i in 0..10_000 {
        black_box(decide(i));
    }
    let per = (ALLOCS.load(Ordering::Relaxed) - before) as f64 / 10_000.0;
    println!("heap allocations per allowed decision (3 rules, 4 tiers): {per}");

    let mut i = 0usize;
    c.bench_function("decide_3_rules_4_tiers_allow", |b| {
        b.iter(|| {
            i += 1;
            black_box(decide(i))
        })
    });

    // each algorithm alone: one rule, one tier, on the allow path over the same 25 tenants
    // (the sliding log keeps about 2,600 instants a tenant: 10 ms of decisions)
    for (algo, tier) in [
        ("fixed_window", "{ period: 1, threshold: 1000000000 }"),
        ("sliding_window", "{ period: 1, threshold: 1000000000 }"),
        ("token_bucket", "{ period: 1, threshold: 1000000000 }"),
        ("leaky_bucket", "{ period: 1, threshold: 1000000000 }"),
        ("sliding_log", "{ period: 10ms, threshold: 10000 }"),
    ] {
        let text = format!(
            "server: {{ listen: [\"127.0.0.1:1\"] }}\nupstreams: {{ app: {{ servers: [\"127.0.0.1:2\"] }} }}\nroutes: [{{ id: all, path: /**, upstream: app }}]\nlimits:\n  - id: one\n    pathPattern: /**\n    algorithm: {algo}\n    tiers: [{tier}]\n"
        );
        let one = config::load_str(Path::new("bench.yaml"), &text).expect("valid config");
        let limiter = Limiter::build(
            &one.rules,
            &one.plans,
            &registry,
            &metrics.decisions,
            100_000,
            Arc::new(SystemClock),
            Arc::new(tollgate::services::fleet_sync::Fleet::default()),
        );
        let decide = |i: usize| decide_on(&limiter, &one.plans, i);
        for i in 0..100 {
            assert!(decide(i).verdict.admits(), "{algo}: allowed");
        }
        let mut i = 0usize;
        c.bench_function(&format!("decide_1_rule_{algo}_allow"), |b| {
            b.iter(|| {
                i += 1;
                black_box(decide(i))
            })
        });
    }

    // an upstream's answer as pingora parses it (header case kept), then the quota headers
    let decision = decide(1);
    let upstream_response = || {
        let mut r = pingora::http::ResponseHeader::build(200, Some(5)).unwrap();
        for (k, v) in [
            ("Server", "nginx"),
            ("Date", "Sun, 22 Nov 2026 08:00:00 GMT"),
            ("Content-Type", "text/plain"),
            ("Content-Length", "3"),
            ("Connection", "keep-alive"),
        ] {
            r.append_header(k, v).unwrap();
        }
        r
    };
    c.bench_function("quota_headers_5_on_upstream_response", |b| {
        b.iter_batched(
            upstream_response,
            |mut r| {
                tollgate::request::proxy::with_header_map(&mut r, |h| {
                    tollgate::limits::headers::apply(h, &limiter, &decision, cfg.headers, false)
                })
                .unwrap();
                r
            },
            criterion::BatchSize::SmallInput,
        )
    });

    let dns = std::sync::Arc::new(tollgate::upstream::dns::Resolving::new(cfg.dns.clone()));
    let one = tollgate::upstream::Pool::build(&cfg.upstreams[0], &dns).unwrap();
    let mut two_spec = cfg.upstreams[0].clone();
    two_spec.servers.push("127.0.0.1:3".parse().unwrap());
    let two = tollgate::upstream::Pool::build(&two_spec, &dns).unwrap();
    c.bench_function("select_server_pool_of_1", |b| {
        b.iter(|| black_box(one.select(b"tenant-1")))
    });
    c.bench_function("select_server_pool_of_2_round_robin", |b| {
        b.iter(|| black_box(two.select(b"tenant-1")))
    });

    c.bench_function("normalize_path_already_normal", |b| {
        b.iter(|| {
            black_box(tollgate::matching::normalize_path(black_box(
                "/v1/organizations/tenant-3/product/42",
            )))
        })
    });

    // a keep-alive session as the deadline sees it: it waits for the header (the deadline is
    // armed), the header is read on the next poll, and the session goes on to the upstream
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    c.bench_function("header_deadline_armed_and_lifted", |b| {
        b.iter(|| {
            let mut polls = 0;
            let session = std::future::poll_fn(|_| {
                polls += 1;
                if polls == 2 {
                    tollgate::request::header_deadline::header_read();
                }
                std::task::Poll::<Option<()>>::Pending
            });
            let mut d = std::pin::pin!(tollgate::request::header_deadline::HeaderDeadline::new(
                session,
                std::time::Duration::from_secs(10)
            ));
            black_box(d.as_mut().poll(&mut cx).is_pending());
            black_box(d.as_mut().poll(&mut cx).is_pending());
        })
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    c.bench_function("tokio_sleep_armed_and_dropped_for_comparison", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut sleep =
                    std::pin::pin!(tokio::time::sleep(std::time::Duration::from_secs(10)));
                black_box(futures_util::poll!(sleep.as_mut()).is_pending());
            })
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
