//! guard_metadata against a real route and API server: its label and
//! annotation fence a ConfigMap write until the lock is taken over.

mod support;

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::{Arc, Mutex};

use queen_locks::{GuardMetadata, LostReason, GUARDED_LABEL, GUARD_ANNOTATION};
use support::{client, delete_permit, kubectl, secs, unique, wait_for};

/// Writes a ConfigMap whose labels and annotations are metadata's.
fn write_configmap_with(name: &str, metadata: &GuardMetadata, value: &str, create: bool) -> Output {
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": metadata.labels, "annotations": metadata.annotations},
        "data": {"report": value},
    });
    kubectl(
        &[if create { "create" } else { "replace" }, "-f", "-"],
        Some(&cm.to_string()),
    )
}

#[test]
fn guard_metadata_fences_a_write_until_the_lock_is_taken_over() {
    let c = client();
    let name = unique("fenced");
    let cm = unique("report");
    let h = c.lock(&name, secs(60)).unwrap(); // renews every 20 s: the token holds still while we write
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let r = reasons.clone();
    h.on_lost(move |reason| r.lock().unwrap().push(reason));
    assert_eq!(h.guard_metadata(), None, "a guard before any acquire");
    assert!(h.acquire().unwrap());
    let meta = h.guard_metadata().unwrap();
    assert_eq!(
        meta,
        GuardMetadata {
            labels: BTreeMap::from([(GUARDED_LABEL.to_string(), "true".to_string())]),
            annotations: BTreeMap::from([(
                GUARD_ANNOTATION.to_string(),
                format!("{}#0={}", name, h.token().unwrap())
            )]),
        }
    );
    let out = write_configmap_with(&cm, &h.guard_metadata().unwrap(), "first", true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = write_configmap_with(&cm, &h.guard_metadata().unwrap(), "second", false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Taken over: the permit deleted by hand and acquired by another.
    delete_permit(&name, 0);
    let b = c.lock(&name, secs(60)).unwrap();
    wait_for("the other holder to acquire", secs(30), || b.acquire().unwrap());
    let out = write_configmap_with(&cm, &h.guard_metadata().unwrap(), "stale", false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a replaced holder's write was admitted");
    assert!(
        stderr.contains("kv_precondition") && stderr.contains(&name),
        "{}",
        stderr
    );
    assert!(!h.check().unwrap());
    assert_eq!(*reasons.lock().unwrap(), [LostReason::Guard]);
    assert_eq!(h.guard_metadata(), None, "a guard after the loss");
}
