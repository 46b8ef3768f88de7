//! The handle behind `conclave_t`: a tokio runtime of its own, and a task
//! in it that owns the [`Session`] and calls [`Session::recv`] all the time
//! (so key agreement goes on while the C program does other things), takes
//! the C side's requests over a channel and queues the session's events for
//! `conclave_recv`.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conclave_gcs_net::{Client, ClientError, Identity as TlsIdentity, TlsClientOptions};
use conclave_secure::trust::{unprotect_key, Authority, Identity, TrustError};
use conclave_secure::{MemberId, Policy, SecureEvent, Session, SessionError};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use zeroize::Zeroizing;

use crate::status::{
    fail, Result, CONCLAVE_ERR_CLOSED, CONCLAVE_ERR_CONNECT, CONCLAVE_ERR_IDENTITY, CONCLAVE_ERR_INTERNAL,
    CONCLAVE_ERR_INVALID, CONCLAVE_ERR_NOT_JOINED, CONCLAVE_ERR_NO_VIEW,
};

/// What the session task delivers: a session event, or the end of the session.
pub(crate) enum Delivered {
    Event(SecureEvent),
    Closed(String),
}

type Reply<T> = oneshot::Sender<std::result::Result<T, SessionError>>;

/// What the C side asks of the session task.
enum Request {
    Join(String, Policy, Reply<()>),
    Send(String, Vec<u8>, Reply<()>),
    Leave(String, Reply<()>),
    Members(String, oneshot::Sender<Membership>),
}

/// What `conclave_read_membership` finds.
pub(crate) enum Membership {
    NotJoined,
    NoView,
    Members(Vec<MemberId>),
}

/// The state behind a `conclave_t`.
pub struct Handle {
    // Dropped after `requests` (field order): the task ends first.
    requests: mpsc::UnboundedSender<Request>,
    events: Mutex<mpsc::UnboundedReceiver<Delivered>>,
    rt: Option<Runtime>,
}

/// Where the daemon is (see `conclave_init`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
    Tls(String),
}

impl Endpoint {
    pub(crate) fn parse(s: &str) -> Result<Endpoint> {
        let bad = |why: &str| {
            fail(
                CONCLAVE_ERR_INVALID,
                format!(
                    "bad daemon endpoint {s:?}: {why} (expected a Unix socket path, unix:PATH, tcp:HOST:PORT, \
                     IP:PORT or tls:HOST:PORT)"
                ),
            )
        };
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad("no path"));
            }
            return Ok(Endpoint::Unix(path.into()));
        }
        for (scheme, make) in [("tcp:", Endpoint::Tcp as fn(String) -> Endpoint), ("tls:", Endpoint::Tls)] {
            if let Some(addr) = s.strip_prefix(scheme) {
                match addr.rsplit_once(':') {
                    Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                        return Ok(make(addr.to_owned()))
                    }
                    _ => return Err(bad("no HOST:PORT")),
                }
            }
        }
        if s.parse::<SocketAddr>().is_ok() {
            return Ok(Endpoint::Tcp(s.to_owned()));
        }
        if s.is_empty() {
            return Err(bad("empty"));
        }
        Ok(Endpoint::Unix(s.into()))
    }
}

/// The host part of HOST:PORT, without the brackets of an IPv6 address.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// A member's files in a key directory of `conclave keys` (see
/// `crates/conclave/src/keys.rs`): `authority.crt`, `authority.crl`
/// (optional), `members/NAME.crt`, `members/NAME.key`.
pub(crate) struct KeyFiles {
    ca_cert: PathBuf,
    crl: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl KeyFiles {
    pub(crate) fn new(dir: &Path, name: &str) -> Result<KeyFiles> {
        if name.is_empty() || name.starts_with('.') || name.contains('/') {
            return Err(fail(CONCLAVE_ERR_INVALID, format!("member name {name:?} cannot name a key file")));
        }
        let members = dir.join("members");
        Ok(KeyFiles {
            ca_cert: dir.join("authority.crt"),
            crl: dir.join("authority.crl"),
            cert: members.join(format!("{name}.crt")),
            key: members.join(format!("{name}.key")),
        })
    }

    /// The authority (with its CRL, if the directory has one).
    pub(crate) fn authority(&self) -> Result<Authority> {
        let cert = read_key_file(&self.ca_cert, false)?.ok_or_else(|| missing(&self.ca_cert))?;
        let crl = read_key_file(&self.crl, false)?;
        Authority::from_pem(&cert, crl.as_deref().map(|s| s.as_str()))
            .map_err(|e| fail(CONCLAVE_ERR_IDENTITY, format!("bad authority {}: {e}", self.ca_cert.display())))
    }

    /// The member's secret key as plain PKCS#8 PEM, opened with
    /// `passphrase` if `conclave keys issue --member-passphrase` protected it.
    fn secret_key(&self, passphrase: Option<&[u8]>) -> Result<Zeroizing<String>> {
        let key = read_key_file(&self.key, true)?.ok_or_else(|| missing(&self.key))?;
        unprotect_key(&key, passphrase).map_err(|e| {
            let msg = match e {
                TrustError::PassphraseNeeded => format!(
                    "secret key {} is protected by a passphrase: open it with conclave_init_protected",
                    self.key.display()
                ),
                TrustError::WrongPassphrase => {
                    format!("the passphrase does not open secret key {}", self.key.display())
                }
                e => format!("bad secret key {}: {e}", self.key.display()),
            };
            fail(CONCLAVE_ERR_IDENTITY, msg)
        })
    }

    /// The member's identity (certificate and secret key), checked to be
    /// `name`'s, and its secret key's plain PEM (for a TLS connection).
    pub(crate) fn identity(&self, name: &str, passphrase: Option<&[u8]>) -> Result<(Identity, Zeroizing<String>)> {
        let cert = read_key_file(&self.cert, false)?.ok_or_else(|| missing(&self.cert))?;
        let key = self.secret_key(passphrase)?;
        let id = Identity::from_pem(&cert, &key)
            .map_err(|e| fail(CONCLAVE_ERR_IDENTITY, format!("bad identity {}: {e}", self.cert.display())))?;
        if id.name() != name {
            let msg = format!("{} is issued to {:?}, not {name:?}", self.cert.display(), id.name());
            return Err(fail(CONCLAVE_ERR_IDENTITY, msg));
        }
        Ok((id, key))
    }

    /// TLS options that trust the authority for the daemon's certificate
    /// and show the member's certificate with its (opened) `key_pem`.
    fn tls_options(&self, key_pem: &str) -> Result<TlsClientOptions> {
        let id = TlsIdentity::from_cert_file_and_key_pem(&self.cert, key_pem.as_bytes(), &self.key)
            .map_err(|e| fail(CONCLAVE_ERR_IDENTITY, format!("cannot set up TLS: {e}")))?;
        TlsClientOptions::with_identity(&self.ca_cert, id)
            .map_err(|e| fail(CONCLAVE_ERR_IDENTITY, format!("cannot set up TLS: {e}")))
    }
}

fn missing(path: &Path) -> crate::status::Failure {
    fail(
        CONCLAVE_ERR_IDENTITY,
        format!(
            "cannot read {}: no such file (create the authority and the member's certificate with `conclave keys`)",
            path.display()
        ),
    )
}

/// Reads a key directory file, never through a symbolic link; `None` if
/// there is none. A `secret` file that group or others may read is refused.
fn read_key_file(path: &Path, secret: bool) -> Result<Option<Zeroizing<String>>> {
    let err = |e: std::io::Error| fail(CONCLAVE_ERR_IDENTITY, format!("cannot read {}: {e}", path.display()));
    let mut f = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            let msg = format!("{} is a symbolic link; refusing it (key files must be regular files)", path.display());
            return Err(fail(CONCLAVE_ERR_IDENTITY, msg));
        }
        Err(e) => return Err(err(e)),
    };
    let meta = f.metadata().map_err(err)?;
    if !meta.is_file() {
        return Err(fail(CONCLAVE_ERR_IDENTITY, format!("{} is not a regular file", path.display())));
    }
    let mode = meta.permissions().mode();
    if secret && mode & 0o077 != 0 {
        let msg = format!(
            "secret key {} is accessible by group or others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        );
        return Err(fail(CONCLAVE_ERR_IDENTITY, msg));
    }
    let mut text = Zeroizing::new(String::new());
    f.read_to_string(&mut text).map_err(err)?;
    Ok(Some(text))
}

/// Blocks SIGPIPE in the calling thread (each of the runtime's threads).
///
/// A C program, unlike a Rust one, usually leaves SIGPIPE's default action
/// (terminate) in place, and a write to a connection the daemon has closed
/// raises it where the write does not ask otherwise (rustls writes TLS
/// records with `writev`, which cannot). Blocked in the threads that do the
/// writing, the signal stays pending there and the write fails with EPIPE,
/// which ends the session (`CONCLAVE_EVENT_CLOSED`) instead of the process.
/// The process's signal dispositions are left alone.
fn block_sigpipe() {
    // SAFETY: plain libc calls on a local, initialised signal set; changes
    // only this thread's signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Connects as `name`, with an error that says where to.
/// `tls` is set for a TLS endpoint.
async fn connect(endpoint: &Endpoint, name: &str, tls: Option<TlsClientOptions>) -> Result<Client> {
    let (what, r) = match (endpoint, tls) {
        (Endpoint::Unix(path), _) => {
            (format!("unix socket {}", path.display()), Client::connect_unix(path, name).await)
        }
        (Endpoint::Tcp(addr), _) => (format!("tcp {addr}"), Client::connect_tcp(addr.as_str(), name).await),
        (Endpoint::Tls(addr), Some(options)) => {
            let r = Client::connect_tls(addr.as_str(), host_of(addr), &options, name).await;
            (format!("tls {addr}"), r)
        }
        (Endpoint::Tls(_), None) => return Err(fail(CONCLAVE_ERR_INTERNAL, "TLS endpoint without TLS options")),
    };
    r.map_err(|e| {
        let msg = match e {
            ClientError::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
                format!("cannot connect to the daemon at {what}: no such socket (is `conclave daemon` running?)")
            }
            ClientError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                format!("cannot connect to the daemon at {what}: connection refused (is `conclave daemon` running?)")
            }
            e => format!("cannot connect to the daemon at {what} as {name:?}: {e}"),
        };
        fail(CONCLAVE_ERR_CONNECT, msg)
    })
}

/// Refuses a call made from inside a tokio runtime (only a Rust caller
/// can), where blocking on the handle's runtime would panic.
fn outside_runtime() -> Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Err(fail(
            CONCLAVE_ERR_INVALID,
            "called from inside a tokio runtime: the C API blocks; call it from a thread of your own",
        )),
        Err(_) => Ok(()),
    }
}

impl Handle {
    /// Loads `name`'s identity (its secret key opened with `passphrase` if
    /// protected) and the authority from `keys_dir`, connects to the daemon
    /// at `endpoint` and starts the session task.
    pub(crate) fn open(endpoint: &str, name: &str, keys_dir: &str, passphrase: Option<&[u8]>) -> Result<Handle> {
        outside_runtime()?;
        let me = MemberId::new(name).map_err(|e| fail(CONCLAVE_ERR_INVALID, format!("bad member name: {e}")))?;
        let endpoint = Endpoint::parse(endpoint)?;
        let keys = KeyFiles::new(Path::new(keys_dir), name)?;
        let (identity, key_pem) = keys.identity(name, passphrase)?;
        let authority = Arc::new(keys.authority()?);
        let tls = match endpoint {
            Endpoint::Tls(_) => Some(keys.tls_options(&key_pem)?),
            _ => None,
        };
        drop(key_pem);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("conclave-capi")
            .on_thread_start(block_sigpipe)
            .enable_all()
            .build()
            .map_err(|e| fail(CONCLAVE_ERR_INTERNAL, format!("cannot start the library's runtime: {e}")))?;
        let (requests, requests_rx) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::unbounded_channel();
        // Connected in a task, not on the caller's thread: all socket I/O
        // happens on the runtime's threads, where SIGPIPE is blocked.
        let name = name.to_owned();
        let started = rt.spawn(async move {
            let client = connect(&endpoint, &name, tls).await?;
            let session = Session::connect_certified(client, me, identity, authority);
            tokio::spawn(drive(session, requests_rx, events_tx));
            Ok::<_, crate::status::Failure>(())
        });
        rt.block_on(started).map_err(|e| fail(CONCLAVE_ERR_INTERNAL, format!("connecting failed: {e}")))??;
        Ok(Handle { requests, events: Mutex::new(events), rt: Some(rt) })
    }

    fn runtime(&self) -> &Runtime {
        self.rt.as_ref().expect("the runtime lives as long as the handle")
    }

    /// Sends a request and waits for its answer.
    fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Request) -> Result<T> {
        outside_runtime()?;
        let (tx, rx) = oneshot::channel();
        let closed = || fail(CONCLAVE_ERR_CLOSED, "the session has ended (the connection to the daemon is gone)");
        self.requests.send(make(tx)).map_err(|_| closed())?;
        self.runtime().block_on(rx).map_err(|_| closed())
    }

    pub(crate) fn join(&self, group: &str, policy: Policy) -> Result<()> {
        Ok(self.ask(|r| Request::Join(group.to_owned(), policy, r))??)
    }

    pub(crate) fn send(&self, group: &str, data: &[u8]) -> Result<()> {
        Ok(self.ask(|r| Request::Send(group.to_owned(), data.to_vec(), r))??)
    }

    pub(crate) fn leave(&self, group: &str) -> Result<()> {
        Ok(self.ask(|r| Request::Leave(group.to_owned(), r))??)
    }

    pub(crate) fn members(&self, group: &str) -> Result<Vec<MemberId>> {
        match self.ask(|r| Request::Members(group.to_owned(), r))? {
            Membership::Members(m) => Ok(m),
            Membership::NotJoined => Err(fail(CONCLAVE_ERR_NOT_JOINED, format!("not joined to group {group}"))),
            Membership::NoView => Err(fail(
                CONCLAVE_ERR_NO_VIEW,
                format!("group {group} has no secure view yet (its key is being agreed)"),
            )),
        }
    }

    /// The next delivery, waiting up to `timeout` (forever if `None`);
    /// `Ok(None)` on timeout.
    pub(crate) fn recv(&self, timeout: Option<Duration>) -> Result<Option<Delivered>> {
        outside_runtime()?;
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let next = self.runtime().block_on(async {
            match timeout {
                Some(t) => tokio::time::timeout(t, events.recv()).await.ok(),
                None => Some(events.recv().await),
            }
        });
        match next {
            None => Ok(None),
            Some(Some(d)) => Ok(Some(d)),
            Some(None) => Err(fail(CONCLAVE_ERR_CLOSED, "the session has ended; nothing more will come")),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Ends the session task (its request channel closes), which drops
        // the session and with it the connection.
        let (closed, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.requests, closed));
        if let Some(rt) = self.rt.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                // Inside a runtime (a Rust caller) a runtime cannot wait.
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(Duration::from_secs(1));
            }
        }
    }
}

/// The session task: answers requests, runs the session, queues its events.
async fn drive(
    mut session: Session,
    mut requests: mpsc::UnboundedReceiver<Request>,
    events: mpsc::UnboundedSender<Delivered>,
) {
    let mut events = Some(events);
    // Groups joined, with the members of their last secure view.
    let mut groups: BTreeMap<String, Option<Vec<MemberId>>> = BTreeMap::new();
    loop {
        tokio::select! {
            request = requests.recv() => {
                let Some(request) = request else { return };
                let live = events.is_some();
                let closed = || Err(SessionError::Closed);
                match request {
                    Request::Join(group, policy, reply) => {
                        let r = if live { session.join(&group, policy) } else { closed() };
                        if r.is_ok() {
                            groups.insert(group, None);
                        }
                        let _ = reply.send(r);
                    }
                    Request::Send(group, data, reply) => {
                        let _ = reply.send(if live { session.send(&group, &data) } else { closed() });
                    }
                    Request::Leave(group, reply) => {
                        let _ = reply.send(if live { session.leave(&group) } else { closed() });
                    }
                    Request::Members(group, reply) => {
                        let m = match groups.get(&group) {
                            None => Membership::NotJoined,
                            Some(None) => Membership::NoView,
                            Some(Some(m)) => Membership::Members(m.clone()),
                        };
                        let _ = reply.send(m);
                    }
                }
            }
            ev = session.recv(), if events.is_some() => {
                let delivered = match ev {
                    Ok(ev) => {
                        match &ev {
                            SecureEvent::View(v) => {
                                groups.insert(v.group.as_str().to_owned(), Some(v.members.to_vec()));
                            }
                            SecureEvent::Left { group } => {
                                groups.remove(group.as_str());
                            }
                            _ => {}
                        }
                        Delivered::Event(ev)
                    }
                    Err(e) => {
                        groups.clear();
                        Delivered::Closed(e.to_string())
                    }
                };
                let closed = matches!(delivered, Delivered::Closed(_));
                if let Some(tx) = &events {
                    let _ = tx.send(delivered);
                }
                if closed {
                    // After the last event, `conclave_recv` says CLOSED.
                    events = None;
                }
            }
        }
    }
}
