//! What the tests share: where the route is, kubectl, and a loopback proxy
//! that a test can slow down, cut, or make lose answers.
//!
//! The tests need a route. `go test ./clients/ -run TestRustHandle` starts a
//! control plane and sets the variables below; by hand, against `make dev`
//! (run from clients/rust):
//!
//! ```sh
//! QUEEN_LOCKS_TEST_URL=http://localhost:6632 QUEEN_LOCKS_TEST_NAMESPACE=default \
//! QUEEN_LOCKS_TEST_KUBECONFIG=../../.dev/kubeconfig QUEEN_LOCKS_TEST_KUBECTL=../../bin/kubectl \
//! cargo test --offline
//! ```
#![allow(dead_code)] // each test file uses a part of it

mod proxy;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use queen_locks::Client;

#[allow(unused_imports)]
pub use proxy::Proxy;

/// An environment variable the tests need; a clear failure when it is not
/// set, since a test that silently did nothing would prove nothing.
pub fn need(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{} is not set: these tests need a running route and kubectl \
             (go test ./clients/ -run TestRustHandle sets them; by hand see tests/support/mod.rs)",
            name
        ),
    }
}

pub fn url() -> String {
    need("QUEEN_LOCKS_TEST_URL")
}

pub fn namespace() -> Option<String> {
    std::env::var("QUEEN_LOCKS_TEST_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
}

/// A client of the test route, or of another URL (a proxy in front of it).
pub fn client_at(url: &str) -> Client {
    let mut b = Client::builder().url(url);
    if let Some(ns) = namespace() {
        b = b.namespace(ns);
    }
    b.build().expect("building a client")
}

pub fn client() -> Client {
    client_at(&url())
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A lock name no other run has used, so runs against make dev do not meet.
pub fn unique(prefix: &str) -> String {
    // The owner's last part is random hex.
    let owner = queen_locks::mint_owner();
    format!("{}-{}", prefix, &owner[owner.len() - 6..])
}

/// Runs kubectl in the test namespace.
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(need("QUEEN_LOCKS_TEST_KUBECTL"));
    cmd.arg("--kubeconfig").arg(need("QUEEN_LOCKS_TEST_KUBECONFIG"));
    if let Some(ns) = namespace() {
        cmd.args(["-n", &ns]);
    }
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting kubectl");
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).expect("writing to kubectl");
    }
    drop(input);
    child.wait_with_output().expect("running kubectl")
}

/// Deletes the permit of a simply named lock, as an operator would.
pub fn delete_permit(lock: &str, slot: u32) {
    let out = kubectl(
        &["delete", "queenlock", &format!("{}.{}", lock, slot), "--wait=false"],
        None,
    );
    assert!(
        out.status.success(),
        "kubectl delete: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes a guarded ConfigMap carrying the guard annotation, as every write
/// to one must.
pub fn write_configmap(name: &str, guard: &str, value: &str, create: bool) -> Output {
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {"locks.queen.dev/guarded": "true"},
            "annotations": {"locks.queen.dev/guard": guard},
        },
        "data": {"report": value},
    });
    kubectl(
        &[if create { "create" } else { "replace" }, "-f", "-"],
        Some(&cm.to_string()),
    )
}

/// Waits until cond() holds, checking every 20 ms.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < end,
            "waiting for {}: gave up after {:?}",
            what,
            timeout
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
