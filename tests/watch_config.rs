//! `server.watch_config` (issue 42 item 3): the config reloads when its file changes on disk,
//! as Kubernetes changes a mounted ConfigMap (a `..data` symlink swapped to a new directory),
//! or when a file it includes is replaced; a broken file keeps the running config. No SIGHUP
//! is sent in these tests.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn config(up: &Upstream, path: &str) -> String {
    format!(
        r#"server:
  listen: ["{{LISTEN}}"]
  admin: "{{ADMIN}}"
  watch_config: true
upstreams:
  app:
    servers: ["{}"]
routes:
  - id: app
    path: {path}
    upstream: app
"#,
        up.addr
    )
}

/// Publish `text` as Kubernetes does a ConfigMap's new version: a new timestamped directory,
/// a `..data_tmp` symlink to it renamed over `..data` (one atomic step), the old directory gone.
fn publish(dir: &Path, version: u32, text: &str) {
    let data = dir.join(format!("..2026_11_26_v{version}"));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("gateway.yaml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(data.file_name().unwrap(), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    if version > 1 {
        let _ = std::fs::remove_dir_all(dir.join(format!("..2026_11_26_v{}", version - 1)));
    }
}

/// A ConfigMap's mount: `gateway.yaml -> ..data/gateway.yaml`, `..data -> ..2026_11_26_v1`.
fn mount(dir: &TempDir, text: &str) -> PathBuf {
    publish(&dir.0, 1, text);
    let link = dir.0.join("gateway.yaml");
    std::os::unix::fs::symlink("..data/gateway.yaml", &link).unwrap();
    link
}

fn reloads(gw: &Gateway, result: &str) -> f64 {
    metric_sum(
        &gw.metrics(),
        &format!("tollgate_config_reloads_total{{result=\"{result}\"}}"),
    )
}

#[test]
fn a_configmap_swap_reloads_and_a_broken_one_keeps_the_running_config() {
    let up = Upstream::start("app");
    let gw = Gateway::start_laid_out(&config(&up, "/a/**"), &[], mount);
    assert_eq!(gw.get("/a/1", &[]).status, 200);
    assert_eq!(gw.get("/b/1", &[]).status, 404);
    // the new version: /b instead of /a
    let text = |path| {
        config(&up, path)
            .replace("{LISTEN}", &gw.addr.to_string())
            .replace("{ADMIN}", &gw.admin.to_string())
    };
    publish(&gw.dir.0, 2, &text("/b/**"));
    assert!(
        eventually(Duration::from_secs(10), || gw.get("/b/1", &[]).status
            == 200),
        "{}",
        gw.log()
    );
    assert_eq!(gw.get("/a/1", &[]).status, 404);
    assert_eq!(reloads(&gw, "ok"), 1.0);
    assert!(gw.log().contains("changed (watch_config)"), "{}", gw.log());
    // a broken version: logged as a SIGHUP's would be, the running config stays
    publish(
        &gw.dir.0,
        3,
        &text("/b/**").replace("upstream: app", "upstream: nope"),
    );
    assert!(
        eventually(Duration::from_secs(10), || reloads(&gw, "error") == 1.0),
        "{}",
        gw.log()
    );
    assert_eq!(gw.get("/b/1", &[]).status, 200);
    assert!(
        gw.log().contains("unknown upstream \"nope\"")
            && gw.log().contains("the running configuration stays"),
        "{}",
        gw.log()
    );
    // and the next good one is taken
    publish(&gw.dir.0, 4, &text("/c/**"));
    assert!(
        eventually(Duration::from_secs(10), || gw.get("/c/1", &[]).status
            == 200),
        "{}",
        gw.log()
    );
    assert_eq!(reloads(&gw, "ok"), 2.0);
}

/// Turned on by a SIGHUP reload; then an included file written in place, and one replaced as
/// an editor saves (a new file renamed over it), each reload.
#[test]
fn an_included_file_changed_on_disk_reloads() {
    let up = Upstream::start("app");
    let limits = |n: u32| {
        format!("- id: all\n  pathPattern: /**\n  per: global\n  tiers: [{{ period: 1h, threshold: {n} }}]\n")
    };
    let cfg = config(&up, "/**") + "limits: limits.yaml\n";
    let off = cfg.replace("  watch_config: true\n", "");
    let gw = Gateway::start_with_files(&off, &[("limits.yaml", &limits(1000))]);
    assert!(gw.reload(&cfg));
    assert_eq!(gw.get("/x", &[]).status, 200);
    // written in place: the route's limit is 2000 now, so that nothing else shows
    std::fs::write(gw.dir.0.join("limits.yaml"), limits(2000)).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || reloads(&gw, "ok") == 2.0),
        "{}",
        gw.log()
    );
    // an editor's save: a new file renamed over the old one
    let tmp = gw.dir.write("limits.yaml.tmp", &limits(1));
    std::fs::rename(tmp, gw.dir.0.join("limits.yaml")).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || reloads(&gw, "ok") == 3.0),
        "{}",
        gw.log()
    );
    // the new threshold of 1 holds (whether the count before the reload is kept or not)
    let statuses = [gw.get("/x", &[]).status, gw.get("/x", &[]).status];
    assert_eq!(statuses[1], 429, "{statuses:?}");
}

/// A config that is a symlink to a file elsewhere, edited in place there, reloads (the
/// directory its link points to is watched too); a file beside it that keeps changing (a log)
/// does not hold the reload back.
#[test]
fn a_linked_config_edited_where_it_points_reloads() {
    let up = Upstream::start("app");
    let elsewhere = TempDir::new();
    let gw = Gateway::start_laid_out(&config(&up, "/a/**"), &[], |dir, text| {
        let target = elsewhere.write("real.yaml", text);
        let link = dir.0.join("gateway.yaml");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        link
    });
    assert_eq!(gw.get("/b/1", &[]).status, 404);
    let text = std::fs::read_to_string(elsewhere.0.join("real.yaml")).unwrap();
    let busy = elsewhere.0.join("busy.log");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, busy) = (stop.clone(), busy.clone());
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::File::create(busy).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = writeln!(f, "a line");
                std::thread::yield_now();
            }
        })
    };
    std::fs::write(
        elsewhere.0.join("real.yaml"),
        text.replace("/a/**", "/b/**"),
    )
    .unwrap();
    let reloaded = eventually(Duration::from_secs(10), || {
        gw.get("/b/1", &[]).status == 200
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = writer.join();
    assert!(reloaded, "{}", gw.log());
}
