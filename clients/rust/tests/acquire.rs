//! Acquire and release against the real route: one winner, semaphores.

mod support;

use std::collections::HashSet;
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Duration;

use support::{client, secs, unique};

#[test]
fn a_held_lock_is_refused_to_others_until_released() {
    let c = client();
    let name = unique("job");
    let (a, b) = (c.lock(&name, secs(30)).unwrap(), c.lock(&name, secs(30)).unwrap());
    assert!(a.acquire().unwrap());
    assert!(a.held());
    assert_eq!(a.slot(), Some(0));
    let holders = c.holders(&name).unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(
        (holders[0].owner.as_str(), Some(holders[0].token)),
        (a.owner(), a.token())
    );

    assert!(!b.acquire().unwrap());
    assert_eq!(b.reason().as_deref(), Some("held"));
    assert_eq!(
        b.holders().iter().map(|h| h.owner.as_str()).collect::<Vec<_>>(),
        [a.owner()]
    );
    assert_eq!(b.token(), None);

    let a_token = a.token().unwrap();
    a.release().unwrap();
    assert!(!a.held());
    assert!(!a.signal().is_lost(), "a release is not a loss");
    assert_eq!(c.holders(&name).unwrap(), []);
    assert!(b.acquire().unwrap());
    assert!(b.token().unwrap() > a_token, "a later holder's token is higher");
    let g = b.guard().unwrap();
    assert_eq!(
        (g.op.as_str(), g.key.clone(), g.expect, g.required),
        ("check", format!("{}#0", name), b.token().unwrap(), true)
    );
    assert_eq!(g.annotation(), format!("{}#0={}", name, b.token().unwrap()));
    assert!(b.check().unwrap());
    b.release().unwrap();
    // Released: nothing to check, and a second release does nothing.
    assert!(!b.check().unwrap());
    b.release().unwrap();
}

#[test]
fn acquire_again_while_held_is_a_no_op() {
    let h = client().lock(&unique("twice"), secs(30)).unwrap();
    assert!(h.acquire().unwrap());
    let token = h.token();
    assert!(h.acquire().unwrap());
    assert_eq!(h.token(), token);
    h.release().unwrap();
}

#[test]
fn dropping_a_handle_releases_its_lock() {
    let c = client();
    let name = unique("dropped");
    {
        let h = c.lock(&name, secs(30)).unwrap();
        assert!(h.acquire().unwrap());
        assert_eq!(c.holders(&name).unwrap().len(), 1);
    }
    assert_eq!(c.holders(&name).unwrap(), []);
}

#[test]
fn exactly_one_of_many_concurrent_acquirers_wins() {
    let c = client();
    let name = unique("race");
    let n = 8;
    let handles: Vec<_> = (0..n).map(|_| c.lock(&name, secs(30)).unwrap()).collect();
    let start = Barrier::new(n);
    let won: Vec<bool> = thread::scope(|s| {
        let running: Vec<_> = handles
            .iter()
            .map(|h| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    h.acquire().unwrap()
                })
            })
            .collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "winners: {:?}", won);
    let winner = &handles[won.iter().position(|w| *w).unwrap()];
    let holders = c.holders(&name).unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(
        (holders[0].owner.as_str(), Some(holders[0].token)),
        (winner.owner(), winner.token())
    );
    for h in &handles {
        if !h.held() {
            let reason = h.reason().unwrap();
            assert!(reason == "held" || reason == "contended", "{}", reason);
        }
    }
    winner.release().unwrap();
}

#[test]
fn n_holders_take_distinct_slots_and_no_more() {
    let c = client();
    let name = unique("pool");
    let held: Vec<_> = (0..3).map(|_| c.semaphore(&name, 3, secs(30)).unwrap()).collect();
    for h in &held {
        assert!(h.acquire().unwrap());
    }
    let mut slots: Vec<u32> = held.iter().map(|h| h.slot().unwrap()).collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2]);
    let fourth = c.semaphore(&name, 3, secs(30)).unwrap();
    assert!(!fourth.acquire().unwrap());
    assert_eq!((fourth.reason().as_deref(), fourth.holders().len()), (Some("held"), 3));
    for h in &held {
        h.release().unwrap();
    }
    assert!(fourth.acquire().unwrap());
}

#[test]
fn concurrent_holders_never_exceed_n() {
    let c = client();
    let name = unique("never-over");
    let n = 3;
    // (inside now, most at once, slots in use, errors)
    let seen = Mutex::new((0usize, 0usize, HashSet::new(), Vec::<String>::new()));
    thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..3 {
                    let h = c.semaphore(&name, n, secs(30)).unwrap();
                    let ran = h.run(
                        |_lost| {
                            let slot = h.slot().unwrap();
                            {
                                let mut g = seen.lock().unwrap();
                                g.0 += 1;
                                g.1 = g.1.max(g.0);
                                if !g.2.insert(slot) {
                                    g.3.push(format!("slot {} given twice", slot));
                                }
                            }
                            thread::sleep(Duration::from_millis(50)); // hold it a moment, so holders overlap
                            let mut g = seen.lock().unwrap();
                            g.0 -= 1;
                            g.2.remove(&slot);
                        },
                        secs(60),
                    );
                    if !matches!(ran, Ok(Some(()))) {
                        seen.lock().unwrap().3.push(format!("run: {:?}", ran));
                    }
                }
            });
        }
    });
    let g = seen.into_inner().unwrap();
    assert_eq!(g.3, Vec::<String>::new());
    assert!(g.1 <= n as usize, "{} holders at once", g.1);
    assert!(g.1 >= 2, "holders never overlapped: the test proved nothing");
    assert_eq!(c.holders(&name).unwrap(), []);
}
