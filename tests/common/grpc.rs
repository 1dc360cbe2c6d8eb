//! The grpcio server and client of the gRPC tests (`tests/grpc/peer.py`, `tests/grpc/client.py`,
//! in `target/grpc-venv`, which `scripts/grpc-venv` makes and `make deps-test` runs).

use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's Python, with grpcio.
pub fn python() -> PathBuf {
    let p = repo().join("target/grpc-venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/grpc-venv (make deps-test does)",
        p.display()
    );
    p
}

/// A grpcio server (`tests/grpc/peer.py`, started with `args`), killed on drop.
pub struct Peer {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Peer {
    pub fn start_with(args: &[&str]) -> Peer {
        let mut cmd = Command::new(python());
        cmd.arg(repo().join("tests/grpc/peer.py")).args(args);
        let (child, addr) = super::spawn_listening(cmd);
        Peer { child, addr }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run the grpcio client on `spec` (see `tests/grpc/client.py`): one result per call.
pub fn run(spec: &Value) -> Vec<Value> {
    let out = Command::new(python())
        .arg(repo().join("tests/grpc/client.py"))
        .arg(spec.to_string())
        .output()
        .expect("run tests/grpc/client.py");
    assert!(
        out.status.success(),
        "the grpc client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("client.py prints a JSON list")
}
