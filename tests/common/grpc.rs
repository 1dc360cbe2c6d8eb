//! The grpcio server and client of the gRPC tests (`tests/grpc/peer.py`, `tests/grpc/client.py`,
//! in `target/test-venv`, which `scripts/test-venv` makes and `make deps-test` runs).

use serde_json::Value;
use std::net::SocketAddr;
use std::process::{Child, Command};

pub use super::{repo, test_python as python};

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
