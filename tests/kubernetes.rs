//! deploy/kubernetes (issue 42 item 2): the kustomize base and its example overlay render
//! (`kubectl kustomize`, offline), pass the Kubernetes schemas (`kubernetes-validate --strict`,
//! from PyPI, offline; a planted typo fails it), and say what docs/operations.md promises: the
//! probes the admin listener serves, a grace period that covers preStop and the config's
//! `grace_period`, a rolling update that never lowers capacity, a read-only root without
//! privileges, the config mounted so that Kubernetes updates it in place and `watch_config`
//! reloads it, a config `tollgate -t` accepts, secrets from a Secret, the dashboard.

mod common;

use common::*;
use serde_yaml::Value;
use std::process::Command;

fn render(dir: &str) -> String {
    let out = Command::new("kubectl")
        .args(["kustomize", &repo().join(dir).display().to_string()])
        .output()
        .expect("kubectl (make deps-test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| serde_yaml::with::singleton_map_recursive::deserialize(d).unwrap_or(Value::Null))
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn validate(yaml: &str) -> (bool, String) {
    let dir = TempDir::new();
    let file = dir.write("rendered.yaml", yaml);
    let venv = test_python();
    let out = Command::new(venv.with_file_name("kubernetes-validate"))
        .args(["--strict", "-k", "1.32.0", &file.display().to_string()])
        .output()
        .expect("kubernetes-validate (scripts/test-venv installs it)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn seconds(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v:?} is no number"))
}

#[test]
fn the_manifests_render_and_pass_the_kubernetes_schemas() {
    // (the base has no Secret: an overlay makes it)
    for (dir, resources) in [
        ("deploy/kubernetes/base", 5),
        ("deploy/kubernetes/overlays/example", 6),
    ] {
        let yaml = render(dir);
        let (ok, report) = validate(&yaml);
        assert!(ok, "{dir}: {report}");
        // every resource but the Prometheus Operator's (a CRD) checked against its schema
        assert_eq!(
            report.matches(" passed for resource ").count(),
            resources,
            "{report}"
        );
        // the check can fail: a typo in the Deployment
        let (ok, report) = validate(&yaml.replacen("readinessProbe:", "readinesProbe:", 1));
        assert!(!ok, "{report}");
    }
}

#[test]
fn the_deployment_rolls_without_losing_a_request_and_runs_without_privileges() {
    let docs = documents(&render("deploy/kubernetes/overlays/example"));
    let deploy = kind(&docs, "Deployment", "tollgate");
    assert_eq!(deploy["metadata"]["namespace"], "tollgate");
    assert_eq!(deploy["spec"]["replicas"], 3);
    assert_eq!(
        deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    let pod = &deploy["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "registry.example.com/tollgate:0.1.0");
    // the admin listener's probes
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "admin");
    // the config the pod runs (the overlay's: the base's with Redis)
    let config = kind(&docs, "ConfigMap", "tollgate-config")["data"]["gateway.yaml"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let cfg: Value = serde_yaml::from_str(&config).unwrap_or(Value::Null);
    let admin_port = cfg["server"]["admin"]
        .as_str()
        .unwrap_or_default()
        .rsplit(':')
        .next()
        .map(str::to_string);
    let port_of = |name: &str| {
        c["ports"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .map(|p| p["containerPort"].as_u64().unwrap_or(0).to_string())
    };
    assert_eq!(port_of("admin"), admin_port, "{config}");
    // grace: preStop, then the config's grace_period, within terminationGracePeriodSeconds
    let pre_stop = seconds(&c["lifecycle"]["preStop"]["sleep"]["seconds"]);
    let grace = cfg["server"]["grace_period"]
        .as_str()
        .unwrap_or_default()
        .trim_end_matches('s')
        .parse::<u64>()
        .unwrap_or(u64::MAX);
    assert!(
        pre_stop >= 5 && pre_stop + grace < seconds(&pod["terminationGracePeriodSeconds"]),
        "{pre_stop} {grace}"
    );
    // no privilege
    let sc = &c["securityContext"];
    assert_eq!(
        (
            &sc["readOnlyRootFilesystem"],
            &sc["allowPrivilegeEscalation"]
        ),
        (&Value::Bool(true), &Value::Bool(false))
    );
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    // sized, and the threads match the CPUs asked for
    assert_eq!(c["resources"]["requests"]["cpu"], "2");
    assert_eq!(cfg["server"]["threads"], 2);
    assert!(c["resources"]["limits"]["memory"].is_string());
    // the config: a directory mount (a subPath mount is never updated), watched, logged as JSON
    let mounts = c["volumeMounts"].as_sequence().cloned().unwrap_or_default();
    assert!(mounts.iter().all(|m| m["subPath"].is_null()), "{mounts:?}");
    assert_eq!(cfg["server"]["watch_config"], true);
    assert_eq!(cfg["server"]["log_format"], "json");
    // a PodDisruptionBudget, the Service, the ServiceMonitor on the admin port
    assert_eq!(
        kind(&docs, "PodDisruptionBudget", "tollgate")["spec"]["maxUnavailable"],
        1
    );
    assert_eq!(
        kind(&docs, "Service", "tollgate")["spec"]["ports"][0]["targetPort"],
        "http"
    );
    let sm = kind(&docs, "ServiceMonitor", "tollgate");
    assert_eq!(
        (
            &sm["spec"]["endpoints"][0]["port"],
            &sm["spec"]["endpoints"][0]["path"]
        ),
        (&"admin".into(), &"/metrics".into())
    );
}

#[test]
fn the_config_in_the_configmap_is_valid_and_its_secrets_come_from_the_secret() {
    let docs = documents(&render("deploy/kubernetes/overlays/example"));
    let config = kind(&docs, "ConfigMap", "tollgate-config")["data"]["gateway.yaml"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // the overlay's config is the base's and a redis section, nothing else
    let base = std::fs::read_to_string(repo().join("deploy/kubernetes/base/gateway.yaml"))
        .unwrap_or_default();
    assert!(
        config.starts_with(&base) && config[base.len()..].starts_with("redis:\n"),
        "{config}"
    );
    // the files of the Secret, where the config reads them (mounted at /etc/tollgate-secrets)
    let secret = kind(&docs, "Secret", "tollgate-secrets");
    let dir = TempDir::new();
    for name in ["keys.yaml", "redis-url"] {
        let value = secret["data"][name]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} in the Secret"));
        let bytes = base64_decode(value);
        std::fs::write(dir.0.join(name), bytes).unwrap();
        assert!(
            config.contains(&format!("/etc/tollgate-secrets/{name}")),
            "{config}"
        );
    }
    // `tollgate -t` takes it (the upstream `app` is a Service name: here an address)
    let local = config
        .replace("/etc/tollgate-secrets/", &format!("{}/", dir.0.display()))
        .replace("\"app:80\"", "\"127.0.0.1:80\"");
    let p = dir.write("gateway.yaml", &local).display().to_string();
    let (code, out, err) = run_tollgate(&["-t", "--offline", "-c", &p]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("redis://gateway:***@redis:6379") || out.contains("redis://***@redis:6379"),
        "{out}"
    );
    // the dashboard of examples/ops, labelled for Grafana's sidecar
    let dash = kind(&docs, "ConfigMap", "tollgate-dashboard");
    assert_eq!(dash["metadata"]["labels"]["grafana_dashboard"], "1");
    let ours = std::fs::read_to_string(repo().join("examples/ops/grafana-dashboard.json"))
        .unwrap_or_default();
    assert_eq!(dash["data"]["tollgate.json"].as_str(), Some(ours.as_str()));
}

/// Standard base64 (a Secret's `data`), without a crate of its own for one test.
fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_default()
}
