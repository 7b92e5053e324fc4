//! Locks and semaphores with fencing tokens for Kubernetes workloads, over
//! the queen-locks route (`POST /api/v1/locks`).
//!
//! ```no_run
//! use std::time::Duration;
//! use queen_locks::Client;
//!
//! # fn main() -> Result<(), queen_locks::Error> {
//! // $QUEEN_LOCKS_URL, the projected token at $QUEEN_LOCKS_TOKEN_FILE
//! let client = Client::new()?;
//! let lock = client.lock("daily-report", Duration::from_secs(30))?;
//! lock.on_lost(|reason| eprintln!("lost the lock: {}", reason));
//! let ran = lock.run(
//!     |lost| {
//!         // Check `lost` between steps; fence each write with the token.
//!         if !lost.is_lost() {
//!             println!("writing with fence {:?}", lock.token());
//!         }
//!     },
//!     Duration::from_secs(10),
//! )?;
//! if ran.is_none() {
//!     println!("held elsewhere: {:?}", lock.holders());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A handle renews its permit from a thread of its own every third of the
//! lifetime, counts the lifetime on this machine's monotonic clock from when
//! each renew was sent (so it gives up before the server does), and tells
//! of a loss through its [`Signal`] and [`Handle::on_lost`].

mod client;
mod error;
mod guard;
mod handle;
mod input;
mod renew;
mod route;
mod signal;
mod wire;

pub use client::{Client, ClientBuilder, CA_FILE_ENV, TOKEN_FILE_ENV, URL_ENV};
pub use error::{Error, Result};
pub use guard::{GuardMetadata, GUARDED_LABEL, GUARD_ANNOTATION};
pub use handle::Handle;
pub use input::{mint_owner, validate_name, MAX_LIMIT, MAX_NAME_BYTES, MAX_OWNER_BYTES, MAX_TTL_SECONDS};
pub use route::{DEFAULT_TOKEN_FILE, MAX_WAIT_SECONDS, ROUTE_PATH};
pub use signal::{LostReason, Signal};
pub use wire::{Guard, Holder};
