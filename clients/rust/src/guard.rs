//! The label and annotation that fence a Kubernetes write with a handle's
//! current token (docs/fencing.md).

use std::collections::BTreeMap;

use crate::handle::Handle;

/// The label that opts a Kubernetes object in to fencing.
pub const GUARDED_LABEL: &str = "locks.queen.dev/guarded";
/// The annotation each write to a guarded object carries:
/// `<lock>#<slot>=<token>`.
pub const GUARD_ANNOTATION: &str = "locks.queen.dev/guard";

/// Labels and annotations to merge into an object's metadata, as
/// `Handle::guard_metadata` answers them. The maps are the types kube-rs
/// uses for `ObjectMeta::labels` and `ObjectMeta::annotations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardMetadata {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl Handle {
    /// The label and annotation that fence a Kubernetes write with the
    /// current token; None while nothing is held. Call it for each write,
    /// right before sending: every renew changes the token.
    pub fn guard_metadata(&self) -> Option<GuardMetadata> {
        let state = self.inner.state();
        let lease = state.lease.as_ref().filter(|l| l.held)?;
        Some(GuardMetadata {
            labels: BTreeMap::from([(GUARDED_LABEL.to_string(), "true".to_string())]),
            annotations: BTreeMap::from([(
                GUARD_ANNOTATION.to_string(),
                format!("{}#{}={}", self.inner.name, lease.slot, lease.token),
            )]),
        })
    }
}
