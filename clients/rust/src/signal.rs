//! The loss signal: what a holder checks or waits on to learn that its lock
//! is gone.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why a held lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostReason {
    /// The server answered a renew that the permit is no longer ours (it
    /// was deleted, expired on the server, or taken over).
    Renew,
    /// A [`check`](crate::Handle::check) of the handle's token failed.
    Guard,
    /// The lifetime passed on this machine's clock, counted from when the
    /// last renew that got through was sent, without another getting
    /// through.
    Expired,
}

impl LostReason {
    /// The reason as the other handles and the route spell it: `renew`,
    /// `guard` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::Renew => "renew",
            LostReason::Guard => "guard",
            LostReason::Expired => "expired",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Fires once when the lock of one acquisition is lost; never when it is
/// released. Cheap to clone; every clone sees the same firing.
#[derive(Clone, Default)]
pub struct Signal {
    inner: Arc<(Mutex<Option<LostReason>>, Condvar)>,
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signal").field("lost", &self.reason()).finish()
    }
}

impl Signal {
    pub(crate) fn new() -> Signal {
        Signal::default()
    }

    /// True once the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// Why the lock was lost, once it is.
    pub fn reason(&self) -> Option<LostReason> {
        *self.inner.0.lock().unwrap()
    }

    /// Blocks until the lock is lost.
    pub fn wait(&self) -> LostReason {
        let (lock, cond) = &*self.inner;
        let mut r = lock.lock().unwrap();
        loop {
            if let Some(reason) = *r {
                return reason;
            }
            r = cond.wait(r).unwrap();
        }
    }

    /// Blocks until the lock is lost or timeout passes; answers the reason
    /// if it was lost.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<LostReason> {
        let end = Instant::now().checked_add(timeout);
        let (lock, cond) = &*self.inner;
        let mut r = lock.lock().unwrap();
        loop {
            if r.is_some() {
                return *r;
            }
            let left = match end {
                Some(end) => end.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return None;
            }
            r = cond.wait_timeout(r, left).unwrap().0;
        }
    }

    /// Fires the signal; answers false when it had fired already.
    pub(crate) fn fire(&self, reason: LostReason) -> bool {
        let (lock, cond) = &*self.inner;
        let mut r = lock.lock().unwrap();
        if r.is_some() {
            return false;
        }
        *r = Some(reason);
        cond.notify_all();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_once_and_wakes_waiters() {
        let s = Signal::new();
        assert_eq!(s.wait_timeout(Duration::from_millis(10)), None);
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || s.wait())
        };
        assert!(s.fire(LostReason::Renew));
        assert!(!s.fire(LostReason::Expired));
        assert_eq!(waiter.join().unwrap(), LostReason::Renew);
        assert_eq!(s.wait_timeout(Duration::from_secs(1)), Some(LostReason::Renew));
        assert!(s.is_lost());
        assert_eq!(LostReason::Expired.to_string(), "expired");
    }
}
