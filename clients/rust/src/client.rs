//! The client: where the route is and how to reach it. It makes handles.

use std::env;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::handle::Handle;
use crate::input::validate_name;
use crate::route::Route;
use crate::wire::Holder;

/// The route's URL when none is given.
pub const URL_ENV: &str = "QUEEN_LOCKS_URL";
/// The token file when none is given.
pub const TOKEN_FILE_ENV: &str = "QUEEN_LOCKS_TOKEN_FILE";
/// The CA file when none is given (the CLI's name for it too).
pub const CA_FILE_ENV: &str = "QUEEN_LOCKS_CA_FILE";

/// Makes handles over the route. Cheap to clone; clones share one
/// connection setup.
#[derive(Clone)]
pub struct Client {
    route: Arc<Route>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.route.url)
            .field("namespace", &self.route.namespace)
            .finish()
    }
}

/// Sets up a [`Client`]; what is not set comes from the environment.
#[derive(Debug, Clone, Default)]
pub struct ClientBuilder {
    url: Option<String>,
    namespace: Option<String>,
    token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
}

impl ClientBuilder {
    /// The route, like `http://queen-locks.queen-locks.svc:6632` (a URL
    /// that names only a server gets `/api/v1/locks`). Default:
    /// `$QUEEN_LOCKS_URL`; one or the other is required.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The namespace to lock in. Default: the route takes the namespace of
    /// the token's ServiceAccount.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The bearer token's file, read again whenever it changes. Default:
    /// `$QUEEN_LOCKS_TOKEN_FILE`, else `/var/run/secrets/queen-locks/token`
    /// when it exists, else no token. A file given either way must exist.
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// A PEM file of the CAs that sign an https route's certificate, the
    /// only ones then trusted; read when the client is built. Default:
    /// `$QUEEN_LOCKS_CA_FILE`, else the system's CAs.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Builds the client. Fails, naming what is wrong, on a missing or bad
    /// URL or an unreadable CA file.
    pub fn build(self) -> Result<Client> {
        let url = self.url.or_else(|| from_env(URL_ENV)).ok_or_else(|| {
            crate::Error::Invalid(format!(
                "no route URL: give one with Client::builder().url(..) or set {} (for example http://localhost:6632)",
                URL_ENV
            ))
        })?;
        let token_file = self.token_file.or_else(|| from_env(TOKEN_FILE_ENV).map(PathBuf::from));
        let ca_file = self.ca_file.or_else(|| from_env(CA_FILE_ENV).map(PathBuf::from));
        let route = Route::new(&url, self.namespace, token_file, ca_file.as_deref())?;
        Ok(Client { route: Arc::new(route) })
    }
}

/// An environment variable's value; unset and empty are alike.
fn from_env(name: &str) -> Option<String> {
    env::var(name).ok().filter(|v| !v.is_empty())
}

impl Client {
    /// A client from the environment: the route at `$QUEEN_LOCKS_URL`, the
    /// token at `$QUEEN_LOCKS_TOKEN_FILE` (or the projected token's default
    /// path), the CAs at `$QUEEN_LOCKS_CA_FILE`.
    pub fn new() -> Result<Client> {
        ClientBuilder::default().build()
    }

    /// A builder, for giving the URL, namespace, token file or CA file.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The route's full URL.
    pub fn url(&self) -> &str {
        &self.route.url
    }

    /// The namespace sent with each call, if one was given.
    pub fn namespace(&self) -> Option<&str> {
        self.route.namespace.as_deref()
    }

    /// A handle on the lock `name`: one holder at a time, for `ttl` (1 s to
    /// a year), renewed in the background while held.
    pub fn lock(&self, name: &str, ttl: Duration) -> Result<Handle> {
        self.semaphore(name, 1, ttl)
    }

    /// A handle on one of `n` permits of `name` (1 to 1024).
    pub fn semaphore(&self, name: &str, n: u32, ttl: Duration) -> Result<Handle> {
        Handle::new(self.route.clone(), name, n, ttl, None)
    }

    /// Like [`semaphore`](Client::semaphore), with an owner of your own
    /// choosing instead of a minted one (1 to 256 bytes). Two handles with
    /// the same owner are the same holder to the route.
    pub fn semaphore_as(&self, name: &str, n: u32, ttl: Duration, owner: &str) -> Result<Handle> {
        Handle::new(self.route.clone(), name, n, ttl, Some(owner))
    }

    /// Who holds `name` now.
    pub fn holders(&self, name: &str) -> Result<Vec<Holder>> {
        validate_name(name)?;
        Ok(self.route.get(name)?.holders.unwrap_or_default())
    }
}
