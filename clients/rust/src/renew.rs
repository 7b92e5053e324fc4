//! The background of a held permit: a thread that renews it every third of
//! the lifetime, and one that gives it up on the local clock when no renew
//! got through in time.

use std::cmp::{max, min};
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crate::handle::Inner;
use crate::input::parse_time;
use crate::signal::LostReason;

/// What one renew came to.
enum Renewed {
    /// It got through: the new deadline.
    Until(Instant),
    /// No answer (or one we cannot act on): try again soon.
    Unanswered,
    /// The lease is over (lost, or being released): stop.
    Over,
}

impl Inner {
    pub(crate) fn renew_loop(&self, id: u64) {
        let interval = self.ttl / 3;
        let retry = max(self.ttl / 10, Duration::from_millis(100));
        // Renew when two thirds of the lifetime we count are left.
        let mut next_at = match self.state().lease.as_ref() {
            Some(l) => l.deadline - 2 * interval,
            None => return,
        };
        loop {
            let (slot, token, deadline) = {
                let mut st = self.state();
                loop {
                    let l = match st.lease.as_ref() {
                        Some(l) if l.id == id && l.held && !l.stop => l,
                        _ => return,
                    };
                    let now = Instant::now();
                    if now >= l.deadline {
                        return; // the watch thread counts it lost
                    }
                    let at = min(next_at, l.deadline);
                    if now >= at {
                        break;
                    }
                    st = self
                        .cond
                        .wait_timeout(st, at - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                let l = st.lease.as_mut().unwrap();
                l.renew_seq += 1;
                l.renewing = true;
                (l.slot, l.token, l.deadline)
            };
            let outcome = self.renew_once(id, slot, token, deadline);
            {
                let mut st = self.state();
                if let Some(l) = st.lease.as_mut().filter(|l| l.id == id) {
                    l.renewing = false;
                }
                self.cond.notify_all();
            }
            next_at = match outcome {
                // After a renew that got through, when two thirds of the new
                // lifetime are left; after one that did not, soon, until
                // the deadline.
                Renewed::Until(d) => d - 2 * interval,
                Renewed::Unanswered => Instant::now() + retry,
                Renewed::Over => return,
            };
        }
    }

    /// Sends one renew, always with the token of the newest answer, and
    /// records what it answers.
    fn renew_once(&self, id: u64, slot: u32, token: u64, deadline: Instant) -> Renewed {
        let sent = Instant::now();
        let timeout = max(deadline.saturating_duration_since(sent), Duration::from_millis(50));
        let r = match self
            .route
            .renew(&self.name, slot, token, &self.owner, self.ttl_seconds, timeout)
        {
            Ok(r) => r,
            // No answer, or one we cannot act on (a token file being
            // rotated, say): keep trying, with the same token, until the
            // deadline. The route carries a stale token of ours through.
            Err(_) => return Renewed::Unanswered,
        };
        if r.renewed != Some(true) {
            self.lose(id, LostReason::Renew, None);
            return Renewed::Over;
        }
        if Instant::now() >= deadline {
            // It landed, but we learnt it only after our deadline: by then
            // we had to assume the permit gone, and we keep to that.
            self.lose(id, LostReason::Expired, None);
            return Renewed::Over;
        }
        let new_token = match r.token {
            Some(t) => t,
            None => return Renewed::Unanswered,
        };
        let (until, stopping) = {
            let mut st = self.state();
            let l = match st.lease.as_mut() {
                Some(l) if l.id == id && l.held => l,
                _ => return Renewed::Over,
            };
            // Never go back to an older token than one already answered.
            if new_token >= l.token {
                l.token = new_token;
                if r.guard.is_some() {
                    l.guard = r.guard.clone();
                }
                if let Some(t) = r.expires_at.as_deref().and_then(parse_time) {
                    l.expires_at = Some(t);
                }
            }
            l.deadline = max(l.deadline, sent + self.ttl);
            let out = (l.deadline, l.stop);
            self.cond.notify_all();
            out
        };
        let callbacks = self.on_renew.lock().unwrap().clone();
        for cb in callbacks {
            // A callback that panics must not end the renewing.
            let _ = panic::catch_unwind(AssertUnwindSafe(|| cb(new_token)));
        }
        if stopping {
            // release is waiting for us: the token is recorded.
            return Renewed::Over;
        }
        Renewed::Until(until)
    }

    /// Waits until the deadline passes without a renew moving it, then
    /// counts the permit lost.
    pub(crate) fn watch(&self, id: u64) {
        let mut st = self.state();
        loop {
            let l = match st.lease.as_ref() {
                Some(l) if l.id == id && l.held && !l.stop => l,
                _ => return,
            };
            let left = l.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self.cond.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(st);
        self.lose(id, LostReason::Expired, None);
    }

    /// Marks the lease lost, once, and tells whoever listens; with a token,
    /// only while the lease still has that token.
    pub(crate) fn lose(&self, id: u64, reason: LostReason, token: Option<u64>) {
        let signal = {
            let mut st = self.state();
            match st.lease.as_mut() {
                Some(l) if l.id == id && l.held && token.map_or(true, |t| t == l.token) => {
                    l.held = false;
                    l.stop = true;
                }
                _ => return,
            }
            st.reason = Some(reason.as_str().to_string());
            self.cond.notify_all();
            st.signal.clone()
        };
        signal.fire(reason);
        let callbacks = self.on_lost.lock().unwrap().clone();
        for cb in callbacks {
            let _ = panic::catch_unwind(AssertUnwindSafe(|| cb(reason)));
        }
    }
}
