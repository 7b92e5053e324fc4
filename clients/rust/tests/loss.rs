//! Losing a lock: a permit deleted by hand, a route that stops answering,
//! a guard that no longer holds.

mod support;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use queen_locks::LostReason;
use support::{client, client_at, delete_permit, secs, unique, url, wait_for, write_configmap, Proxy};

#[test]
fn deleting_the_permit_by_hand_loses_it_with_reason_renew() {
    let ttl = secs(3);
    let name = unique("deleted");
    let h = client().lock(&name, ttl).unwrap();
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    h.on_lost(move |r| tx.lock().unwrap().send((r, Instant::now())).unwrap());
    assert!(h.acquire().unwrap());
    let signal = h.signal();
    delete_permit(&name, 0);
    let deleted = Instant::now(); // kubectl's own start-up is not the handle's
    let (reason, at) = rx.recv_timeout(secs(30)).expect("the loss was never reported");
    assert_eq!(reason, LostReason::Renew);
    // The next renew, at most a third of the lifetime away, learns it; a
    // second of slack for that renew's call on a busy machine.
    let took = at.saturating_duration_since(deleted);
    assert!(took <= ttl / 3 + secs(1), "learnt {:?} after the delete", took);
    assert!(rx.try_recv().is_err(), "the loss was reported twice");
    assert_eq!(signal.reason(), Some(LostReason::Renew));
    assert!(!h.held());
    assert_eq!(h.reason().as_deref(), Some("renew"));
    h.release().unwrap(); // nothing held: nothing to do
}

#[test]
fn a_route_that_stops_answering_is_given_up_on_the_local_clock() {
    let ttl = secs(2);
    let c = client();
    let name = unique("cut-off");
    // Requests reach the route 0.3 s after they are sent, so the server's
    // lifetime starts later than the one the handle counts.
    let proxy = Proxy::slow(&url(), Duration::from_millis(300));
    let h = client_at(&proxy.url).lock(&name, ttl).unwrap();
    let (renewed_tx, renewed) = mpsc::channel();
    let renewed_tx = Mutex::new(renewed_tx);
    h.on_renew(move |_| {
        let _ = renewed_tx.lock().unwrap().send(());
    });
    let lost_at = Arc::new(Mutex::new(Vec::new()));
    let l = lost_at.clone();
    h.on_lost(move |r| l.lock().unwrap().push((r, SystemTime::now())));
    let acquired_at = SystemTime::now();
    assert!(h.acquire().unwrap());
    renewed.recv_timeout(secs(30)).expect("no renew got through");
    proxy.cut();
    let server_expiry = h.expires_at().expect("an expiry"); // of the last renew that got through
    assert_eq!(
        h.signal().wait_timeout(secs(30)),
        Some(LostReason::Expired),
        "the handle never gave up"
    );
    // The signal fires first, then the callbacks run.
    wait_for("on_lost", secs(10), || !lost_at.lock().unwrap().is_empty());
    let lost = lost_at.lock().unwrap().clone();
    assert_eq!(lost.len(), 1, "{:?}", lost);
    let (reason, at) = lost[0];
    assert_eq!(reason, LostReason::Expired);
    assert!(
        at < server_expiry,
        "the handle must give up before the server does ({:?} >= {:?})",
        at,
        server_expiry
    );
    assert!(
        at >= acquired_at + ttl,
        "renewals got through: it cannot have expired within one lifetime"
    );
    assert!(!h.held());
    // Nobody else may have it before the server's expiry.
    for holder in c.holders(&name).unwrap() {
        assert_eq!(holder.owner, h.owner());
    }
}

#[test]
fn run_signals_the_closure_when_the_lock_is_lost() {
    let name = unique("run-lost");
    let h = client().lock(&name, secs(3)).unwrap();
    let out = h
        .run(
            |lost| {
                assert!(!lost.is_lost());
                delete_permit(&name, 0);
                // The work waits on the signal, as a long job would check it.
                lost.wait_timeout(secs(30))
            },
            secs(5),
        )
        .unwrap();
    assert_eq!(out, Some(Some(LostReason::Renew)));
    assert!(!h.held());
}

#[test]
fn the_guard_is_accepted_by_a_guarded_write_and_refused_after_loss() {
    let name = unique("fenced");
    let cm = unique("report");
    let h = client().lock(&name, secs(60)).unwrap(); // renews every 20 s: the token holds still while we write
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let r = reasons.clone();
    h.on_lost(move |reason| r.lock().unwrap().push(reason));
    assert!(h.acquire().unwrap());
    let guard = h.guard().unwrap().annotation();
    assert_eq!(guard, format!("{}#0={}", name, h.token().unwrap()));
    let out = write_configmap(&cm, &guard, "first", true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = write_configmap(&cm, &guard, "second", false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    delete_permit(&name, 0);
    assert!(!h.check().unwrap());
    assert_eq!(*reasons.lock().unwrap(), [LostReason::Guard]);
    assert_eq!(h.signal().reason(), Some(LostReason::Guard));

    let out = write_configmap(&cm, &guard, "stale", false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a write under a lost lock's token was admitted");
    assert!(
        stderr.contains("kv_precondition") && stderr.contains(&name),
        "{}",
        stderr
    );
}
