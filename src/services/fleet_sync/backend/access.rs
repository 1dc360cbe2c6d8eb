//! Whether the ACL user may run every command the gateway sends (`tollgate -t`, and once a
//! backend first reaches Redis). A small script, loaded and called by hash as the ledger's is,
//! asks Redis with `redis.acl_check_cmd` (Redis 7.0 on) for each command of a round, on a key
//! under the key prefix: it needs no right beyond `+script|load` and `+evalsha`, which the
//! gateway needs anyway, and writes nothing. (`ACL DRYRUN` would answer the same, but needs
//! `+acl|dryrun`, which the gateway's user should not have.)

use super::ReplyError;
use crate::config::model::{Algorithm, RedisEndpoint, RedisSettings};
use std::time::Duration;

/// Which rules need a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Every rule that syncs (a round's script, its plain increments, the heartbeat).
    Every,
    /// The rules of these algorithms only (the script calls it for them).
    Only(&'static [Algorithm]),
    /// A Redis Cluster (the client reads the slot map, and pings the nodes).
    Cluster,
    /// A primary found through Redis Sentinel (the client asks it its `ROLE`).
    Sentinel,
    /// One endpoint with plain increments: their rounds' transactions and marks
    /// (`backend::journal`).
    Marks,
    /// The marks' read, which the heartbeat also sends to hear of the others' waits
    /// (`Heartbeat::waiting_key`): needed as `Marks` is; elsewhere, without it, a holder
    /// does not hear of them (a warning).
    MarksAndWaits,
    /// The waits channel (`backend::subscribe`): without it, holders hear of the others'
    /// waits at their heartbeats only (a warning, whatever the config).
    Waits,
}

/// A command the gateway sends, as Redis's ACL names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// As an operator reads it: `HINCRBY`, `SCRIPT LOAD`.
    pub name: &'static str,
    /// As `ACL SETUSER` takes it: `hincrby`, `script|load`.
    pub acl: &'static str,
    /// The check's arguments (`{k}`: a key under the prefix).
    args: &'static str,
    pub need: Need,
}

const fn cmd(name: &'static str, acl: &'static str, args: &'static str, need: Need) -> Command {
    Command {
        name,
        acl,
        args,
        need,
    }
}

/// Every command a round sends, its script calls, or the heartbeat sends
/// (`script::sources`, `backend::count_cmd`, `backend::add_heartbeat`), in the order
/// docs/operations.md lists them.
pub const COMMANDS: [Command; 21] = [
    cmd(
        "EVALSHA",
        "evalsha",
        "evalsha 0000000000000000000000000000000000000000 1 {k}",
        Need::Every,
    ),
    cmd(
        "SCRIPT LOAD",
        "script|load",
        "script load return",
        Need::Every,
    ),
    cmd("INCRBY", "incrby", "incrby {k} 1", Need::Every),
    cmd("PEXPIREAT", "pexpireat", "pexpireat {k} 1", Need::Every),
    cmd("GET", "get", "get {k}", Need::Every),
    cmd(
        "SET",
        "set",
        "set {k} 1",
        Need::Only(&[Algorithm::TokenBucket, Algorithm::LeakyBucket]),
    ),
    cmd("HGETALL", "hgetall", "hgetall {k}", Need::Every),
    cmd("HSET", "hset", "hset {k} f 1", Need::Every),
    cmd(
        "HINCRBY",
        "hincrby",
        "hincrby {k} f 1",
        Need::Only(&[Algorithm::SlidingLog]),
    ),
    cmd("PEXPIRE", "pexpire", "pexpire {k} 1", Need::Every),
    cmd("ZADD", "zadd", "zadd {k} 1 m", Need::Every),
    cmd("ZCARD", "zcard", "zcard {k}", Need::Every),
    cmd(
        "ZREMRANGEBYSCORE",
        "zremrangebyscore",
        "zremrangebyscore {k} -inf 1",
        Need::Every,
    ),
    cmd("MULTI", "multi", "multi", Need::Marks),
    cmd("EXEC", "exec", "exec", Need::Marks),
    cmd(
        "ZRANGEBYSCORE",
        "zrangebyscore",
        "zrangebyscore {k} -inf +inf",
        Need::MarksAndWaits,
    ),
    cmd("PUBLISH", "publish", "publish {k} m", Need::Waits),
    cmd("SUBSCRIBE", "subscribe", "subscribe {k}", Need::Waits),
    cmd("PING", "ping", "ping", Need::Cluster),
    cmd(
        "CLUSTER SLOTS",
        "cluster|slots",
        "cluster slots",
        Need::Cluster,
    ),
    cmd("ROLE", "role", "role", Need::Sentinel),
];

/// Answers the indexes (1-based) of the checks the caller may not run. Each `ARGV` is one
/// command with its arguments, separated by spaces.
pub const ACCESS_SCRIPT: &str = r#"
local out = {}
for i = 1, #ARGV do
  local args = {}
  for w in string.gmatch(ARGV[i], '%S+') do args[#args + 1] = w end
  if not redis.acl_check_cmd(unpack(args)) then out[#out + 1] = i end
end
return out
"#;

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// The user may run every command the gateway sends.
    Allowed,
    /// Redis refuses these commands to the user. `rest_unchecked`: the check itself was
    /// refused (no `+script|load` or `+evalsha`), so the others are not known.
    Missing {
        commands: Vec<Command>,
        rest_unchecked: bool,
    },
    /// Not checked: Redis did not answer (`reachable: false`), refused the login, or cannot
    /// tell (older than 7.0).
    Unchecked { reason: String, reachable: bool },
}

/// The user the gateway logs in as (`default` when none is named).
pub fn user(settings: &RedisSettings) -> String {
    if let Some(u) = &settings.access.username {
        return u.clone();
    }
    let url = match &settings.endpoint {
        RedisEndpoint::Single(u) => Some(u),
        RedisEndpoint::Cluster(seeds) => seeds.first(),
        // a sentinel's URL names the sentinel's user, not the primary's
        RedisEndpoint::Sentinel { .. } => None,
    };
    url.and_then(|u| redis::Client::open(u.as_str()).ok())
        .and_then(|c| {
            c.get_connection_info()
                .redis_settings()
                .username()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "default".to_string())
}

/// Whether the rules of `algorithms` (those the config has) and `endpoint` need `c`.
pub fn needed(c: &Command, algorithms: &[Algorithm], endpoint: &RedisEndpoint) -> bool {
    match c.need {
        Need::Every | Need::Waits => true,
        Need::Only(these) => algorithms.iter().any(|a| these.contains(a)),
        Need::Cluster => matches!(endpoint, RedisEndpoint::Cluster(_)),
        Need::Sentinel => matches!(endpoint, RedisEndpoint::Sentinel { .. }),
        Need::Marks | Need::MarksAndWaits => matches!(endpoint, RedisEndpoint::Single(_)),
    }
}

/// What an operator does about a missing command: `redis: user "gateway" may not run HINCRBY
/// (NOPERM): add +hincrby to its ACL (sliding_log rules need it)`.
pub fn advice(user: &str, c: &Command) -> String {
    let who = match c.need {
        Need::Every => "every rule needs it".to_string(),
        Need::Cluster => "a Redis Cluster needs it".to_string(),
        Need::Sentinel => "a primary found through Sentinel needs it".to_string(),
        Need::Marks => "plain increments behind one endpoint need it".to_string(),
        Need::MarksAndWaits => "plain increments behind one endpoint need it, and an instance holding a part of a window hears with it that others wait on it".to_string(),
        Need::Waits => "with it, and the channel <key prefix>:waits (&<key prefix>:*), an instance holding a part of a window hears within a round trip that others wait on it, not at its heartbeat".to_string(),
        Need::Only(algs) => {
            let names: Vec<String> = algs.iter().map(|a| algorithm_name(*a)).collect();
            format!("{} rules need it", names.join(" and "))
        }
    };
    format!(
        "redis: user {user:?} may not run {} (NOPERM): add +{} to its ACL ({who})",
        c.name, c.acl
    )
}

fn algorithm_name(a: Algorithm) -> String {
    crate::config::summary::algorithm_text(a).to_string()
}

/// Ask Redis (the server, or the first cluster seed that answers) whether the user may run
/// every command of `COMMANDS`, within `timeout` per step.
pub async fn check(settings: &RedisSettings, timeout: Duration) -> Access {
    let clients: Vec<Result<redis::Client, String>> = match &settings.endpoint {
        RedisEndpoint::Sentinel { master, nodes } => {
            vec![primary(master, nodes, settings, timeout).await]
        }
        e => e
            .urls()
            .into_iter()
            .map(|url| crate::config::redis_client::client(url, &settings.access))
            .collect(),
    };
    let mut last = Access::Unchecked {
        reason: "no Redis URL".into(),
        reachable: false,
    };
    for client in clients {
        let client = match client {
            Ok(c) => c,
            Err(reason) => {
                return Access::Unchecked {
                    reason,
                    reachable: false,
                }
            }
        };
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let connect = client.get_multiplexed_async_connection_with_config(&config);
        let mut conn = match tokio::time::timeout(timeout * 2, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                // a refused login is Redis answering: the user cannot run anything
                let reachable = ReplyError::of_redis(&e).is_some();
                last = Access::Unchecked {
                    reason: e.to_string(),
                    reachable,
                };
                if reachable {
                    return last;
                }
                continue;
            }
            Err(_) => {
                last = Access::Unchecked {
                    reason: format!("no answer within {:?}", timeout * 2),
                    reachable: false,
                };
                continue;
            }
        };
        return match tokio::time::timeout(timeout * 2, ask(&mut conn, &settings.key_prefix)).await {
            Ok(a) => a,
            Err(_) => Access::Unchecked {
                reason: format!("no answer within {:?}", timeout * 2),
                reachable: false,
            },
        };
    }
    last
}

/// The client of the primary the sentinels name now.
async fn primary(
    master: &str,
    nodes: &[String],
    settings: &RedisSettings,
    timeout: Duration,
) -> Result<redis::Client, String> {
    let mut sentinels =
        crate::config::redis_client::sentinel_client(master, nodes, &settings.access)?;
    match tokio::time::timeout(timeout * 2, sentinels.async_get_client()).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("no primary from the sentinels: {e}")),
        Err(_) => Err(format!(
            "no primary from the sentinels within {:?}",
            timeout * 2
        )),
    }
}

/// The check on one connection.
async fn ask(conn: &mut impl redis::aio::ConnectionLike, prefix: &str) -> Access {
    let refused = |c: usize, e: redis::RedisError| match ReplyError::of_redis(&e) {
        Some(r) if r.kind == super::ErrorKind::NoPerm => Access::Missing {
            commands: COMMANDS.get(c).copied().into_iter().collect(),
            rest_unchecked: true,
        },
        Some(r) => Access::Unchecked {
            reason: r.message,
            reachable: true,
        },
        None => Access::Unchecked {
            reason: e.to_string(),
            reachable: false,
        },
    };
    let script = redis::Script::new(ACCESS_SCRIPT);
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(ACCESS_SCRIPT);
    if let Err(e) = load.query_async::<redis::Value>(conn).await {
        return refused(1, e);
    }
    let key = format!("{prefix}:{{tollgate-access-check}}:k");
    let mut call = redis::cmd("EVALSHA");
    call.arg(script.get_hash()).arg(0);
    for c in &COMMANDS {
        call.arg(c.args.replace("{k}", &key));
    }
    match call.query_async::<Vec<i64>>(conn).await {
        Ok(idx) => {
            let commands: Vec<Command> = idx
                .iter()
                .filter_map(|&i| usize::try_from(i - 1).ok())
                .filter_map(|i| COMMANDS.get(i).copied())
                .collect();
            if commands.is_empty() {
                Access::Allowed
            } else {
                Access::Missing {
                    commands,
                    rest_unchecked: false,
                }
            }
        }
        Err(e) if e.to_string().contains("acl_check_cmd") => Access::Unchecked {
            reason: "Redis older than 7.0 cannot tell (no redis.acl_check_cmd)".into(),
            reachable: true,
        },
        Err(e) => refused(0, e),
    }
}

/// The lines `-t` and start-up say: what is missing and what to add. A command the config's
/// rules (`algorithms`) or endpoint need is an error; one only other algorithms need is a
/// warning (a reload that adds such a rule would need it); a cluster's commands are not
/// mentioned for one server.
pub fn report(settings: &RedisSettings, algorithms: &[Algorithm], access: &Access) -> Report {
    let user = user(settings);
    let mut r = Report::default();
    match access {
        Access::Allowed => r.info.push(format!(
            "redis: user {user:?} may run every command the gateway sends"
        )),
        Access::Missing {
            commands,
            rest_unchecked,
        } => {
            for c in commands {
                let error = match c.need {
                    Need::Marks | Need::MarksAndWaits => settings.plain_increments,
                    Need::Waits => false,
                    _ => true,
                };
                if needed(c, algorithms, &settings.endpoint) && error {
                    r.errors.push(advice(&user, c));
                } else if matches!(c.need, Need::Only(_) | Need::MarksAndWaits | Need::Waits) {
                    // a reload that adds such a rule would need it
                    r.warnings.push(advice(&user, c));
                }
            }
            if *rest_unchecked {
                r.warnings
                    .push("redis: the other commands could not be checked without it".into());
            }
            if r.errors.is_empty() && r.warnings.is_empty() {
                // only a cluster's commands, and this is one server
                r.info.push(format!(
                    "redis: user {user:?} may run every command the gateway sends"
                ));
            }
        }
        Access::Unchecked { reason, .. } => r.warnings.push(format!(
            "redis: the ACL of user {user:?} was not checked ({reason})"
        )),
    }
    r
}

/// What `report` found, by level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Commands the config needs and Redis refuses.
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub info: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_a_round_sends_is_checked() {
        // the scripts' calls (the rounds', an operator's reset or grant, the usage archive's) and the round's
        // own commands, as sent
        let mut script = super::super::script::sources().concat().to_lowercase();
        script.push_str(
            &crate::services::fleet_sync::adjust::sources()
                .concat()
                .to_lowercase(),
        );
        // (and the usage archive's)
        script.push_str(&crate::services::fleet_sync::archive::source().to_lowercase());
        let mut called: Vec<String> = script
            .split("redis.call('")
            .skip(1)
            .filter_map(|s| s.split('\'').next())
            .map(str::to_string)
            .collect();
        called.extend(["evalsha", "script|load", "incrby", "pexpireat"].map(String::from));
        called
            .extend(["zadd", "zremrangebyscore", "pexpire", "hgetall", "zcard"].map(String::from));
        // (and the marks of plain increments, `journal`, whose read the heartbeat also sends)
        called.extend(["multi", "exec", "zrangebyscore"].map(String::from));
        // (and the waits channel's)
        called.extend(["publish", "subscribe"].map(String::from));
        for c in called {
            assert!(COMMANDS.iter().any(|k| k.acl == c), "{c} is not checked");
        }
    }

    #[test]
    fn advice_names_the_command_and_what_to_add() {
        let c = COMMANDS.iter().find(|c| c.acl == "hincrby").copied();
        let Some(c) = c else {
            panic!("hincrby is checked")
        };
        assert_eq!(
            advice("gateway", &c),
            "redis: user \"gateway\" may not run HINCRBY (NOPERM): add +hincrby to its ACL (sliding_log rules need it)"
        );
        let one = RedisEndpoint::Single("redis://127.0.0.1:6379".into());
        assert!(needed(&c, &[Algorithm::SlidingLog], &one));
        assert!(!needed(&c, &[Algorithm::FixedWindow], &one));
        // the primary's ROLE, which the Sentinel client asks, for Sentinel alone
        let role = COMMANDS.iter().find(|c| c.acl == "role").copied();
        let Some(role) = role else {
            panic!("role is checked")
        };
        let sentinel = RedisEndpoint::Sentinel {
            master: "m".into(),
            nodes: vec!["redis://127.0.0.1:26379".into()],
        };
        assert!(needed(&role, &[], &sentinel));
        assert!(!needed(&role, &[], &one));
        assert!(!needed(&role, &[], &RedisEndpoint::Cluster(vec![])));
    }
}
