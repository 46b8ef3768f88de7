//! What the daemon's socket tests share: a daemon on a Unix socket in a
//! temporary directory and on loopback TCP, connections to it, and a bound
//! on every wait so that a test fails instead of hanging.
// Each test binary uses some of these helpers, not all.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use conclave_gcs_net::{Client, Daemon, DaemonConfig};
use tokio::net::UnixStream;

pub struct Setup {
    pub daemon: Daemon,
    _dir: tempfile::TempDir,
}

/// A daemon on `conclave.sock` in a new temporary directory and on
/// 127.0.0.1 (a free port), with `tune` applied to its configuration.
pub async fn start(tune: impl FnOnce(&mut DaemonConfig)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DaemonConfig {
        unix: Some(dir.path().join("conclave.sock")),
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        ..DaemonConfig::default()
    };
    tune(&mut config);
    Setup { daemon: Daemon::start(config).await.unwrap(), _dir: dir }
}

impl Setup {
    pub async fn unix(&self, name: &str) -> Client {
        within("connect", Client::connect_unix(self.daemon.unix_path().unwrap(), name)).await.unwrap()
    }

    pub async fn tcp(&self, name: &str) -> Client {
        within("connect", Client::connect_tcp(self.daemon.tcp_addr().unwrap(), name)).await.unwrap()
    }

    /// A Unix connection that has said nothing yet.
    pub async fn raw(&self) -> UnixStream {
        UnixStream::connect(self.daemon.unix_path().unwrap()).await.unwrap()
    }
}

/// Fails the test instead of hanging it.
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}
