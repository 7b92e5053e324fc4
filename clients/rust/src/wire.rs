//! The route's JSON: what one operation answers.

use serde::{Deserialize, Serialize};

/// One holder of a lock, as the route lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub slot: u32,
    pub owner: String,
    pub token: u64,
    /// When this holding began, by the server's clock (RFC 3339).
    #[serde(default)]
    pub since: String,
    #[serde(default)]
    pub renewed_at: String,
    #[serde(default)]
    pub expires_at: String,
}

/// The guard object of an acquire or renew answer: the check that fences a
/// write with the current token. Inside Kubernetes, a guarded object's
/// write carries [`Guard::annotation`] as the annotation
/// `locks.queen.dev/guard`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Guard {
    pub op: String,
    pub ns: String,
    pub namespace: String,
    /// `<lock>#<slot>`.
    pub key: String,
    /// The token the permit must still have.
    pub expect: u64,
    pub required: bool,
}

impl Guard {
    /// The value of the `locks.queen.dev/guard` annotation:
    /// `<lock>#<slot>=<token>`.
    pub fn annotation(&self) -> String {
        format!("{}={}", self.key, self.expect)
    }
}

/// One operation's result. Every field is optional: which ones come depends
/// on the operation and its outcome.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Answer {
    pub acquired: Option<bool>,
    pub renewed: Option<bool>,
    pub released: Option<bool>,
    pub ok: Option<bool>,
    #[serde(default)]
    pub already: bool,
    pub slot: Option<u32>,
    pub token: Option<u64>,
    pub expires_at: Option<String>,
    pub reason: Option<String>,
    pub holders: Option<Vec<Holder>>,
    pub guard: Option<Guard>,
}

#[derive(Deserialize)]
pub(crate) struct Results {
    pub results: Vec<Answer>,
}

#[derive(Deserialize)]
pub(crate) struct Refusal {
    pub error: RefusalError,
}

#[derive(Deserialize)]
pub(crate) struct RefusalError {
    #[serde(default)]
    pub message: String,
    pub field: Option<String>,
    pub index: Option<usize>,
}
