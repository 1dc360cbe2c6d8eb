//! The client address from X-Forwarded-For values through trusted proxies.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: (Vec<Vec<u8>>, [u8; 4])| {
    let (values, peer) = data;
    let trusted = ["10.0.0.0/8".parse().unwrap(), "127.0.0.1/32".parse().unwrap()];
    let _ = tollgate::request::client_addr::client_ip(
        std::net::IpAddr::from(peer),
        values.iter().map(|v| v.as_slice()),
        &trusted,
    );
});
