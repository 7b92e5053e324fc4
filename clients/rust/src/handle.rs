//! Handles: one holder's lock or semaphore permit, renewed in the
//! background until it is released or lost.

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::error::{Error, Result};
use crate::input::{jitter, parse_time, ttl_seconds, validate_limit, validate_name, validate_owner};
use crate::route::{Route, CALL_TIMEOUT, MAX_WAIT_SECONDS};
use crate::signal::{LostReason, Signal};
use crate::wire::{Answer, Guard, Holder};

// Polling between tries when the route cannot wait for us: 100 ms doubling
// to 1 s.
const POLL_FIRST: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(1);
// A release that gets no answer is retried for at most this long.
const RELEASE_RETRY: Duration = Duration::from_secs(10);
// How often acquire asks again when a permit the route says is already
// ours is lost before it could be renewed.
const ALREADY_TRIES: usize = 3;

type LostCallback = Arc<dyn Fn(LostReason) + Send + Sync>;
type RenewCallback = Arc<dyn Fn(u64) + Send + Sync>;

/// One holder's view of a lock or a semaphore permit. Every method takes
/// `&self` and may be called from any thread; acquire and release run one
/// at a time. Dropping a handle releases what it holds.
pub struct Handle {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub route: Arc<Route>,
    pub name: String,
    pub limit: u32,
    pub ttl: Duration,
    pub ttl_seconds: u64,
    pub owner: String,
    /// One acquire or release at a time.
    op: Mutex<()>,
    pub state: Mutex<State>,
    /// Wakes the renew and watch threads, and checks waiting for a renew.
    pub cond: Condvar,
    pub on_lost: Mutex<Vec<LostCallback>>,
    pub on_renew: Mutex<Vec<RenewCallback>>,
    renewer: Mutex<Option<thread::JoinHandle<()>>>,
}

#[derive(Default)]
pub(crate) struct State {
    pub lease: Option<Lease>,
    next_id: u64,
    /// An acquire or release got no answer: the route may hold a permit of
    /// ours whose slot and token we never learnt.
    unsure: bool,
    pub reason: Option<String>,
    holders: Vec<Holder>,
    pub signal: Signal,
}

/// One acquisition: what the server last answered about our permit.
pub(crate) struct Lease {
    pub id: u64,
    pub slot: u32,
    pub token: u64,
    /// When we must assume the permit is gone, on the monotonic clock,
    /// counted from when the call that won or renewed it was sent.
    pub deadline: Instant,
    pub expires_at: Option<SystemTime>,
    pub guard: Option<Guard>,
    pub held: bool,
    /// Set to end the renew and watch threads.
    pub stop: bool,
    /// Renews sent so far, and whether one is in flight.
    pub renew_seq: u64,
    pub renewing: bool,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("name", &self.inner.name)
            .field("limit", &self.inner.limit)
            .field("owner", &self.inner.owner)
            .field("held", &self.held())
            .field("token", &self.token())
            .finish()
    }
}

impl Handle {
    pub(crate) fn new(route: Arc<Route>, name: &str, limit: u32, ttl: Duration, owner: Option<&str>) -> Result<Handle> {
        validate_name(name)?;
        validate_limit(limit)?;
        let ttl_seconds = ttl_seconds(ttl)?;
        if let Some(o) = owner {
            validate_owner(o)?;
        }
        Ok(Handle {
            inner: Arc::new(Inner {
                route,
                name: name.to_string(),
                limit,
                ttl,
                ttl_seconds,
                owner: owner.map_or_else(crate::input::mint_owner, str::to_string),
                op: Mutex::new(()),
                state: Mutex::new(State::default()),
                cond: Condvar::new(),
                on_lost: Mutex::new(Vec::new()),
                on_renew: Mutex::new(Vec::new()),
                renewer: Mutex::new(None),
            }),
        })
    }

    // What the handle is.

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The number of permits: 1 for a lock.
    pub fn limit(&self) -> u32 {
        self.inner.limit
    }

    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The owner the route knows this handle by: `host:pid:random`.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    // What it holds. Read the token when you use it: every renew changes it.

    /// True while the permit is held (not lost, not released).
    pub fn held(&self) -> bool {
        self.inner.state().lease.as_ref().map_or(false, |l| l.held)
    }

    /// The current fencing token; None before the first acquire.
    pub fn token(&self) -> Option<u64> {
        self.inner.state().lease.as_ref().map(|l| l.token)
    }

    /// The permit's slot: always 0 for a lock; None before the first acquire.
    pub fn slot(&self) -> Option<u32> {
        self.inner.state().lease.as_ref().map(|l| l.slot)
    }

    /// When the server will count the permit expired, by its clock, as of
    /// the last answer.
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.inner.state().lease.as_ref().and_then(|l| l.expires_at)
    }

    /// The guard object of the last acquire or renew answer; None before
    /// the first acquire.
    pub fn guard(&self) -> Option<Guard> {
        self.inner.state().lease.as_ref().and_then(|l| l.guard.clone())
    }

    /// Why the last acquire failed (`held`, `contended`, `quota`) or why the
    /// lock was lost (`renew`, `guard`, `expired`).
    pub fn reason(&self) -> Option<String> {
        self.inner.state().reason.clone()
    }

    /// Who held the lock when the last acquire answered `held`.
    pub fn holders(&self) -> Vec<Holder> {
        self.inner.state().holders.clone()
    }

    /// The loss signal of the current (or, before any acquire, the next)
    /// acquisition. It fires when the lock is lost, not when it is
    /// released; a new acquire after a loss makes a new one.
    pub fn signal(&self) -> Signal {
        self.inner.state().signal.clone()
    }

    /// Calls `callback(reason)` whenever a held lock is lost. It runs on
    /// the handle's own thread: keep it short.
    pub fn on_lost(&self, callback: impl Fn(LostReason) + Send + Sync + 'static) {
        self.inner.on_lost.lock().unwrap().push(Arc::new(callback));
    }

    /// Calls `callback(token)` after each renew that got through.
    pub fn on_renew(&self, callback: impl Fn(u64) + Send + Sync + 'static) {
        self.inner.on_renew.lock().unwrap().push(Arc::new(callback));
    }

    // Acquire and release.

    /// One try: takes a free permit, or answers false when all are held
    /// ([`reason`](Handle::reason) and [`holders`](Handle::holders) say
    /// more). True at once when it is already held.
    ///
    /// When the route did not answer it fails with
    /// [`Error::Unavailable`]; calling acquire again is safe (the handle
    /// keeps its owner, so one that did land comes back as ours), and so is
    /// [`release`](Handle::release), which frees whatever it may have taken.
    pub fn acquire(&self) -> Result<bool> {
        self.acquire_wait(Duration::ZERO)
    }

    /// Takes a permit, waiting up to `wait` for one to free: the route
    /// waits for us and is woken when one frees. A call that got no answer
    /// is retried within the wait with the same owner.
    pub fn acquire_wait(&self, wait: Duration) -> Result<bool> {
        let _op = self.inner.op.lock().unwrap();
        if self.held() {
            return Ok(true);
        }
        let give_up = Instant::now()
            .checked_add(wait)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(MAX_YEAR));
        let mut poll = POLL_FIRST;
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            let (waited, failure) = match self.inner.try_once(self.inner.wait_seconds(left)) {
                Ok((true, _)) => return Ok(true),
                Ok((false, waited)) => (waited, None),
                Err(e) if e.is_unavailable() => (false, Some(e)),
                Err(e) => return Err(e),
            };
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return failure.map_or(Ok(false), Err);
            }
            if waited {
                // The route waited for us and no slot freed (or another
                // waiter took it first): ask again at once.
                poll = POLL_FIRST;
                continue;
            }
            thread::sleep(jitter(poll, left));
            poll = std::cmp::min(poll * 2, POLL_MAX);
        }
    }

    /// Stops renewing and releases the permit; nothing to do when nothing
    /// is held. Fails with [`Error::Lost`] when the server says it was no
    /// longer ours, and with [`Error::Unavailable`] when the route did not
    /// answer for a while (the permit then ends with its lifetime).
    pub fn release(&self) -> Result<()> {
        let _op = self.inner.op.lock().unwrap();
        self.inner.release()
    }

    /// Asks the server whether the handle's token is still the permit's
    /// (the route's `check`). When it is not, the lock is lost with reason
    /// [`LostReason::Guard`]. False when nothing is held.
    pub fn check(&self) -> Result<bool> {
        self.inner.check()
    }

    // Running something under the lock.

    /// Acquires (waiting up to `wait`), calls `f` with the loss signal, and
    /// releases after, whatever `f` did (a panic too, which then goes on).
    /// Answers `Ok(None)`, without calling `f`, when the lock could not be
    /// had in time. `f` should watch the signal and fence what it commits
    /// with [`token`](Handle::token).
    ///
    /// A release after `f` that the route does not answer is not an error
    /// here: the permit ends with its lifetime, and
    /// [`release`](Handle::release) may be called again.
    pub fn run<T>(&self, f: impl FnOnce(&Signal) -> T, wait: Duration) -> Result<Option<T>> {
        match self.acquire_wait(wait) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) => {
                if e.is_unavailable() {
                    // Free whatever an unanswered acquire may have taken.
                    let _ = self.release();
                }
                return Err(e);
            }
        }
        let signal = self.signal();
        let out = panic::catch_unwind(AssertUnwindSafe(|| f(&signal)));
        // Lost: the work has ended, and on_lost has told whoever listens.
        let _ = self.release();
        match out {
            Ok(v) => Ok(Some(v)),
            Err(p) => panic::resume_unwind(p),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Ends the background threads too, which hold the inner state.
        let _ = self.release();
    }
}

const MAX_YEAR: u64 = 365 * 24 * 3600;

impl Inner {
    pub fn state(&self) -> MutexGuard<'_, State> {
        // A panicking callback never runs under this lock, so poisoning
        // cannot leave it half-written.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long one acquire call may wait at the route: whole seconds, at
    /// most 60, and at most a third of the lifetime, so the lifetime we
    /// count from when the call was sent still has two thirds left when the
    /// answer comes; 0 means poll.
    fn wait_seconds(&self, left: Duration) -> u64 {
        if !self.route.takes_wait() {
            return 0;
        }
        left.as_secs().min(MAX_WAIT_SECONDS).min(self.ttl.as_secs() / 3)
    }

    /// One acquire call. Answers (won, the call waited at the route).
    fn try_once(self: &Arc<Self>, wait_seconds: u64) -> Result<(bool, bool)> {
        for _ in 0..ALREADY_TRIES {
            let sent = Instant::now();
            let (r, asked) = self
                .route
                .acquire(&self.name, &self.owner, self.ttl_seconds, self.limit, wait_seconds)
                .map_err(|e| self.unsure_if_unanswered(e))?;
            let took = sent.elapsed();
            if r.acquired != Some(true) {
                // The route answers already, not held, to an owner that
                // holds a permit: this one holds none.
                let mut st = self.state();
                st.reason = r.reason.clone();
                st.holders = r.holders.clone().unwrap_or_default();
                st.unsure = false;
                return Ok((false, asked > 0 && took >= Duration::from_secs(asked)));
            }
            let (slot, token) = slot_and_token(&r)?;
            if !r.already {
                self.start(slot, token, sent, &r);
                return Ok((true, false));
            }
            // The permit was already ours: an earlier acquire whose answer
            // was lost, or a release that did not get through. Its lifetime
            // was counted from a write we may never have seen, and expiresAt
            // is the server's wall clock, which ours cannot be compared
            // with. So renew it at once and count from when that was sent.
            let sent = Instant::now();
            let rn = self
                .route
                .renew(&self.name, slot, token, &self.owner, self.ttl_seconds, CALL_TIMEOUT)
                .map_err(|e| self.unsure_if_unanswered(e))?;
            if rn.renewed == Some(true) {
                let token = rn
                    .token
                    .ok_or_else(|| Error::Protocol("a renew answered no token".into()))?;
                self.start(slot, token, sent, &rn);
                return Ok((true, false));
            }
            // It expired or was deleted between the two answers: ask again.
        }
        Err(Error::Protocol(format!(
            "acquiring {:?}: a permit the route said was ours was lost {} times before it could be renewed",
            self.name, ALREADY_TRIES
        )))
    }

    fn unsure_if_unanswered(&self, e: Error) -> Error {
        if e.is_unavailable() {
            self.state().unsure = true;
        }
        e
    }

    /// Records a won permit, its deadline counted from `sent`, and starts
    /// renewing and watching it.
    fn start(self: &Arc<Self>, slot: u32, token: u64, sent: Instant, answer: &Answer) {
        let id = {
            let mut st = self.state();
            st.next_id += 1;
            if st.signal.is_lost() {
                st.signal = Signal::new();
            }
            st.lease = Some(Lease {
                id: st.next_id,
                slot,
                token,
                deadline: sent + self.ttl,
                expires_at: answer.expires_at.as_deref().and_then(parse_time),
                guard: answer.guard.clone(),
                held: true,
                stop: false,
                renew_seq: 0,
                renewing: false,
            });
            st.reason = None;
            st.holders.clear();
            st.unsure = false;
            st.next_id
        };
        let (me, me2) = (self.clone(), self.clone());
        let renewer = thread::Builder::new()
            .name(format!("queen-locks renew {}", self.name))
            .spawn(move || me.renew_loop(id))
            .expect("starting the renew thread");
        thread::Builder::new()
            .name(format!("queen-locks watch {}", self.name))
            .spawn(move || me2.watch(id))
            .expect("starting the watch thread");
        *self.renewer.lock().unwrap() = Some(renewer);
    }

    fn release(&self) -> Result<()> {
        let (holding, unsure) = {
            let mut st = self.state();
            let unsure = st.unsure;
            let holding = match st.lease.as_mut() {
                Some(l) if l.held => {
                    l.stop = true;
                    true
                }
                _ => false,
            };
            self.cond.notify_all();
            (holding, unsure)
        };
        if !holding {
            return if unsure { self.release_unsure() } else { Ok(()) };
        }
        // Wait for an in-flight renew to land or fail, so the token we
        // release with is the newest. Not from the renew thread itself (an
        // on_lost callback may release).
        if let Some(r) = self.renewer.lock().unwrap().take() {
            if r.thread().id() != thread::current().id() {
                let _ = r.join();
            }
        }
        let (slot, token, give_up) = {
            let mut st = self.state();
            let l = match st.lease.as_mut() {
                Some(l) if l.held => l,
                _ => return Ok(()), // lost while we waited
            };
            l.held = false;
            let give_up = std::cmp::min(l.deadline, Instant::now() + RELEASE_RETRY);
            (l.slot, l.token, give_up)
        };
        let (mut poll, mut unanswered) = (POLL_FIRST, false);
        let r = loop {
            let left = give_up.saturating_duration_since(Instant::now());
            match self.route.release(
                &self.name,
                slot,
                token,
                &self.owner,
                left.clamp(Duration::from_millis(100), CALL_TIMEOUT),
            ) {
                Ok(r) => break r,
                Err(e) if e.is_unavailable() => {
                    let left = give_up.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        self.state().unsure = true;
                        return Err(e);
                    }
                    unanswered = true;
                    thread::sleep(jitter(poll, left));
                    poll = std::cmp::min(poll * 2, POLL_MAX);
                }
                Err(e) => return Err(e),
            }
        };
        // After a release whose answer was lost, "lost" may mean that one
        // landed.
        if r.released != Some(true) && !unanswered {
            return Err(Error::Lost {
                name: self.name.clone(),
                reason: r.reason.unwrap_or_else(|| "lost".into()),
            });
        }
        Ok(())
    }

    /// Releases the permits of our owner that an unanswered call may have
    /// left: we never learnt their slot and token, so ask the route.
    fn release_unsure(&self) -> Result<()> {
        for h in self.route.get(&self.name)?.holders.unwrap_or_default() {
            if h.owner == self.owner {
                // Not ours any more is as good as released here.
                self.route
                    .release(&self.name, h.slot, h.token, &self.owner, CALL_TIMEOUT)?;
            }
        }
        self.state().unsure = false;
        Ok(())
    }

    fn check(&self) -> Result<bool> {
        loop {
            let (id, slot, token, seq, inflight) = match self.state().lease.as_ref() {
                Some(l) if l.held => (l.id, l.slot, l.token, l.renew_seq, l.renewing),
                _ => return Ok(false),
            };
            if self.route.check(&self.name, slot, token)?.ok == Some(true) {
                return Ok(true);
            }
            // Only a check of the token the lease still has counts. A renew
            // that overlapped the check may have moved the permit to a new
            // token before we recorded it: wait for its answer and check
            // the token it leaves.
            let mut st = self.state();
            let l = match st.lease.as_ref() {
                Some(l) if l.held && l.id == id => l,
                _ => return Ok(false), // released or lost meanwhile
            };
            let overlapped = inflight || l.renew_seq != seq || l.token != token;
            if !overlapped {
                drop(st);
                self.lose(id, LostReason::Guard, Some(token));
                return Ok(false);
            }
            while st.lease.as_ref().map_or(false, |l| l.id == id && l.renewing) {
                st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

fn slot_and_token(r: &Answer) -> Result<(u32, u64)> {
    match r.token {
        Some(t) => Ok((r.slot.unwrap_or(0), t)),
        None => Err(Error::Protocol("an acquire that won answered no token".into())),
    }
}
