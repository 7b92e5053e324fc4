//! Background renew: several lifetimes, lost answers, unanswered acquires.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{client, client_at, secs, unique, url, wait_for, Proxy};

#[test]
fn background_renew_keeps_a_lock_for_several_lifetimes() {
    let c = client();
    let name = unique("long-job");
    // A 2 s lifetime: six renewals a third of it apart outlive it twice over.
    let h = c.lock(&name, secs(2)).unwrap();
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let t = tokens.clone();
    h.on_renew(move |token| t.lock().unwrap().push(token));
    assert!(h.acquire().unwrap());
    let first = h.token().unwrap();
    wait_for("six renewals", secs(30), || tokens.lock().unwrap().len() >= 6);
    assert!(h.held());
    assert!(!h.signal().is_lost());
    let tokens = tokens.lock().unwrap().clone();
    let mut sorted = tokens.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(tokens, sorted, "every renew answers a new, higher token");
    assert!(tokens[0] > first);
    let holders = c.holders(&name).unwrap();
    assert_eq!(holders[0].owner, h.owner());
    assert!(holders[0].token >= tokens[5]);
    h.release().unwrap();
    assert_eq!(c.holders(&name).unwrap(), []);
}

#[test]
fn a_lost_answer_is_retried_with_the_same_owner() {
    let c = client();
    let name = unique("retried");
    let proxy = Proxy::new(&url());
    let h = client_at(&proxy.url).lock(&name, secs(3)).unwrap();
    proxy.set_drop(1); // the acquire lands, its answer does not come back
    assert!(h.acquire_wait(secs(10)).unwrap());
    assert!(proxy.calls() >= 2);
    let holders = c.holders(&name).unwrap();
    assert_eq!(
        (holders[0].owner.as_str(), Some(holders[0].token)),
        (h.owner(), h.token())
    );

    // A renew whose answer is lost: the next one sends the same (now
    // stale) token and the route carries it through.
    let renewals = Arc::new(Mutex::new(0));
    let r = renewals.clone();
    h.on_renew(move |_| *r.lock().unwrap() += 1);
    let before = proxy.calls();
    proxy.set_drop(1);
    wait_for("two renewals after a lost answer", secs(30), || {
        *renewals.lock().unwrap() >= 2
    });
    assert!(proxy.calls() >= before + 3, "no renew was retried");
    assert!(h.held());
    let holders = c.holders(&name).unwrap();
    assert_eq!(
        (holders[0].owner.as_str(), Some(holders[0].token)),
        (h.owner(), h.token())
    );
    h.release().unwrap();
}

#[test]
fn release_after_an_unanswered_acquire_frees_what_it_took() {
    let c = client();
    let name = unique("unsure");
    let proxy = Proxy::new(&url());
    let h = client_at(&proxy.url).lock(&name, secs(30)).unwrap();
    proxy.set_drop(1);
    let e = h.acquire().unwrap_err();
    assert!(e.is_unavailable(), "{:?}", e);
    let holders = c.holders(&name).unwrap();
    assert_eq!(holders[0].owner, h.owner());
    assert!(!h.held());
    h.release().unwrap();
    assert_eq!(
        c.holders(&name).unwrap(),
        [],
        "the permit the lost answer told of is still held"
    );
}

#[test]
fn an_acquire_that_waits_is_woken_when_the_holder_releases() {
    let c = client();
    let name = unique("woken");
    let holder = c.lock(&name, secs(30)).unwrap();
    assert!(holder.acquire().unwrap());
    let proxy = Proxy::new(&url());
    let waiter = client_at(&proxy.url).lock(&name, secs(30)).unwrap();
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            let asked = std::time::Instant::now();
            (waiter.acquire_wait(secs(20)).unwrap(), asked.elapsed())
        });
        wait_for("the waiter to ask", secs(10), || proxy.calls() >= 1);
        std::thread::sleep(Duration::from_millis(300)); // let the call reach the route and wait there
        holder.release().unwrap();
        let (won, took) = t.join().unwrap();
        assert!(won);
        // One call that the route answered when the slot freed, not polling.
        assert_eq!(proxy.calls(), 1, "the waiter polled instead of waiting at the route");
        assert!(took < secs(10), "took {:?}", took);
        assert!(
            proxy.seen().contains("\"waitSeconds\":10"),
            "the call carried no waitSeconds: {}",
            proxy.seen()
        );
    });
    waiter.release().unwrap();
}
