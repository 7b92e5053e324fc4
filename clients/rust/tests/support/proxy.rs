//! A loopback TCP proxy in front of the route, optionally serving https.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// delay holds back each piece of a request before passing it on (so the
/// server admits a write later than the client sent it); set_drop(n) makes
/// the next n calls lose their answer (the request reaches the route, the
/// client sees the connection close); cut() stops it for good. seen() is
/// everything the clients sent.
pub struct Proxy {
    pub url: String,
    shared: Arc<Shared>,
}

struct Shared {
    addr: SocketAddr,
    target: SocketAddr,
    delay: Duration,
    tls: Option<native_tls::TlsAcceptor>,
    drop: AtomicUsize,
    calls: AtomicUsize,
    cut: AtomicBool,
    socks: Mutex<HashMap<usize, [TcpStream; 2]>>,
    seen: Mutex<Vec<u8>>,
}

impl Proxy {
    pub fn new(target: &str) -> Proxy {
        Proxy::start(target, Duration::ZERO, None)
    }

    pub fn slow(target: &str, delay: Duration) -> Proxy {
        Proxy::start(target, delay, None)
    }

    /// An https proxy with the certificate and PKCS #8 key in these PEM files.
    pub fn tls(target: &str, cert: &str, key: &str) -> Proxy {
        let id = native_tls::Identity::from_pkcs8(&std::fs::read(cert).unwrap(), &std::fs::read(key).unwrap())
            .expect("reading the proxy's certificate");
        Proxy::start(target, Duration::ZERO, Some(native_tls::TlsAcceptor::new(id).unwrap()))
    }

    fn start(target: &str, delay: Duration, tls: Option<native_tls::TlsAcceptor>) -> Proxy {
        let u = url::Url::parse(target).expect("the route's URL");
        let target = (u.host_str().unwrap(), u.port_or_known_default().unwrap())
            .to_socket_addrs()
            .unwrap()
            .next()
            .unwrap();
        let ln = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = ln.local_addr().unwrap();
        let mut mine = u.clone();
        mine.set_scheme(if tls.is_some() { "https" } else { "http" }).unwrap();
        mine.set_host(Some("127.0.0.1")).unwrap();
        mine.set_port(Some(addr.port())).unwrap();
        let shared = Arc::new(Shared {
            addr,
            target,
            delay,
            tls,
            drop: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
            cut: AtomicBool::new(false),
            socks: Mutex::new(HashMap::new()),
            seen: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        thread::spawn(move || s.accept(ln));
        Proxy {
            url: mine.into(),
            shared,
        }
    }

    pub fn set_drop(&self, n: usize) {
        self.shared.drop.store(n, Ordering::SeqCst);
    }

    pub fn calls(&self) -> usize {
        self.shared.calls.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> String {
        String::from_utf8_lossy(&self.shared.seen.lock().unwrap()).into_owned()
    }

    /// Stops answering for good: open connections close, new ones are
    /// refused.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        for pair in self.shared.socks.lock().unwrap().values() {
            for s in pair {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        // Wake the accept loop, which then closes the listener.
        let _ = TcpStream::connect(self.shared.addr);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

impl Shared {
    fn accept(self: Arc<Self>, ln: TcpListener) {
        for c in ln.incoming() {
            if self.cut.load(Ordering::SeqCst) {
                return;
            }
            let c = match c {
                Ok(c) => c,
                Err(_) => continue,
            };
            self.calls.fetch_add(1, Ordering::SeqCst);
            let drop = self
                .drop
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            let s = self.clone();
            let id = self.calls.load(Ordering::SeqCst);
            thread::spawn(move || s.serve(id, c, drop));
        }
    }

    fn serve(&self, id: usize, c: TcpStream, drop: bool) {
        let s = match TcpStream::connect(self.target) {
            Ok(s) => s,
            Err(_) => return,
        };
        let pair = [c.try_clone().unwrap(), s.try_clone().unwrap()];
        self.socks.lock().unwrap().insert(id, pair);
        self.pass(c, s, drop);
        // The clones kept for cut() hold the sockets open: close them here.
        if let Some(pair) = self.socks.lock().unwrap().remove(&id) {
            for s in &pair {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    fn pass(&self, c: TcpStream, s: TcpStream, drop: bool) {
        let raw = c.try_clone().unwrap();
        let mut client: Box<dyn Stream> = match &self.tls {
            Some(acceptor) => match acceptor.accept(c) {
                Ok(t) => Box::new(t),
                Err(_) => return, // a refused handshake
            },
            None => Box::new(c),
        };
        // One thread moves both directions, polling each side briefly: a
        // TLS stream cannot be read and written from two threads.
        let tick = Some(Duration::from_millis(5));
        let _ = raw.set_read_timeout(tick);
        let _ = s.set_read_timeout(tick);
        let mut server = s;
        let mut buf = vec![0u8; 64 << 10];
        while !self.cut.load(Ordering::SeqCst) {
            match client.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    self.seen.lock().unwrap().extend_from_slice(&buf[..n]);
                    thread::sleep(self.delay);
                    if server.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return,
            }
            match server.read(&mut buf) {
                Ok(0) => return,
                // A dropped answer: the client sees the connection close.
                Ok(_) if drop => return,
                Ok(n) => {
                    if client.write_all(&buf[..n]).and_then(|_| client.flush()).is_err() {
                        return;
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return,
            }
        }
    }
}
