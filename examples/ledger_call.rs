//! The windows ledger script and one call of it, for `scripts/bench-script-cost`: `source`
//! prints the script; `call MEMBER USED` prints the call's script hash on the first line, then
//! each argument after it (keys included) in hex, one a line: a fixed window of 200 per 10 s on
//! 3 instances, as in the seed scenario, the member asking for its steady part.

use tollgate::services::fleet_sync::backend::script::{ledger_cmd, sources};
use tollgate::services::fleet_sync::backend::{LedgerUpdate, LogReport};

fn update(member: &str, used: u64) -> LedgerUpdate {
    let key = "seed:{t1}:fixed_window:0:10000".to_string();
    LedgerUpdate {
        ledger_key: format!("{key}:fleet"),
        prev_ledger_key: format!("{key}:fleet"),
        prev_key: key.clone(),
        key,
        member: member.into(),
        used,
        want: used + 60,
        cap: 200,
        now_ms: 2_000,
        lease_until_ms: 10_000,
        expire_at_ms: 9_999_999_999_999,
        weight_ms: 0,
        period_ms: 10_000,
        bucket_ns: 0,
        tolerance_us: 0,
        log: LogReport::default(),
        adopt: 0,
        need: 0,
        spare: 20,
        confirmed: 0,
        direct_cap: 0,
        instances: 3,
        direct_each: 0,
        rest: 60,
        since_ms: 0,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["source"] => print!("{}", sources()[0]),
        ["call", member, used] => {
            let used = used.parse().unwrap_or(0);
            let cmd = ledger_cmd(&update(member, used));
            // EVALSHA, the hash, then the number of keys, the keys and the arguments
            for (i, arg) in cmd.args_iter().enumerate() {
                let redis::Arg::Simple(bytes) = arg else {
                    continue;
                };
                match i {
                    0 => {}
                    1 => println!("{}", String::from_utf8_lossy(bytes)),
                    _ => println!("{}", hex(bytes)),
                }
            }
        }
        _ => {
            eprintln!("usage: ledger_call source | call MEMBER USED");
            std::process::exit(2);
        }
    }
}
