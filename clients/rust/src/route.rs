//! The route transport: one lock operation per `POST /api/v1/locks` call.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::wire::{Answer, Refusal, Results};

/// The route's path, added to a URL that names only a server.
pub const ROUTE_PATH: &str = "/api/v1/locks";
/// Where the docs mount the projected ServiceAccount token the route takes.
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/queen-locks/token";
/// The longest wait one call may carry (waitSeconds 0 to 60).
pub const MAX_WAIT_SECONDS: u64 = 60;
/// How long an ordinary call may take before it counts as unanswered.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The route's full address: a URL that names only a server gets
/// /api/v1/locks.
pub(crate) fn route_url(raw: &str) -> Result<String> {
    let mut u = url::Url::parse(raw).map_err(|e| Error::Invalid(format!("route URL {:?}: {}", raw, e)))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().map_or(true, str::is_empty) {
        return Err(Error::Invalid(format!(
            "route URL {:?}: must be http:// or https:// with a host",
            raw
        )));
    }
    if u.path().is_empty() || u.path() == "/" {
        u.set_path(ROUTE_PATH);
    }
    Ok(u.into())
}

/// What tells one version of a file from the next: device, inode, mtime,
/// size.
type Stamp = (u64, u64, Option<SystemTime>, u64);

/// A bearer token on disk, read again when the file changes (the kubelet
/// rotates projected tokens by swapping a symlink).
struct TokenFile {
    path: PathBuf,
    required: bool,
    seen: Mutex<Option<(Stamp, String)>>,
}

impl TokenFile {
    fn read(&self) -> Result<Option<String>> {
        let meta = match fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !self.required => return Ok(None),
            Err(e) => return Err(Error::Invalid(format!("token file {}: {}", self.path.display(), e))),
        };
        let stamp = file_stamp(&meta);
        let mut seen = self.seen.lock().unwrap();
        if let Some((s, token)) = seen.as_ref() {
            if *s == stamp {
                return Ok(Some(token.clone()).filter(|t| !t.is_empty()));
            }
        }
        let token = fs::read_to_string(&self.path)
            .map_err(|e| Error::Invalid(format!("token file {}: {}", self.path.display(), e)))?
            .trim()
            .to_string();
        *seen = Some((stamp, token.clone()));
        Ok(Some(token).filter(|t| !t.is_empty()))
    }
}

#[cfg(unix)]
fn file_stamp(m: &fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino(), m.modified().ok(), m.len())
}

#[cfg(not(unix))]
fn file_stamp(m: &fs::Metadata) -> Stamp {
    (0, 0, m.modified().ok(), m.len())
}

/// Calls the route. Safe for concurrent use.
pub(crate) struct Route {
    pub url: String,
    pub namespace: Option<String>,
    token: TokenFile,
    agent: ureq::Agent,
    // Until the route refuses waitSeconds, assume it takes it; once it has,
    // stop sending it and poll instead.
    takes_wait: AtomicBool,
}

impl Route {
    pub fn new(
        url: &str,
        namespace: Option<String>,
        token_file: Option<PathBuf>,
        ca_file: Option<&Path>,
    ) -> Result<Route> {
        let url = route_url(url)?;
        let (path, required) = match token_file {
            Some(p) => (p, true),
            None => (PathBuf::from(DEFAULT_TOKEN_FILE), false),
        };
        let mut tls = native_tls::TlsConnector::builder();
        if let Some(ca) = ca_file {
            // Only the given CAs: a route with a private CA is trusted for
            // what that CA signs, not for what any public CA does.
            tls.disable_built_in_roots(true);
            for cert in read_ca_file(ca)? {
                tls.add_root_certificate(cert);
            }
        }
        let tls = tls
            .build()
            .map_err(|e| Error::Invalid(format!("setting up TLS: {}", e)))?;
        let agent = ureq::AgentBuilder::new()
            .tls_connector(Arc::new(tls))
            // A new connection for each call: the route closes idle ones
            // after a minute, and a POST that meets a closed pooled
            // connection fails with no way to tell whether it was applied.
            .max_idle_connections(0)
            .redirects(0)
            .user_agent(concat!("queen-locks-rust/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Route {
            url,
            namespace: namespace.filter(|n| !n.is_empty()),
            token: TokenFile {
                path,
                required,
                seen: Mutex::new(None),
            },
            agent,
            takes_wait: AtomicBool::new(true),
        })
    }

    pub fn takes_wait(&self) -> bool {
        self.takes_wait.load(Ordering::Relaxed)
    }

    /// Sends one operation and answers its result.
    pub fn call(&self, op: Value, timeout: Duration) -> Result<Answer> {
        let what = format!("{} {}", op["op"].as_str().unwrap_or("?"), op["name"]);
        let mut body = json!({ "operations": [op] });
        if let Some(ns) = &self.namespace {
            body["namespace"] = json!(ns);
        }
        let mut req = self
            .agent
            .post(&self.url)
            .timeout(std::cmp::max(timeout, Duration::from_millis(50)))
            .set("Content-Type", "application/json")
            .set("Accept", "application/json");
        if let Some(token) = self.token.read()? {
            req = req.set("Authorization", &format!("Bearer {}", token));
        }
        let resp = match req.send_string(&body.to_string()) {
            Ok(resp) => resp,
            Err(ureq::Error::Status(code, resp)) => return Err(refusal(code, &read_body(resp)?)),
            Err(ureq::Error::Transport(t)) => return Err(self.transport_error(&what, t)),
        };
        let raw = read_body(resp).map_err(|e| match e {
            Error::Unavailable(m) => Error::Unavailable(format!("{}: {}", what, m)),
            e => e,
        })?;
        let mut results: Results = serde_json::from_str(&raw).map_err(|e| {
            Error::Protocol(format!(
                "the route answered something that is not JSON results ({}): {:.200}",
                e, raw
            ))
        })?;
        if results.results.len() != 1 {
            return Err(Error::Protocol(format!(
                "the route answered {} results to one operation",
                results.results.len()
            )));
        }
        Ok(results.results.remove(0))
    }

    fn transport_error(&self, what: &str, t: ureq::Transport) -> Error {
        let text = chain(&t);
        if t.kind() == ureq::ErrorKind::ConnectionFailed && text.contains("native_tls") && text.contains("certificate")
        {
            return Error::Untrusted(format!(
                "{}: {}: the route's certificate is not trusted (give the CA file that signs it): {}",
                what, self.url, text
            ));
        }
        if t.kind() == ureq::ErrorKind::InvalidUrl || t.kind() == ureq::ErrorKind::UnknownScheme {
            return Error::Invalid(format!("{}: {}: {}", what, self.url, text));
        }
        Error::Unavailable(format!("{}: no answer from {}: {}", what, self.url, text))
    }

    /// An acquire; with wait_seconds > 0, the route waits that long for a
    /// free slot. Answers the result and how long the route was asked to wait.
    pub fn acquire(&self, name: &str, owner: &str, ttl: u64, limit: u32, wait_seconds: u64) -> Result<(Answer, u64)> {
        let mut op = json!({"op": "acquire", "name": name, "ttlSeconds": ttl, "owner": owner, "limit": limit});
        if wait_seconds > 0 && self.takes_wait() {
            op["waitSeconds"] = json!(wait_seconds);
            match self.call(op.clone(), CALL_TIMEOUT + Duration::from_secs(wait_seconds)) {
                // A route from before waitSeconds refuses the field whole
                // (400, nothing applied): remember it and ask without.
                Err(Error::Route {
                    code: 400,
                    field: Some(f),
                    ..
                }) if f == "waitSeconds" => {
                    self.takes_wait.store(false, Ordering::Relaxed);
                    op.as_object_mut().unwrap().remove("waitSeconds");
                }
                r => return r.map(|a| (a, wait_seconds)),
            }
        }
        self.call(op, CALL_TIMEOUT).map(|a| (a, 0))
    }

    pub fn renew(&self, name: &str, slot: u32, token: u64, owner: &str, ttl: u64, timeout: Duration) -> Result<Answer> {
        self.call(
            json!({"op": "renew", "name": name, "slot": slot, "token": token, "owner": owner, "ttlSeconds": ttl}),
            timeout,
        )
    }

    pub fn release(&self, name: &str, slot: u32, token: u64, owner: &str, timeout: Duration) -> Result<Answer> {
        self.call(
            json!({"op": "release", "name": name, "slot": slot, "token": token, "owner": owner}),
            timeout,
        )
    }

    pub fn get(&self, name: &str) -> Result<Answer> {
        self.call(json!({"op": "get", "name": name}), CALL_TIMEOUT)
    }

    pub fn check(&self, name: &str, slot: u32, expect: u64) -> Result<Answer> {
        self.call(
            json!({"op": "check", "name": name, "slot": slot, "expect": expect}),
            CALL_TIMEOUT,
        )
    }
}

fn read_ca_file(path: &Path) -> Result<Vec<native_tls::Certificate>> {
    let pem = fs::read(path).map_err(|e| Error::Invalid(format!("CA file {}: {}", path.display(), e)))?;
    // native-tls reads one certificate from PEM: split a bundle first.
    let text = String::from_utf8_lossy(&pem);
    let mut certs = Vec::new();
    for block in text.split("-----BEGIN CERTIFICATE-----").skip(1) {
        let end = block
            .find("-----END CERTIFICATE-----")
            .ok_or_else(|| Error::Invalid(format!("CA file {}: a certificate has no END line", path.display())))?;
        let one = format!(
            "-----BEGIN CERTIFICATE-----{}-----END CERTIFICATE-----\n",
            &block[..end]
        );
        certs.push(
            native_tls::Certificate::from_pem(one.as_bytes())
                .map_err(|e| Error::Invalid(format!("CA file {}: {}", path.display(), e)))?,
        );
    }
    if certs.is_empty() {
        return Err(Error::Invalid(format!(
            "CA file {}: holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// Answers of a proxy or the route when the call may or may not have been
/// applied (502, 503, 504), or was not applied and may simply be sent again
/// (429, the route's bound on concurrent calls): all are "no answer".
fn refusal(code: u16, raw: &str) -> Error {
    let (message, field, index) = match serde_json::from_str::<Refusal>(raw) {
        Ok(r) => (r.error.message, r.error.field, r.error.index),
        Err(_) => (raw.trim().chars().take(500).collect(), None, None),
    };
    if matches!(code, 429 | 502 | 503 | 504) {
        return Error::Unavailable(format!("the route answered {}: {}", code, message));
    }
    Error::Route {
        code,
        message,
        field,
        index,
    }
}

fn read_body(resp: ureq::Response) -> Result<String> {
    let mut raw = String::new();
    resp.into_reader()
        .take(4 << 20)
        .read_to_string(&mut raw)
        .map_err(|e| Error::Unavailable(format!("reading the route's answer: {}", e)))?;
    Ok(raw)
}

/// An error and its sources, in one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_server_gets_the_route_path() {
        assert_eq!(
            route_url("http://localhost:6632").unwrap(),
            "http://localhost:6632/api/v1/locks"
        );
        assert_eq!(
            route_url("https://q.ns.svc:6632/").unwrap(),
            "https://q.ns.svc:6632/api/v1/locks"
        );
        assert_eq!(route_url("http://h:1/custom").unwrap(), "http://h:1/custom");
        for bad in ["", "localhost:6632", "ftp://h/", "http://"] {
            let e = route_url(bad).unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{:?}: {:?}", bad, e);
            assert!(e.to_string().starts_with("route URL"), "{}", e);
        }
    }

    #[test]
    fn refusals_name_the_field_and_no_answer_is_unavailable() {
        let e = refusal(
            400,
            r#"{"error":{"code":400,"message":"ttlSeconds: bad","index":0,"field":"ttlSeconds"}}"#,
        );
        assert_eq!(
            e,
            Error::Route {
                code: 400,
                message: "ttlSeconds: bad".into(),
                field: Some("ttlSeconds".into()),
                index: Some(0)
            }
        );
        assert!(refusal(503, "webhook down").is_unavailable());
        assert!(refusal(429, "").is_unavailable());
        assert!(!refusal(403, "no").is_unavailable());
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let e = Route::new("https://h:1", None, None, Some(Path::new("no/such/ca.crt")))
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("CA file no/such/ca.crt:"), "{}", e);
    }

    #[test]
    fn a_given_token_file_must_exist_the_default_need_not() {
        let r = Route::new("http://h:1", None, Some(PathBuf::from("no/such/token")), None).unwrap();
        assert!(r
            .token
            .read()
            .unwrap_err()
            .to_string()
            .starts_with("token file no/such/token:"));
        let t = TokenFile {
            path: PathBuf::from("no/such/token"),
            required: false,
            seen: Mutex::new(None),
        };
        assert_eq!(t.read().unwrap(), None);
    }
}
