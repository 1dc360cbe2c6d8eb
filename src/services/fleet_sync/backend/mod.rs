//! Where counts go: one pipelined round trip per round. Each window record is one atomic Lua
//! script, called by its hash (EVALSHA; loaded once per server, again after a NOSCRIPT answer)
//! (`script`, one per algorithm family: report the cumulative count, take a lease, set absolute expiry
//! times every instance computes alike, so no key is ever left without a TTL), or a plain
//! `INCRBY` far from the limit; periodic rounds end with the heartbeat that counts live
//! instances (four plain commands). Its Rust twin, for the simulation, is under the tests
//! (`tests/common/ledger_model.rs`); a test holds the two to the same answers on a real
//! redis-server.
//!
//! [`round`] holds what a round sends and gets back and the [`SyncBackend`] trait, [`script`]
//! the ledger scripts, [`pipeline`] the round's pipeline for one server, [`journal`] the marks
//! that keep plain increments from being lost or doubled behind one endpoint;
//! [`make`] picks the backend: [`single`] (one server), [`cluster`] (a Redis Cluster) or
//! [`sentinel`] (the primary Redis Sentinel names); [`subscribe`] listens on the waits channel.
//! The
//! children use one another, never this module (no cycle between files).

pub mod access;
pub mod cluster;
pub mod journal;
pub mod pipeline;
pub mod round;
pub mod scan;
pub mod script;
pub mod sentinel;
pub mod single;
pub mod subscribe;

use crate::config::model::{RedisEndpoint, RedisSettings};
use cluster::ClusterRedis;
pub use pipeline::*;
pub use round::*;
use sentinel::SentinelRedis;
use single::SingleRedis;

/// The backend for the configured endpoint. Call inside the runtime: connections are made
/// lazily and in the background.
pub fn make(settings: &RedisSettings) -> Result<Box<dyn SyncBackend>, String> {
    make_for(settings, None)
}

/// The backend for the rounds of instance `instance` (`Some`): behind one endpoint with plain
/// increments, their rounds are marked (`journal`) under `<key_prefix>:rounds:<instance>`.
/// `None`: a backend for single calls and reads (an operator's reset, the usage export).
pub fn make_for(
    settings: &RedisSettings,
    instance: Option<&str>,
) -> Result<Box<dyn SyncBackend>, String> {
    Ok(match &settings.endpoint {
        RedisEndpoint::Single(_) => {
            let marks = instance
                .filter(|_| settings.plain_increments)
                .map(|i| format!("{}:rounds:{i}", settings.key_prefix));
            Box::new(SingleRedis::new(settings, marks)?)
        }
        RedisEndpoint::Cluster(_) => Box::new(ClusterRedis::new(settings)?),
        RedisEndpoint::Sentinel { .. } => Box::new(SentinelRedis::new(settings)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_limits::ledger::Answer;

    #[test]
    fn replies_become_answers_and_plain_increments_take_their_steps() {
        use redis::Value::{BulkString, Int};
        // (a script answers its numbers packed as doubles)
        let a = |t: f64, c: f64| {
            BulkString(
                [t, c, 4.0, 2.0, 1.0, 0.0, 0.0]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            )
        };
        let lease = |key: &str| {
            Update::Lease(LedgerUpdate {
                key: key.into(),
                ledger_key: String::new(),
                prev_ledger_key: String::new(),
                prev_key: String::new(),
                member: String::new(),
                used: 0,
                want: 0,
                cap: 0,
                now_ms: 0,
                lease_until_ms: 0,
                expire_at_ms: 0,
                weight_ms: 0,
                period_ms: 0,
                bucket_ns: 0,
                tolerance_us: 0,
                log: LogReport::default(),
                adopt: 0,
                need: 0,
                spare: 0,
                confirmed: 0,
                direct_cap: 0,
                instances: 0,
                direct_each: 0,
                rest: 0,
                since_ms: 0,
            })
        };
        let count = |first| {
            Update::Count(CountUpdate {
                key: "k".into(),
                delta: 3,
                first,
                expire_at_ms: 99,
            })
        };
        let updates = [lease("a"), count(true), count(false), count(false)];
        let mut answers = vec![None; updates.len()];
        let replies = [a(5.0, 9.0), Int(10), Int(10), Int(3)];
        let mut refused = Vec::new();
        let pending = first_replies(&updates, 0..4, &replies, &mut answers, &mut refused).unwrap();
        assert!(refused.is_empty());
        assert_eq!(
            answers[0],
            Some(Reply::Lease(Answer {
                total: 5,
                ceiling: 9,
                fair: 4,
                room: 2,
                held: 1,
                prev: 0,
                grant: 0,
                steps: Default::default(),
            }))
        );
        assert_eq!(answers[2], Some(Reply::Count(10)), "one INCRBY, no more");
        // the expiry after: an earlier report may have created the key (`first`), or this
        // increment did (its total is the increment)
        assert_eq!(pending, vec![(1, 2, 10), (3, 2, 3)]);
        let Update::Count(c) = &updates[1] else {
            unreachable!()
        };
        assert_eq!(count_reply(c, 2, 10, &Int(1)), Ok(Ok(10)));
        let cmd = |stage| {
            String::from_utf8_lossy(&count_cmd(c, stage).get_packed_command()).replace("\r\n", " ")
        };
        assert!(cmd(1).contains("INCRBY $1 k $1 3"), "{}", cmd(1));
        assert!(cmd(2).contains("PEXPIREAT $1 k $2 99"));
        assert!(
            first_replies(&updates, 0..1, &[Int(5)], &mut answers, &mut refused).is_err(),
            "not a script answer"
        );
        // an error reply is a refusal of that update alone: the others' answers count
        let mut answers = vec![None; updates.len()];
        let mut refused = Vec::new();
        let noperm = redis::parse_redis_value(b"-NOPERM this user has no permissions\r\n")
            .unwrap_or(redis::Value::Nil);
        let pending = first_replies(
            &updates,
            0..4,
            &[noperm.clone(), Int(10), noperm, Int(3)],
            &mut answers,
            &mut refused,
        )
        .unwrap();
        assert_eq!(answers[0], None);
        assert_eq!(answers[2], None);
        assert_eq!(pending, vec![(1, 2, 10), (3, 2, 3)]);
        assert_eq!(
            refused
                .iter()
                .map(|r| (r.update, r.error.kind))
                .collect::<Vec<_>>(),
            [(Some(0), ErrorKind::NoPerm), (Some(2), ErrorKind::NoPerm)]
        );
        assert_eq!(
            refused[0].error.message,
            "NOPERM this user has no permissions"
        );
    }

    #[test]
    fn the_heartbeat_reads_the_adjustment_mark_and_the_others_waiting_marks_in_its_own_slot() {
        use redis::cluster_routing::Slot;
        use redis::Value::{Array, BulkString, Int, Map, Nil, Okay};
        for hb in [
            "tg:instances",
            "a{b}c:instances",
            "tollgate:instances",
            "tg:instances",
        ] {
            for (k, name) in [(adjusted_key(hb), "adjusted"), (waiting_key(hb), "waiting")] {
                assert_eq!(Slot::for_key(&k), Slot::for_key(hb), "{k}");
                // under the key prefix, as an ACL's key pattern names it
                assert!(k.starts_with(&format!("{hb}:{name}")), "{k}");
            }
        }
        assert_eq!(adjusted_key("a{b}c:instances"), "a{b}c:instances:adjusted");
        assert_eq!(waiting_key("a{b}c:instances"), "a{b}c:instances:waiting");
        let v = |s: &str| BulkString(s.as_bytes().to_vec());
        let hb = Heartbeat {
            key: "tg:instances".into(),
            adjusted_key: adjusted_key("tg:instances"),
            waiting_key: waiting_key("tg:instances"),
            waits: vec!["tg:{a}:r:1:2".into()],
            channel: "tg:waits".into(),
            publish: false,
            subscribed: false,
            beat: true,
            hear: true,
            instance: "i1".into(),
            now_ms: 5_000,
            liveness_ms: 3_000,
        };
        // its marks (ZADD, PEXPIRE), then the beat
        let replies = |mark: redis::Value, waiting: redis::Value| {
            vec![
                Int(1),
                Int(1),
                Int(1),
                Int(0),
                Int(1),
                mark,
                Int(0),
                waiting,
                Int(3),
            ]
        };
        assert_eq!(hb.replies(), 9);
        let told = |mark, waiting| beat_reply(&hb, &replies(mark, waiting));
        let (beat, error) = told(
            Array(vec![v("v"), v("1795")]),
            Array(vec![
                v("i2 tg:{b}:r:1:2"),
                v("i1 tg:{a}:r:1:2"),
                v("i3 tg:{a}:r:1:2"),
                v("i2 tg:{a}:r:1:2"),
            ]),
        );
        assert_eq!(error, None);
        assert_eq!(beat.instances, Some(3));
        assert_eq!(beat.adjusted, Some(1795));
        // the others' marks only, each key once, sorted
        assert_eq!(beat.waited, ["tg:{a}:r:1:2", "tg:{b}:r:1:2"]);
        // heard on the waits channel: the published marks passed over, not the others
        let marks = Array(vec![
            v("i2+ tg:{b}:r:1:2"),
            v("i1+ tg:{c}:r:1:2"),
            v("i3 tg:{a}:r:1:2"),
        ]);
        let hearing = Heartbeat {
            subscribed: true,
            ..hb.clone()
        };
        let (beat, _) = beat_reply(&hearing, &replies(Nil, marks.clone()));
        assert_eq!(beat.waited, ["tg:{a}:r:1:2"]);
        let (beat, _) = beat_reply(&hb, &replies(Nil, marks));
        assert_eq!(beat.waited, ["tg:{a}:r:1:2", "tg:{b}:r:1:2"]);
        // RESP3 answers a hash as a map
        let (beat, _) = told(Map(vec![(v("v"), v("42"))]), Array(vec![]));
        assert_eq!((beat.adjusted, beat.waited.len()), (Some(42), 0));
        // none lately (the key expired), or not a mark
        for mark in [Array(vec![]), Nil, Array(vec![v("v"), v("x")])] {
            assert_eq!(told(mark, Nil).0.adjusted, None);
        }
        // a refused read of the waits (an ACL without +zrangebyscore): said, the instances
        // still counted; a refused count: said, none
        let noperm =
            redis::parse_redis_value(b"-NOPERM this user has no permissions\r\n").unwrap_or(Nil);
        let (beat, error) = told(Nil, noperm.clone());
        let kind = Some(ErrorKind::NoPerm);
        assert_eq!((beat.instances, error.map(|e| e.kind)), (Some(3), kind));
        assert!(beat.unheard);
        let mut refused = replies(Nil, Array(vec![v("i2 k")]));
        refused[8] = noperm.clone();
        let (beat, error) = beat_reply(&hb, &refused);
        assert_eq!((beat.instances, error.map(|e| e.kind)), (None, kind));
        assert_eq!((beat.waited, beat.unheard), (vec!["k".to_string()], false));
        // after such a refusal, the beat reads the marks no more
        let deaf = Heartbeat {
            hear: false,
            waits: Vec::new(),
            ..hb.clone()
        };
        assert_eq!(deaf.replies(), 5);
        let beat = |mark| vec![Int(1), Int(0), Int(1), mark, Int(3)];
        let (told, error) = beat_reply(&deaf, &beat(Array(vec![v("v"), v("7")])));
        assert_eq!(
            (told.instances, told.adjusted, error),
            (Some(3), Some(7), None)
        );
        // marks alone: no beat, nothing told
        let alone = Heartbeat {
            beat: false,
            ..hb.clone()
        };
        assert_eq!(alone.replies(), 2);
        assert_eq!(beat_reply(&alone, &[Int(1), Okay]), (Beat::default(), None));
        // published: a refused PUBLISH (an ACL without +publish or the channel) is said
        let published = Heartbeat {
            publish: true,
            ..alone
        };
        assert_eq!(published.replies(), 3);
        let (told, error) = beat_reply(&published, &[Int(1), Okay, Int(2)]);
        assert_eq!((told.unpublished, error), (false, None));
        let (told, error) = beat_reply(&published, &[Int(1), Okay, noperm]);
        assert_eq!((told.unpublished, error.map(|e| e.kind)), (true, kind));
    }

    #[test]
    fn error_replies_are_sorted_into_a_bounded_set_of_kinds() {
        let k = |code: &str, detail: &str| ErrorKind::of(code, detail).label();
        assert_eq!(
            k(
                "NOPERM",
                "this user has no permissions to run the 'zadd' command"
            ),
            "noperm"
        );
        // Redis 7.0, a command the script calls
        assert_eq!(
            k("ERR", "The user executing the script can't run this command or subcommand script: 63ce, on @user_script:31."),
            "noperm"
        );
        assert_eq!(
            k("OOM", "command not allowed when used memory > 'maxmemory'."),
            "oom"
        );
        assert_eq!(
            k("READONLY", "You can't write against a read only replica."),
            "readonly"
        );
        assert_eq!(
            k(
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value script: 86"
            ),
            "wrongtype"
        );
        assert_eq!(k("NOSCRIPT", "No matching script."), "noscript");
        assert_eq!(
            k("ERR", "user_script:1: attempt to compare nil with number"),
            "other"
        );
        assert_eq!(k("BUSY", "Redis is busy running a script."), "other");
        let long = ReplyError::new("ERR", &"x".repeat(1000));
        assert!(long.message.len() < 320, "{}", long.message.len());
        let labels: std::collections::HashSet<_> =
            ErrorKind::ALL.iter().map(|k| k.label()).collect();
        assert_eq!(labels.len(), 6);
    }
}
