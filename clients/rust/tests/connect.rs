//! Reaching the route: TLS with a CA file, the bearer token file, bad input.

mod support;

use std::path::Path;

use queen_locks::{Client, Error};
use support::{client, namespace, need, secs, unique, url, Proxy};

#[test]
fn an_https_route_is_verified_with_the_ca_file() {
    let dir = need("QUEEN_LOCKS_TEST_TLS_DIR");
    let dir = Path::new(&dir);
    let proxy = Proxy::tls(
        &url(),
        dir.join("tls.crt").to_str().unwrap(),
        dir.join("tls.key").to_str().unwrap(),
    );
    assert!(proxy.url.starts_with("https://"));
    let name = unique("tls");
    let mut b = Client::builder().url(&proxy.url).ca_file(dir.join("ca.crt"));
    if let Some(ns) = namespace() {
        b = b.namespace(ns);
    }
    let h = b.build().unwrap().lock(&name, secs(30)).unwrap();
    assert!(h.acquire().unwrap());
    assert_eq!(client().holders(&name).unwrap()[0].owner, h.owner());
    h.release().unwrap();

    // Without the CA the route is not trusted: a clear error at once, not
    // an unanswered call to retry for the whole wait.
    let mut b = Client::builder().url(&proxy.url);
    if let Some(ns) = namespace() {
        b = b.namespace(ns);
    }
    let stranger = b.build().unwrap().lock(&name, secs(30)).unwrap();
    let started = std::time::Instant::now();
    let e = stranger.acquire_wait(secs(30)).unwrap_err();
    assert!(matches!(e, Error::Untrusted(_)), "{:?}", e);
    assert!(e.to_string().contains("certificate"), "{}", e);
    assert!(started.elapsed() < secs(10));
    assert_eq!(client().holders(&name).unwrap(), []);
}

#[test]
fn the_token_file_is_sent_as_bearer_and_read_again_when_it_changes() {
    let file = std::env::temp_dir().join(format!("queen-locks-rust-token-{}", unique("t")));
    std::fs::write(&file, "first-token\n").unwrap();
    let proxy = Proxy::new(&url());
    let mut b = Client::builder().url(&proxy.url).token_file(&file);
    if let Some(ns) = namespace() {
        b = b.namespace(ns);
    }
    let c = b.build().unwrap();
    let name = unique("bearer");
    c.holders(&name).unwrap();
    assert!(
        proxy
            .seen()
            .to_lowercase()
            .contains("authorization: bearer first-token\r\n"),
        "{}",
        proxy.seen()
    );
    // Replaced as the kubelet does: a new file renamed over the old one.
    let next = file.with_extension("next");
    std::fs::write(&next, "second-token").unwrap();
    std::fs::rename(&next, &file).unwrap();
    c.holders(&name).unwrap();
    assert!(
        proxy
            .seen()
            .to_lowercase()
            .contains("authorization: bearer second-token\r\n"),
        "{}",
        proxy.seen()
    );
    std::fs::remove_file(&file).unwrap();
    let e = c.holders(&name).unwrap_err();
    assert!(
        matches!(e, Error::Invalid(_)) && e.to_string().starts_with("token file "),
        "{}",
        e
    );
}

#[test]
fn bad_input_is_refused_before_any_call_naming_what_is_wrong() {
    let c = client();
    let cases: Vec<(Result<queen_locks::Handle, Error>, &str)> = vec![
        (c.lock("", secs(30)), "lock name: must not be empty"),
        (c.lock("a#b", secs(30)), "must not contain '#'"),
        (c.lock("a\u{7}", secs(30)), "control character"),
        (c.lock("ok", secs(0)), "ttl must be from 1s"),
        (c.lock("ok", secs(31_536_001)), "ttl must be from 1s"),
        (
            c.semaphore("ok", 0, secs(30)),
            "semaphore size n must be from 1 to 1024, got 0",
        ),
        (c.semaphore("ok", 1025, secs(30)), "got 1025"),
        (c.semaphore_as("ok", 1, secs(30), ""), "owner must be 1 to 256 bytes"),
    ];
    for (got, says) in cases {
        let e = got.unwrap_err();
        assert!(
            matches!(e, Error::Invalid(_)) && e.to_string().contains(says),
            "{:?} does not say {:?}",
            e,
            says
        );
    }
    let e = c.holders("a#b").unwrap_err();
    assert!(e.to_string().contains("'#'"), "{}", e);
    for (bad, says) in [("localhost:6632", "route URL"), ("ftp://x/", "http:// or https://")] {
        let e = Client::builder().url(bad).build().unwrap_err();
        assert!(e.to_string().contains(says), "{}: {}", bad, e);
    }
    let e = Client::builder()
        .url("https://127.0.0.1:1")
        .ca_file("no/such/ca.crt")
        .build()
        .unwrap_err();
    assert!(e.to_string().starts_with("CA file no/such/ca.crt:"), "{}", e);
}

#[test]
fn a_call_the_route_refuses_names_the_field() {
    // Nothing the handle checks itself: the namespace is the route's to judge.
    let h = Client::builder()
        .url(url())
        .namespace("Not_A_Namespace")
        .build()
        .unwrap()
        .lock(&unique("refused"), secs(30))
        .unwrap();
    match h.acquire() {
        Err(Error::Route {
            code, message, field, ..
        }) => {
            assert_eq!((code, field.as_deref()), (400, Some("namespace")), "{}", message);
            assert!(message.contains("Not_A_Namespace"), "{}", message);
        }
        other => panic!("a call in a namespace the route refuses answered {:?}", other),
    }
    assert!(!h.held());
}
