//! Headless Chromium, as the tests drive it: its flags, and a page driven through the
//! DevTools protocol.

use super::{eventually, TempDir};
use std::process::Command;
use std::time::Duration;

/// Headless Chromium's flags, as the environment notes say it runs here (no sandbox as root,
/// no background networking on this closed network).
pub const CHROMIUM: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// Headless Chromium driven through the DevTools protocol (its `Runtime.evaluate` over the
/// page's WebSocket): the page opened at `url`, then expressions evaluated in it.
pub struct Browser {
    child: std::process::Child,
    _profile: TempDir,
    rt: tokio::runtime::Runtime,
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl Browser {
    pub fn open(url: &str) -> Browser {
        let profile = TempDir::new();
        let child = Command::new("chromium")
            .args(CHROMIUM)
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.0.display()))
            .arg(url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromium (Debian package chromium; make test installs it)");
        // the port it chose, in its profile
        let active = profile.0.join("DevToolsActivePort");
        let mut port = 0u16;
        assert!(eventually(Duration::from_secs(20), || {
            port = std::fs::read_to_string(&active)
                .ok()
                .and_then(|t| t.lines().next().and_then(|l| l.parse().ok()))
                .unwrap_or(0);
            port != 0
        }));
        let mut page = None;
        assert!(eventually(Duration::from_secs(10), || {
            // (curl: the DevTools endpoint keeps its connections open)
            let list = Command::new("curl")
                .args(["-s", "--max-time", "5"])
                .arg(format!("http://127.0.0.1:{port}/json/list"))
                .output()
                .ok()
                .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok());
            page = list.and_then(|l| {
                l.as_array()?
                    .iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_string))
            });
            page.is_some()
        }));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let page = page.unwrap_or_default();
        let (ws, _) = rt
            .block_on(tokio_tungstenite::connect_async(page.as_str()))
            .expect("the page's DevTools socket");
        Browser {
            child,
            _profile: profile,
            rt,
            ws,
            next_id: 1,
        }
    }

    /// The value of `expression` in the page (promises awaited).
    pub fn eval(&mut self, expression: &str) -> serde_json::Value {
        use futures_util::{SinkExt, StreamExt};
        let id = self.next_id;
        self.next_id += 1;
        let msg = serde_json::json!({
            "id": id,
            "method": "Runtime.evaluate",
            "params": { "expression": expression, "returnByValue": true, "awaitPromise": true },
        });
        let ws = &mut self.ws;
        self.rt.block_on(async {
            ws.send(tokio_tungstenite::tungstenite::Message::text(
                msg.to_string(),
            ))
            .await
            .expect("sent");
            while let Some(Ok(m)) = ws.next().await {
                let v: serde_json::Value =
                    serde_json::from_str(m.to_text().unwrap_or("{}")).unwrap_or_default();
                if v["id"] == id {
                    return v["result"]["result"]["value"].clone();
                }
            }
            serde_json::Value::Null
        })
    }

    /// Until `expression` is true in the page.
    pub fn until(&mut self, expression: &str) -> bool {
        eventually(Duration::from_secs(10), || self.eval(expression) == true)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
