//! What the C API tests share: a key directory laid out as `conclave keys`
//! writes it (an authority and certified members), and an embedded daemon
//! on a temporary Unix socket, in a runtime of its own (the library's calls
//! are made from the test's thread, outside any runtime).

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::ffi::{CStr, CString};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

pub mod cbuild;

use conclave::*;
use conclave_gcs_net::{ClientAuth, Daemon, DaemonConfig, Identity, TlsListen};
use conclave_secure::trust::Issuer;
use conclave_secure::MemberId;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

const DAY: Duration = Duration::from_secs(86_400);

/// A key directory with an authority that certified `names`.
pub fn key_dir(root: &Path, names: &[&str], seed: u64) -> PathBuf {
    let dir = root.join("keys");
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir.join("members")).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let now = SystemTime::now();
    let (issuer, _ca_key) = Issuer::create("test authority", now - DAY, now + DAY, &mut rng).unwrap();
    std::fs::write(dir.join("authority.crt"), issuer.ca_pem()).unwrap();
    for name in names {
        let issued = issuer.issue(&MemberId::new(*name).unwrap(), now - DAY, now + DAY, &mut rng).unwrap();
        std::fs::write(dir.join(format!("members/{name}.crt")), &issued.cert_pem).unwrap();
        let key = dir.join(format!("members/{name}.key"));
        std::fs::write(&key, issued.key_pem.as_bytes()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // A TLS certificate for a daemon on the loopback address.
    let daemon = issuer.issue_daemon(&["127.0.0.1".to_owned()], now - DAY, now + DAY, &mut rng).unwrap();
    std::fs::write(dir.join("daemon.crt"), &daemon.cert_pem).unwrap();
    std::fs::write(dir.join("daemon.key"), daemon.key_pem.as_bytes()).unwrap();
    dir
}

/// An embedded daemon on a Unix socket in a temporary directory, with a
/// key directory for `names` there too.
pub struct World {
    pub rt: tokio::runtime::Runtime,
    pub daemon: Option<Daemon>,
    pub socket: PathBuf,
    /// What `conclave_init` takes: the socket's path, or `tls:ADDR`.
    pub endpoint: String,
    pub keys: PathBuf,
    pub dir: tempfile::TempDir,
}

impl World {
    pub fn new(names: &[&str]) -> World {
        Self::start(names, false)
    }

    /// A daemon that listens on TLS only (on 127.0.0.1, a free port),
    /// certified by the key directory's authority and demanding its members'
    /// certificates; `endpoint` is `tls:127.0.0.1:PORT`.
    pub fn new_tls(names: &[&str]) -> World {
        Self::start(names, true)
    }

    fn start(names: &[&str], tls: bool) -> World {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let keys = key_dir(dir.path(), names, 7);
        let socket = dir.path().join("conclave.sock");
        let config = if tls {
            let identity = Identity::from_pem_files(&keys.join("daemon.crt"), &keys.join("daemon.key")).unwrap();
            let client_auth = Some(ClientAuth::from_pem_files(&keys.join("authority.crt"), &[]).unwrap());
            let listen = TlsListen { addr: "127.0.0.1:0".parse().unwrap(), identity, client_auth };
            DaemonConfig { unix: None, tcp: None, tls: Some(listen), ..DaemonConfig::default() }
        } else {
            DaemonConfig { unix: Some(socket.clone()), tcp: None, ..DaemonConfig::default() }
        };
        let daemon = rt.block_on(Daemon::start(config)).unwrap();
        let endpoint = match daemon.tls_addr() {
            Some(addr) => format!("tls:{addr}"),
            None => socket.to_str().unwrap().to_owned(),
        };
        World { rt, daemon: Some(daemon), socket, endpoint, keys, dir }
    }

    /// Stops the daemon (its clients see their connections close).
    pub fn stop_daemon(&mut self) {
        if let Some(d) = self.daemon.take() {
            self.rt.block_on(d.shutdown());
        }
    }

    /// `conclave_init` for `name`; panics with the library's message on failure.
    pub fn member(&self, name: &str) -> *mut conclave_t {
        let mut h = std::ptr::null_mut();
        let rc = unsafe {
            conclave_init(c(&self.endpoint).as_ptr(), c(name).as_ptr(), c(self.keys.to_str().unwrap()).as_ptr(), &mut h)
        };
        assert_eq!(rc, CONCLAVE_OK, "init {name}: {}", last_error());
        assert!(!h.is_null());
        h
    }
}

pub fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// The thread's last error message.
pub fn last_error() -> String {
    unsafe { CStr::from_ptr(conclave_last_error()) }.to_str().unwrap().to_owned()
}

/// A C string the library handed out (`None` for NULL).
pub fn string(p: *const std::ffi::c_char) -> Option<String> {
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned())
}

/// Receives until `f` accepts an event (freeing every event), within 30 s.
pub fn recv_until<T>(h: *mut conclave_t, what: &str, mut f: impl FnMut(*const conclave_event_t) -> Option<T>) -> T {
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    loop {
        assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting for {what}; saw: {seen:#?}");
        let mut ev = std::ptr::null_mut();
        let rc = unsafe { conclave_recv(h, 100, &mut ev) };
        if rc == CONCLAVE_TIMEOUT {
            assert!(ev.is_null());
            continue;
        }
        assert_eq!(rc, CONCLAVE_OK, "recv while waiting for {what}: {}", last_error());
        seen.push(string(unsafe { conclave_event_text(ev) }).unwrap());
        let found = f(ev);
        unsafe { conclave_event_free(ev) };
        if let Some(t) = found {
            return t;
        }
    }
}

/// The member names of a view event.
pub fn members_of(ev: *const conclave_event_t) -> Vec<String> {
    let n = unsafe { conclave_event_member_count(ev) };
    (0..n).map(|i| string(unsafe { conclave_event_member(ev, i) }).unwrap()).collect()
}

/// Waits for a secure view of `group` with exactly `names`.
pub fn until_view(h: *mut conclave_t, group: &str, names: &[&str]) {
    recv_until(h, &format!("view {names:?}"), |ev| {
        let is_view = unsafe { conclave_event_kind(ev) } == CONCLAVE_EVENT_VIEW;
        (is_view && string(unsafe { conclave_event_group(ev) }).as_deref() == Some(group) && members_of(ev) == names)
            .then_some(())
    })
}
