//! A holder for the cross-language test (clients/rust_test.go), which
//! checks that the Rust handle and the others see each other's locks. Not
//! a test itself.
//!
//!     holder hold NAME   acquire, print {"acquired", "owner", "token"}, hold
//!                        (renewing) until stdin closes, then release
//!     holder try NAME    acquire once, print {"acquired", "owner", "reason",
//!                        "holders"}, release if acquired
//!
//! The route is $QUEEN_LOCKS_URL, the namespace $QUEEN_LOCKS_TEST_NAMESPACE.

use std::io::Read;
use std::process::exit;
use std::time::Duration;

use queen_locks::Client;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 2 || (args[0] != "hold" && args[0] != "try") {
        eprintln!("usage: holder hold|try NAME");
        exit(2);
    }
    if let Err(e) = hold(&args[0], &args[1]) {
        eprintln!("holder: {}", e);
        exit(1);
    }
}

fn hold(mode: &str, name: &str) -> Result<(), queen_locks::Error> {
    let mut b = Client::builder();
    if let Ok(ns) = std::env::var("QUEEN_LOCKS_TEST_NAMESPACE") {
        if !ns.is_empty() {
            b = b.namespace(ns);
        }
    }
    let lock = b.build()?.lock(name, Duration::from_secs(30))?;
    let acquired = lock.acquire()?;
    let seen = serde_json::json!({
        "acquired": acquired,
        "owner": lock.owner(),
        "token": lock.token(),
        "reason": lock.reason(),
        "holders": lock.holders(),
    });
    println!("{}", seen);
    if acquired && mode == "hold" {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    }
    if acquired {
        lock.release()?;
    }
    Ok(())
}
