//! The errors of the crate. Bad arguments are refused before any call is
//! made, with an error that names what is wrong.

use std::fmt;

/// What went wrong with a call or an argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// An argument is not valid (a lock name, a lifetime, a URL, a file):
    /// nothing was sent.
    Invalid(String),
    /// The route refused the call with an answer other than 200: nothing of
    /// it was applied. `field` and `index` name what was wrong when the
    /// route says.
    Route {
        code: u16,
        message: String,
        field: Option<String>,
        index: Option<usize>,
    },
    /// The route did not answer (connection error, timeout, 502, 503, 504,
    /// 429). The call may or may not have been applied; the same call again
    /// with the same owner converges, and a handle keeps its owner, so
    /// trying again is safe.
    Unavailable(String),
    /// The route's TLS certificate is not trusted (give the CA file that
    /// signs it). Asking again will not help.
    Untrusted(String),
    /// The server says the permit is no longer ours: it expired, was
    /// deleted by hand, or was taken over.
    Lost { name: String, reason: String },
    /// The route answered something this crate does not understand.
    Protocol(String),
}

impl Error {
    /// True when the call got no answer and may be tried again.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(m) => write!(f, "{}", m),
            Error::Route { code, message, .. } => write!(f, "the route answered {}: {}", code, message),
            Error::Unavailable(m) => write!(f, "{}", m),
            Error::Untrusted(m) => write!(f, "{}", m),
            Error::Lost { name, reason } => write!(f, "lock {:?} was lost ({})", name, reason),
            Error::Protocol(m) => write!(f, "{}", m),
        }
    }
}

impl std::error::Error for Error {}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
