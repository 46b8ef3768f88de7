//! The session: a [`SessionCore`] driven over one daemon connection.
//!
//! This is the tokio shell and nothing more: it hands the core what the
//! daemon delivers and what the application asks, with the current time,
//! sends what the core wants sent through a writer task, sleeps until the
//! core's next deadline, and draws randomness from the operating system for
//! it. [`Session::recv`] must be called for anything to happen (it is
//! cancel-safe: use it in `tokio::select!`); [`Session::join`],
//! [`Session::send`] and [`Session::leave`] never block.

use std::sync::Arc;
use std::time::{Duration, Instant};

use conclave_gcs_net::{Client, ClientSender, Service};
use conclave_gka::suite::Signer;
use conclave_gka::Directory;
use rand_core::OsRng;
use tokio::sync::mpsc;

use crate::core::{SessionCore, Transmit, WallClock};

/// Most deliveries handed to the core at once ([`SessionCore::handle_deliveries`]):
/// what has already arrived behind the one awaited, up to this many.
const LOOKAHEAD: usize = 1024;
use crate::trust::{Authority, Identity};
use crate::{MemberId, Policy, SecureEvent, SessionError};

/// The operating system's clock, for certificate validity.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> std::time::SystemTime {
        std::time::SystemTime::now()
    }
}

/// A connection to a daemon with secure groups over it. See the module doc.
pub struct Session {
    core: SessionCore,
    out: mpsc::UnboundedSender<Transmit>,
    rx: conclave_gcs_net::ClientReceiver,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.core.fmt(f)
    }
}

async fn writer(tx: ClientSender, mut rx: mpsc::UnboundedReceiver<Transmit>) {
    while let Some(t) = rx.recv().await {
        let res = match t {
            Transmit::Join { group, mode, open } => tx.join_with(group.as_str(), open, mode).await,
            Transmit::Leave(g) => tx.leave(g.as_str()).await,
            Transmit::Multicast(g, b) => tx.multicast(g.as_str(), Service::Agreed, b).await,
            Transmit::Unicast(g, to, b) => tx.unicast(g.as_str(), to.as_str(), b).await,
        };
        if let Err(e) = res {
            tracing::warn!(error = %e, "secure session: sending to the daemon failed; writer stops");
            return;
        }
    }
}

impl Session {
    fn over(client: Client, core: SessionCore) -> Session {
        let (tx, mut rx) = client.split();
        // The session keeps each view, and its engine and keys its members.
        rx.cache_names();
        let (out, out_rx) = mpsc::unbounded_channel();
        tokio::spawn(writer(tx, out_rx));
        Session { core, out, rx }
    }

    /// Wraps a connected client. `me` must be the name the client connected
    /// with; `identity` signs this member's messages and `directory` says
    /// whose messages to trust. Must be called inside a tokio runtime (it
    /// spawns the writer task).
    pub fn connect(client: Client, me: MemberId, identity: Arc<dyn Signer>, directory: Arc<dyn Directory>) -> Session {
        Self::over(client, SessionCore::new(me, identity, directory, Box::new(OsRng), Instant::now()))
    }

    /// Wraps a connected client in *certified mode*: this member presents
    /// `identity`'s certificate in every view that needs it, and takes part in
    /// key agreement only with members whose certificates `authority`
    /// accepts (see the crate doc, "Certified identities"). `me` must be the
    /// name the client connected with.
    pub fn connect_certified(client: Client, me: MemberId, identity: Identity, authority: Arc<Authority>) -> Session {
        let clock = Arc::new(SystemClock);
        let core = SessionCore::new_certified(me, identity, authority, clock, Box::new(OsRng), Instant::now());
        Self::over(client, core)
    }

    /// Certified mode: how long a view waits for a member's certificate
    /// before it is refused for presenting none (default 10 s).
    pub fn set_certificate_timeout(&mut self, timeout: Duration) {
        self.core.set_certificate_timeout(timeout);
    }

    /// Connects to a daemon's Unix socket as `name`, then [`Session::connect`].
    pub async fn connect_unix(
        path: impl AsRef<std::path::Path>,
        name: &str,
        identity: Arc<dyn Signer>,
        directory: Arc<dyn Directory>,
    ) -> Result<Session, SessionError> {
        let me = MemberId::new(name)?;
        let client = Client::connect_unix(path, name).await?;
        Ok(Self::connect(client, me, identity, directory))
    }

    /// This member.
    pub fn me(&self) -> &MemberId {
        self.core.me()
    }

    /// Joins `group` with `policy` (see [`SessionCore::join`]).
    pub fn join(&mut self, group: &str, policy: Policy) -> Result<(), SessionError> {
        let res = self.core.join(Instant::now(), group, policy);
        self.flush()?;
        res
    }

    /// Sends `data` to the group (see [`SessionCore::send`]: what is sent
    /// while this member's own messages travel goes out when [`Session::recv`]
    /// has one of them back).
    pub fn send(&mut self, group: &str, data: &[u8]) -> Result<(), SessionError> {
        let res = self.core.send(Instant::now(), group, data);
        self.flush()?;
        res
    }

    /// Sends `data` to an open three-step group this member is not in (see
    /// [`SessionCore::send_open`]).
    pub fn send_open(&mut self, group: &str, data: &[u8]) -> Result<(), SessionError> {
        let res = self.core.send_open(Instant::now(), group, data);
        self.flush()?;
        res
    }

    /// Leaves the group (see [`SessionCore::leave`]).
    pub fn leave(&mut self, group: &str) -> Result<(), SessionError> {
        let res = self.core.leave(Instant::now(), group);
        self.flush()?;
        res
    }

    /// See [`SessionCore::reencrypted`].
    pub fn reencrypted(&self, group: &str) -> u64 {
        self.core.reencrypted(group)
    }

    /// See [`SessionCore::dropped`].
    pub fn dropped(&self, group: &str) -> u64 {
        self.core.dropped(group)
    }

    /// See [`SessionCore::secure_members`].
    pub fn secure_members(&self, group: &str) -> Option<&crate::Members> {
        self.core.secure_members(group)
    }

    /// See [`SessionCore::waiting_members`].
    pub fn waiting_members(&self, group: &str) -> Vec<MemberId> {
        self.core.waiting_members(group)
    }

    /// See [`SessionCore::meter`].
    pub fn meter(&self, group: &str) -> Option<crate::Meter> {
        self.core.meter(group)
    }

    /// The next event. Cancel-safe: nothing is lost if the future is dropped.
    pub async fn recv(&mut self) -> Result<SecureEvent, SessionError> {
        loop {
            self.flush()?;
            if let Some(ev) = self.core.poll_event() {
                return Ok(ev);
            }
            let deadline = self.core.poll_timeout();
            tokio::select! {
                d = self.rx.recv() => {
                    // With it, whatever else has already arrived: the core
                    // skips the runs of views superseded in the batch.
                    let mut batch = vec![d?];
                    let mut failed = None;
                    while batch.len() < LOOKAHEAD {
                        match self.rx.try_recv() {
                            Ok(Some(d)) => batch.push(d),
                            Ok(None) => break,
                            Err(e) => {
                                failed = Some(e);
                                break;
                            }
                        }
                    }
                    self.core.handle_deliveries(Instant::now(), batch)?;
                    if let Some(e) = failed {
                        return Err(e.into());
                    }
                }
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now).into()), if deadline.is_some() => {
                    self.core.handle_timeout(Instant::now())?;
                }
            }
        }
    }

    /// Hands the writer what the core wants sent.
    fn flush(&mut self) -> Result<(), SessionError> {
        while let Some(t) = self.core.poll_transmit() {
            self.out.send(t).map_err(|_| SessionError::Closed)?;
        }
        Ok(())
    }
}

#[cfg(feature = "test-hooks")]
impl Session {
    /// Test hook: see [`SessionCore::epoch_keys`].
    pub fn epoch_keys(&self, group: &str) -> Option<crate::EpochKeys> {
        self.core.epoch_keys(group)
    }

    /// Test hook: see [`SessionCore::captured`].
    pub fn captured(&self, group: &str) -> Vec<(MemberId, bytes::Bytes)> {
        self.core.captured(group)
    }

    /// Test hook: see [`SessionCore::send_raw_data`].
    pub fn send_raw_data(&mut self, group: &str, raw: &[u8]) -> Result<(), SessionError> {
        self.core.send_raw_data(group, raw)?;
        self.flush()
    }

    /// Test hook: see [`SessionCore::send_raw`].
    pub fn send_raw(&mut self, group: &str, payload: &[u8]) -> Result<(), SessionError> {
        self.core.send_raw(group, payload)?;
        self.flush()
    }

    /// Test hook: see [`SessionCore::cert_message`].
    pub fn cert_message(&self, group: &str, view: crate::ViewId) -> Option<Vec<u8>> {
        self.core.cert_message(group, view)
    }

    /// Test hook: see [`SessionCore::timeout_message`].
    pub fn timeout_message(&self, group: &str, view: crate::ViewId, names: &[MemberId]) -> Option<Vec<u8>> {
        self.core.timeout_message(group, view, names)
    }

    /// Test hook: see [`SessionCore::tamper_key_agreement`].
    pub fn tamper_key_agreement(
        &mut self,
        group: &str,
        rewrite: impl FnMut(u8, &mut Vec<u8>) -> bool + Send + 'static,
    ) -> Result<(), SessionError> {
        self.core.tamper_key_agreement(group, rewrite)
    }
}
