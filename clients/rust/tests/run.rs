//! run: acquire with a wait, work, release whatever the work did.

mod support;

use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::{client, client_at, secs, unique, url, wait_for, Proxy};

#[test]
fn run_gives_up_when_the_wait_ends_without_running() {
    let c = client();
    let name = unique("busy");
    let holder = c.lock(&name, secs(30)).unwrap();
    assert!(holder.acquire().unwrap());
    let other = c.lock(&name, secs(30)).unwrap();
    let started = Instant::now();
    let ran = other
        .run(|_| panic!("ran while held elsewhere"), Duration::from_millis(1500))
        .unwrap();
    assert_eq!(ran, None);
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "gave up after {:?}",
        started.elapsed()
    );
    assert_eq!(other.reason().as_deref(), Some("held"));
    assert_eq!(other.holders()[0].owner, holder.owner());
    holder.release().unwrap();
}

#[test]
fn run_waits_for_the_holder_and_releases_after() {
    let c = client();
    let name = unique("turn");
    let holder = c.lock(&name, secs(30)).unwrap();
    assert!(holder.acquire().unwrap());
    let proxy = Proxy::new(&url());
    let waiter = client_at(&proxy.url).lock(&name, secs(30)).unwrap();
    let seen = Mutex::new(None);
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            waiter.run(
                |lost| {
                    *seen.lock().unwrap() = Some((waiter.held(), lost.is_lost(), waiter.token().unwrap()));
                    "done"
                },
                secs(20),
            )
        });
        wait_for("the waiter to ask", secs(10), || proxy.calls() >= 1);
        holder.release().unwrap();
        assert_eq!(t.join().unwrap().unwrap(), Some("done"));
    });
    let (held, lost, token) = seen.into_inner().unwrap().expect("the work never ran");
    assert!(held && !lost);
    assert!(token > holder.token().unwrap());
    assert!(!waiter.held());
    assert_eq!(c.holders(&name).unwrap(), [], "run releases after the work");
}

#[test]
fn run_releases_when_the_work_panics() {
    let c = client();
    let name = unique("panics");
    let h = c.lock(&name, secs(30)).unwrap();
    let out = panic::catch_unwind(AssertUnwindSafe(|| {
        h.run(|_| -> () { panic!("the job's own failure") }, secs(5))
    }));
    let err = out.unwrap_err();
    assert_eq!(err.downcast_ref::<&str>(), Some(&"the job's own failure"));
    assert!(!h.held());
    assert_eq!(c.holders(&name).unwrap(), []);
}
