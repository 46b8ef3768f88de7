//! `conclave daemon`: the group communication daemon of `conclave-gcs-net`,
//! configured from a TOML file and the command line, run until Ctrl-C or
//! SIGTERM. It runs standalone, or as one daemon of a cluster over Corosync
//! CPG (`--backbone cluster`, in builds with the `cluster` feature).
//!
//! With client certificates (`--client-ca`), revocation must reach a running
//! daemon: it reloads the CA and the CRLs on SIGHUP and whenever one of their
//! files changes (`conclave keys revoke` rewrites `authority.crl`), and cuts
//! off connected members whose certificates the new files refuse. A CRL is
//! required unless `--no-crl` says to do without, so that a forgotten flag
//! does not silently mean "nothing is ever revoked"; one past its nextUpdate
//! is refused.
//!
//! Names are first come, first served, so with client certificates a local
//! process must not take a name a certified member could claim: the Unix
//! socket (and plain TCP) are off unless asked for, and clients without a
//! certificate may take only the names `[unix_names]` lists for their Unix
//! user.
//!
//! A configuration file looks like this (every key is optional;
//! docs/conclave.toml is a commented sample with the defaults, and
//! `--check-config FILE` checks one without starting anything):
//!
//! ```toml
//! backbone = "standalone"       # or "cluster": one daemon per corosync node
//! cpg_group = "conclave"        # the CPG group the daemons of a cluster share
//!
//! [listen]
//! unix = "/run/conclave.sock"   # or `false` for no Unix socket (off by default with client_ca)
//! tcp = "localhost:4803"        # no TCP unless given; HOST or HOST:PORT (port 4803 by default)
//!
//! [limits]
//! max_message_size = 1048576    # bytes of payload
//! groups_per_client = 1024
//! queue_depth = 4096            # frames queued per client before it is cut off
//! queue_bytes = 67108864        # bytes queued per client before it is cut off
//! hello_timeout_secs = 10       # time a new connection has to say Hello
//! frame_timeout_secs = 30       # time a client has to complete a frame it began
//! handshake_timeout_secs = 3    # time a TLS client has to complete its handshake
//! max_handshakes = 1024         # TLS handshakes under way at once (the oldest is evicted)
//! max_handshakes_per_ip = 64    # the same, per client IP address
//! max_connections = 4096        # client connections at once (lowered to fit `ulimit -n`)
//! max_connections_per_peer = 256 # the same, per client IP address or local Unix user
//! keepalive_secs = 60           # TCP keepalive: probe a quiet TCP/TLS peer after this long (0: off)
//! key_lifetime_secs = 3600      # keyed groups: renew the daemons' key after this long (default: never)
//! key_data_limit = 1073741824   # keyed groups: renew it after this many payload bytes (default: no limit)
//! evs_key_out = 8               # optimized-evs groups: view keys kept per group to re-encrypt late messages
//! evs_time_out_secs = 60        # optimized-evs groups: drop a view key no message came under for this long
//!
//! [tls]                         # no TLS unless `listen` is given
//! listen = "0.0.0.0:4804"       # HOST or HOST:PORT (port 4804 by default)
//! cert = "daemon.crt"           # PEM certificate chain, own certificate first
//! key = "daemon.key"            # PEM private key (PKCS#8)
//! client_ca = "authority.crt"   # demand client certificates issued by this CA
//! client_crl = ["authority.crl"] # and not revoked by these CRLs (reloaded when they change)
//! no_crl = false                # true: client_ca without any CRL (no revocation)
//!
//! [unix_names]                  # with client_ca: names local clients of each uid may take
//! 1000 = ["alice", "bot-*"]     # `*` stands for any run of characters
//!
//! [status]                      # who may run `conclave status` besides the daemon's user and root
//! operators = ["uid:1001"]      # uid:N, a certified name or pattern, or "*"
//!
//! [[access]]                    # group access rules: the first whose pattern matches decides
//! groups = "ops-*"              # (with rules, a group none matches is closed to everyone)
//! create = ["alice"]            # uid:N, a bound member name or pattern, or "*"
//! join = ["alice", "uid:1000"]
//! send = ["alice"]
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_gcs_net::{
    AccessPolicy, Backbone, ClientAuth, Daemon, DaemonConfig, GroupRule, Identity, TlsListen, UncertifiedNames, Who,
};
use serde::Deserialize;

use crate::logging::LogFormat;

/// Options of `conclave daemon`.
#[derive(Args, Debug)]
#[command(after_help = "The configuration file is TOML with the keys backbone (\"standalone\" or \"cluster\") and \
cpg_group, and the sections [listen] (unix = \"PATH\" or false, tcp = \"ADDR\"), [limits] (max_message_size, \
groups_per_client, queue_depth, queue_bytes, hello_timeout_secs, frame_timeout_secs, handshake_timeout_secs, \
max_handshakes, max_handshakes_per_ip, max_connections, max_connections_per_peer, keepalive_secs, key_lifetime_secs, \
key_data_limit, evs_key_out, evs_time_out_secs) and [tls] (listen = \"ADDR\", cert, key, client_ca, \
client_crl = [...], no_crl) and [unix_names] (UID = [\"NAME\", \"PATTERN-*\", ...]), [status] (operators = \
[...]: who besides the daemon's own user and root may run `conclave status`) and [[access]] rules (groups = \
\"PATTERN\", create = [...], join = [...], send = [...]); command-line options override it. Without either, the daemon listens on \
$XDG_RUNTIME_DIR/conclave.sock (without $XDG_RUNTIME_DIR, pass --unix PATH) and not on TCP.

Access rules (the daemon decides who takes part in which group): without [[access]], every client may create, \
join and send to every group. With it, the first rule whose groups pattern matches a group decides, and a group \
no rule matches is closed to everyone. Lists name clients as uid:N (a local user on the Unix socket), NAME or \
PATTERN-* (a member name the daemon has bound to an identity: a client certificate, or [unix_names]) or * \
(anyone). A refused request gets AccessDenied (error 19) and is logged; the connection goes on.

TLS: --tls-listen with --tls-cert and --tls-key serves clients over TLS (plain --tcp is meant for loopback). \
With --client-ca, every TLS client must show a certificate issued by that authority (and not revoked by a \
--client-crl), and may only connect under the member name its certificate certifies (the subject CommonName). \
A CRL is required with --client-ca (`conclave keys authority` writes authority.crl, `conclave keys revoke` \
updates it) unless --no-crl is given; one past its nextUpdate is refused. The daemon reloads --client-ca and \
--client-crl on SIGHUP and when a CRL file changes: members revoked since are disconnected at once and their \
groups see them leave. With --client-ca the Unix socket is off unless --unix PATH (or [listen] unix) asks for \
it, and clients without a certificate may take only the names [unix_names] lists for their Unix user; any \
other name, and any name over plain TCP, is refused. Files are PEM, as `conclave keys` writes them.

Addresses (--tcp, --tls-listen, [listen] tcp, [tls] listen) are HOST or HOST:PORT; host names are resolved, and \
the port defaults to 4803 for plain TCP and 4804 for TLS. The daemon warns at start when plain TCP, or TLS without \
client certificates, listens on an address other machines may reach. docs/conclave.toml is a commented sample \
configuration; --check-config FILE checks one without starting anything.

Logging goes to stderr: -v (debug) and -vv (trace) log more, -q (warnings), -qq (errors) and -qqq (nothing) \
less; RUST_LOG, when set, takes precedence (a level, or directives such as RUST_LOG=info,conclave_gcs_net=debug). \
--log-format json writes one JSON object per line. Colour only on a terminal, and never when NO_COLOR is set.")]
pub struct DaemonArgs {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Unix socket to listen on [default: $XDG_RUNTIME_DIR/conclave.sock; without $XDG_RUNTIME_DIR there is none;
    /// none with --client-ca].
    #[arg(long, value_name = "PATH", conflicts_with = "no_unix")]
    unix: Option<PathBuf>,
    /// Do not listen on a Unix socket (then --tcp is needed).
    #[arg(long)]
    no_unix: bool,
    /// TCP address to listen on: HOST or HOST:PORT, e.g. localhost, 127.0.0.1:4803 or [::1]:4803; the port defaults
    /// to 4803 and a host name is resolved (its first IPv4 address, else its first). Plain TCP is neither encrypted
    /// nor authenticated: it is meant for loopback, and the daemon warns when it listens elsewhere (off unless
    /// given).
    #[arg(long, value_name = "ADDR")]
    tcp: Option<String>,
    /// Largest message payload accepted, in bytes [default: 1048576].
    #[arg(long, value_name = "BYTES")]
    max_message_size: Option<usize>,
    /// Groups one client may be a member of at once [default: 1024].
    #[arg(long, value_name = "N")]
    groups_per_client: Option<usize>,
    /// Frames queued for one client before it is disconnected as too slow [default: 4096].
    #[arg(long, value_name = "N")]
    queue_depth: Option<usize>,
    /// Bytes queued for one client (not yet written to its socket) before it is disconnected as too slow
    /// [default: 67108864 (64 MiB)].
    #[arg(long, value_name = "BYTES")]
    queue_bytes: Option<usize>,
    /// Seconds a new connection has to say Hello [default: 10].
    #[arg(long, value_name = "SECS")]
    hello_timeout: Option<u64>,
    /// Seconds a client has to complete a frame it began sending; a client that sends nothing is never timed
    /// out [default: 30].
    #[arg(long, value_name = "SECS")]
    frame_timeout: Option<u64>,
    /// Seconds a new TLS connection has to complete its handshake [default: 3].
    #[arg(long, value_name = "SECS")]
    handshake_timeout: Option<u64>,
    /// TLS handshakes under way at once; a new connection beyond that evicts the oldest pending handshake
    /// [default: 1024].
    #[arg(long, value_name = "N")]
    max_handshakes: Option<usize>,
    /// TLS handshakes under way at once from one IP address; a new connection beyond that evicts that
    /// address's oldest pending handshake [default: 64].
    #[arg(long, value_name = "N")]
    max_handshakes_per_ip: Option<usize>,
    /// Client connections at once, before and after Hello; a new one beyond that is refused with
    /// TooManyConnections. The daemon raises its descriptor limit (ulimit -n) as far as it may and lowers this
    /// to fit, with a warning [default: 4096].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Client connections at once from one IP address (TCP, TLS) or one local Unix user (the Unix socket); a
    /// new one beyond that is refused with TooManyConnections [default: 256].
    #[arg(long, value_name = "N")]
    max_connections_per_peer: Option<usize>,
    /// TCP keepalive for TCP and TLS clients: after this many seconds without traffic the kernel probes the
    /// client, and closes the connection (freeing its name) if it does not answer three probes a quarter of that
    /// apart; quiet clients that are alive are not disturbed. 0 turns it off [default: 60].
    #[arg(long, value_name = "SECS")]
    keepalive: Option<u64>,
    /// Keyed groups (--policy integrated-vs): the daemons renew their shared key after this many seconds, and
    /// every keyed group gets a new view with a new key (time-out). Give every daemon of a cluster the same
    /// [default: never].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    key_lifetime: Option<u64>,
    /// Keyed groups: the daemons renew their shared key once keyed groups have sent this many payload bytes under
    /// it (data-out). Every daemon of a cluster must have the same [default: no limit].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    key_data_limit: Option<u64>,
    /// Optimized EVS groups (--policy optimized-evs): how many view keys of each group the daemon keeps to
    /// re-encrypt a message that arrives after its view changed (key-out); a message under an older key is
    /// reported to its receivers as lost [default: 8].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    evs_key_out: Option<u64>,
    /// Optimized EVS groups: the daemon drops a view key that no message came under for this many seconds
    /// (time-out) [default: 60].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    evs_time_out: Option<u64>,
    /// TCP address to listen on for TLS clients: HOST or HOST:PORT, e.g. localhost, 0.0.0.0 or
    /// daemon.example.org:4804; the port defaults to 4804 and a host name is resolved (its first IPv4 address, else
    /// its first). Without --client-ca, anyone who reaches it may connect under any name: warned about off loopback
    /// (off unless given).
    #[arg(long, value_name = "ADDR")]
    tls_listen: Option<String>,
    /// The daemon's certificate chain for TLS (PEM, own certificate first).
    #[arg(long, value_name = "PEM")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM, PKCS#8).
    #[arg(long, value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// Demand TLS client certificates issued by this authority (PEM CA certificate).
    #[arg(long, value_name = "PEM")]
    client_ca: Option<PathBuf>,
    /// Refuse client certificates revoked by this CRL (PEM, signed by --client-ca; repeatable). Required with
    /// --client-ca unless --no-crl; reloaded on SIGHUP and when the file changes.
    #[arg(long, value_name = "PEM")]
    client_crl: Vec<PathBuf>,
    /// Run with --client-ca but without any CRL: no certificate can be revoked until the daemon restarts.
    #[arg(long, conflicts_with = "client_crl")]
    no_crl: bool,
    /// What orders the daemon's traffic: standalone (this daemon alone) or cluster (one Corosync CPG group with
    /// the daemons of the other nodes; needs a build with `--features cluster` and corosync running on this node)
    /// [default: standalone].
    #[arg(long, value_enum, value_name = "KIND")]
    backbone: Option<BackboneKind>,
    /// The CPG group of the cluster's daemons [default: conclave].
    #[arg(long, value_name = "NAME")]
    cpg_group: Option<String>,
    /// In a cluster, key groups with the integrated architecture (`--policy integrated-vs`): this daemon's
    /// certificate of the group authority, for the member name daemon-N with N this node's daemon number (its
    /// Corosync node id; `conclave keys issue daemon-N`). The daemons agree a key among themselves, admitting only
    /// daemons whose certificates --daemon-ca and --daemon-crl accept. Without it a cluster daemon refuses keyed
    /// joins. With it, every client operation crosses to the other daemons sealed under a key derived from the
    /// daemons' key (the Three-Step architecture's server-to-server protection): a daemon that is not admitted
    /// reads none of them, and its clients' operations do not reach the others.
    #[arg(long, value_name = "PEM", requires_all = ["daemon_key", "daemon_ca", "daemon_crl"])]
    daemon_cert: Option<PathBuf>,
    /// With --daemon-cert: keep client operations in clear between the daemons (as far as Conclave goes; Corosync's
    /// own encryption still applies), though the daemons share a key. For measuring what sealing costs; every
    /// daemon of the cluster must say the same.
    #[arg(long, requires = "daemon_cert")]
    plain_backbone: bool,
    /// The secret key of --daemon-cert (PEM, PKCS#8).
    #[arg(long, value_name = "PEM", requires = "daemon_cert")]
    daemon_key: Option<PathBuf>,
    /// The group authority that certifies the daemons (PEM CA certificate; `conclave keys authority`).
    #[arg(long, value_name = "PEM", requires = "daemon_cert")]
    daemon_ca: Option<PathBuf>,
    /// The authority's CRL: daemons whose certificates it revokes are not admitted (read at start).
    #[arg(long, value_name = "PEM", requires = "daemon_cert")]
    daemon_crl: Option<PathBuf>,
    /// How the log on stderr is written: text (coloured on a terminal unless NO_COLOR is set) or json (one JSON
    /// object per line, for log collectors).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Check a configuration file (with the other options given) and exit: 0 and a summary if the daemon could
    /// start with it, 1 and what is wrong if not. Nothing is started, and no socket is touched.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
}

/// The port of `--tcp` when the address gives none.
pub const DEFAULT_TCP_PORT: u16 = 4803;
/// The port of `--tls-listen` when the address gives none.
pub const DEFAULT_TLS_PORT: u16 = 4804;

/// A listening address from the command line or the configuration file: an
/// IP address or a host name, with or without a port (`default_port` then),
/// resolved with the standard library; of a name's addresses, the first IPv4
/// one (`localhost` is 127.0.0.1 wherever the daemon runs), else the first.
pub fn resolve_listen(text: &str, default_port: u16, what: &str) -> Result<SocketAddr> {
    let text = text.trim();
    if text.is_empty() {
        bail!("{what}: the address is empty (give HOST or HOST:PORT, e.g. localhost:{default_port})");
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = text.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, default_port));
    }
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse::<u16>() {
            Ok(port) => (host, port),
            Err(_) => bail!("{what}: {port:?} in {text:?} is not a port (a number from 0 to 65535)"),
        },
        Some(_) => bail!(
            "{what}: {text:?} is not an address; write an IPv6 address with a port in brackets, e.g. [::1]:{default_port}"
        ),
        None => (text, default_port),
    };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() {
        bail!("{what}: {text:?} has no host (give e.g. localhost:{port} or 0.0.0.0:{port})");
    }
    use std::net::ToSocketAddrs;
    let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(e) => bail!("{what}: cannot resolve the host name {host:?} ({e})"),
    };
    match addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()) {
        Some(addr) => Ok(*addr),
        None => bail!("{what}: the host name {host:?} has no address"),
    }
}

/// Whether only this machine can reach a listener on `addr`.
fn loopback_only(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// The backbones `conclave daemon` can run on.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
enum BackboneKind {
    /// This daemon alone orders its clients' traffic.
    Standalone,
    /// The daemons of a Corosync cluster order their clients' traffic together.
    Cluster,
}

/// Which backbone, and for a cluster which CPG group.
#[derive(Debug)]
struct BackboneChoice {
    kind: BackboneKind,
    cpg_group: String,
}

/// The configuration file.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    backbone: Option<BackboneKind>,
    cpg_group: Option<String>,
    #[serde(default)]
    listen: Listen,
    #[serde(default)]
    limits: FileLimits,
    #[serde(default)]
    tls: FileTls,
    /// Unix user id (as a string: TOML keys are) → the names its local
    /// clients may take, with client certificates demanded.
    #[serde(default)]
    unix_names: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    status: FileStatus,
    /// `[[access]]`: group access rules, first match decides; absent: every
    /// client may create, join and send to every group.
    access: Option<Vec<FileRule>>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileStatus {
    /// Who besides the daemon's own Unix user and root may read its status.
    #[serde(default)]
    operators: Vec<String>,
}

/// One `[[access]]` rule.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct FileRule {
    groups: String,
    #[serde(default)]
    create: Vec<String>,
    #[serde(default)]
    join: Vec<String>,
    #[serde(default)]
    send: Vec<String>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileTls {
    listen: Option<String>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    #[serde(default)]
    client_crl: Vec<PathBuf>,
    #[serde(default)]
    no_crl: bool,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct Listen {
    unix: Option<UnixSetting>,
    tcp: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged, expecting = "a socket path (a string) or false")]
enum UnixSetting {
    Enabled(bool),
    Path(PathBuf),
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileLimits {
    max_message_size: Option<usize>,
    groups_per_client: Option<usize>,
    queue_depth: Option<usize>,
    queue_bytes: Option<usize>,
    hello_timeout_secs: Option<u64>,
    frame_timeout_secs: Option<u64>,
    handshake_timeout_secs: Option<u64>,
    max_handshakes: Option<usize>,
    max_handshakes_per_ip: Option<usize>,
    max_connections: Option<usize>,
    max_connections_per_peer: Option<usize>,
    keepalive_secs: Option<u64>,
    key_lifetime_secs: Option<u64>,
    key_data_limit: Option<u64>,
    evs_key_out: Option<u64>,
    evs_time_out_secs: Option<u64>,
}

/// Where the daemon listens and clients connect by default:
/// `$XDG_RUNTIME_DIR/conclave.sock`, in a directory that must be a private
/// one of this user's; without `$XDG_RUNTIME_DIR` (an absolute path) an
/// error that says to pass `--unix PATH`. Never a shared `/tmp` path.
pub fn default_socket() -> Result<PathBuf> {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(dir) => {
            crate::keys::check_private_dir(&dir, "$XDG_RUNTIME_DIR")?;
            Ok(dir.join("conclave.sock"))
        }
        None => bail!(
            "cannot choose a default socket: $XDG_RUNTIME_DIR is not set (to an absolute path); pass the socket with \
             --unix PATH, in a directory only you can write to"
        ),
    }
}

/// The daemon configuration: defaults, then the file, then the flags; the
/// backbone; and, if TLS clients must show certificates, the files those are
/// checked against.
fn build_config(args: &DaemonArgs) -> Result<(DaemonConfig, BackboneChoice, Option<TrustFiles>)> {
    let file = match args.config.as_ref().or(args.check_config.as_ref()) {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read configuration file {}", path.display()))?;
            toml::from_str::<FileConfig>(&text).with_context(|| format!("bad configuration file {}", path.display()))?
        }
        None => FileConfig::default(),
    };
    let (tls, trust) = tls_config(args, file.tls)?.unzip();
    let trust = trust.flatten();
    let unix = match (&args.unix, args.no_unix, file.listen.unix) {
        (Some(path), _, _) => Some(path.clone()),
        (None, true, _) | (None, false, Some(UnixSetting::Enabled(false))) => None,
        (None, false, Some(UnixSetting::Path(path))) => Some(path),
        (None, false, Some(UnixSetting::Enabled(true))) => Some(default_socket()?),
        // With certified names, uncertified local clients only when asked for.
        (None, false, None) if trust.is_some() => None,
        (None, false, None) => Some(default_socket()?),
    };
    let backbone = BackboneChoice {
        kind: args.backbone.or(file.backbone).unwrap_or(BackboneKind::Standalone),
        cpg_group: args.cpg_group.clone().or(file.cpg_group).unwrap_or_else(|| "conclave".to_owned()),
    };
    let tcp = match (&args.tcp, &file.listen.tcp) {
        (Some(addr), _) => Some(resolve_listen(addr, DEFAULT_TCP_PORT, "--tcp")?),
        (None, Some(addr)) => Some(resolve_listen(addr, DEFAULT_TCP_PORT, "[listen] tcp")?),
        (None, None) => None,
    };
    let mut config = DaemonConfig { unix, tcp, ..DaemonConfig::default() };
    let limits = &file.limits;
    if let Some(n) = args.max_message_size.or(limits.max_message_size) {
        config.max_payload = n;
    }
    if let Some(n) = args.groups_per_client.or(limits.groups_per_client) {
        config.max_groups_per_client = n;
    }
    if let Some(n) = args.queue_depth.or(limits.queue_depth) {
        config.queue_depth = n;
    }
    if let Some(n) = args.queue_bytes.or(limits.queue_bytes) {
        config.queue_bytes = n;
    }
    if let Some(s) = args.hello_timeout.or(limits.hello_timeout_secs) {
        config.hello_timeout = Duration::from_secs(s);
    }
    if let Some(s) = args.frame_timeout.or(limits.frame_timeout_secs) {
        config.frame_timeout = Duration::from_secs(s);
    }
    if let Some(s) = args.handshake_timeout.or(limits.handshake_timeout_secs) {
        config.handshake_timeout = Duration::from_secs(s);
    }
    if let Some(n) = args.max_handshakes.or(limits.max_handshakes) {
        config.max_handshakes = n;
    }
    if let Some(n) = args.max_handshakes_per_ip.or(limits.max_handshakes_per_ip) {
        config.max_handshakes_per_ip = n;
    }
    if let Some(n) = args.max_connections.or(limits.max_connections) {
        config.max_connections = n;
    }
    if let Some(n) = args.max_connections_per_peer.or(limits.max_connections_per_peer) {
        config.max_connections_per_peer = n;
    }
    if let Some(s) = args.keepalive.or(limits.keepalive_secs) {
        config.keepalive = (s > 0).then(|| Duration::from_secs(s));
    }
    match args.key_lifetime.or(limits.key_lifetime_secs) {
        Some(0) => bail!("[limits] key_lifetime_secs must be at least 1 (leave it out for keys that never time out)"),
        s => config.key_lifetime = s.map(Duration::from_secs),
    }
    match args.key_data_limit.or(limits.key_data_limit) {
        Some(0) => bail!("[limits] key_data_limit must be at least 1 (leave it out for no limit)"),
        b => config.key_data_limit = b,
    }
    match args.evs_key_out.or(limits.evs_key_out) {
        Some(n) if !(1..=1024).contains(&n) => bail!("[limits] evs_key_out must be 1 to 1024 (got {n})"),
        Some(n) => config.evs_key_out = n as usize,
        None => {}
    }
    match args.evs_time_out.or(limits.evs_time_out_secs) {
        Some(0) => bail!("[limits] evs_time_out_secs must be at least 1"),
        Some(s) => config.evs_time_out = Duration::from_secs(s),
        None => {}
    }
    config.tls = tls;
    check_limits(&config)?;
    config.uncertified_names = unix_names(file.unix_names, trust.is_some())?;
    config.operators = who_list(&file.status.operators, "[status] operators")?;
    config.access = match file.access {
        None => None,
        Some(rules) => Some(access_policy(rules)?),
    };
    if config.unix.is_none() && config.tcp.is_none() && config.tls.is_none() {
        bail!(
            "no listener: the Unix socket is switched off and no TCP address is given (use --tcp ADDR or --tls-listen ADDR)"
        );
    }
    Ok((config, backbone, trust))
}

/// The limits the daemon refuses at start, said with the options and keys
/// that set them (so that `--check-config` finds them too).
fn check_limits(config: &DaemonConfig) -> Result<()> {
    if config.queue_depth == 0 {
        bail!("the queue depth must be at least 1 frame (--queue-depth, [limits] queue_depth)");
    }
    if config.max_payload > 1 << 30 {
        bail!("the largest message size is 1 GiB, 1073741824 bytes (--max-message-size, [limits] max_message_size)");
    }
    let least = config.max_payload + conclave_gcs::wire::FRAME_OVERHEAD;
    if config.queue_bytes < least {
        bail!(
            "the per-client queue of {} bytes cannot hold one message of the largest size: make it at least {least} \
             bytes (--queue-bytes, [limits] queue_bytes) or lower the message size (--max-message-size, [limits] \
             max_message_size)",
            config.queue_bytes
        );
    }
    if config.max_handshakes == 0 || config.max_handshakes_per_ip == 0 {
        bail!(
            "TLS handshake limits must be at least 1 (--max-handshakes, --max-handshakes-per-ip, [limits] \
             max_handshakes, max_handshakes_per_ip)"
        );
    }
    if config.max_connections == 0 || config.max_connections_per_peer == 0 {
        bail!(
            "connection limits must be at least 1 (--max-connections, --max-connections-per-peer, [limits] \
             max_connections, max_connections_per_peer)"
        );
    }
    Ok(())
}

/// The entries of a list of clients (`*`, NAME, PATTERN-*, uid:N), said
/// where they are wrong.
fn who_list(list: &[String], what: &str) -> Result<Vec<Who>> {
    list.iter().map(|s| s.parse::<Who>().map_err(|e| anyhow::anyhow!("{what}: {e}"))).collect()
}

/// The `[[access]]` rules, checked.
fn access_policy(rules: Vec<FileRule>) -> Result<AccessPolicy> {
    let mut policy = AccessPolicy::default();
    for (i, r) in rules.into_iter().enumerate() {
        let at = |key: &str| format!("[[access]] rule {} (groups {:?}), {key}", i + 1, r.groups);
        let rule = GroupRule::new(
            &r.groups,
            who_list(&r.create, &at("create"))?,
            who_list(&r.join, &at("join"))?,
            who_list(&r.send, &at("send"))?,
        )
        .map_err(|e| anyhow::anyhow!("[[access]] rule {}: groups: {e}", i + 1))?;
        policy.rules.push(rule);
    }
    Ok(policy)
}

/// What the daemon should warn of in its access rules and operators: names
/// in them match only clients whose names the daemon binds to identities,
/// and without client certificates it binds none.
fn policy_warnings(config: &DaemonConfig, certified: bool) -> Vec<String> {
    let mut warnings = Vec::new();
    if certified {
        return warnings;
    }
    let named = |l: &[Who]| l.iter().any(|w| matches!(w, Who::Name(_)));
    if let Some(access) = &config.access {
        for (i, r) in access.rules.iter().enumerate() {
            if named(&r.create) || named(&r.join) || named(&r.send) {
                warnings.push(format!(
                    "[[access]] rule {} (groups {}) names member names, but this daemon demands no client \
                     certificates (client_ca), so it binds no name to anyone: those entries match no one; use \
                     uid:N for local users, or demand client certificates",
                    i + 1,
                    r.groups
                ));
            }
        }
    }
    if named(&config.operators) {
        warnings.push(
            "[status] operators names member names, but this daemon demands no client certificates (client_ca): \
             those entries match no one; use uid:N for local users"
                .to_owned(),
        );
    }
    warnings
}

/// The names clients without a certificate may take: any, unless the daemon
/// demands client certificates (`certified`); then those `[unix_names]` lists.
fn unix_names(table: BTreeMap<String, Vec<String>>, certified: bool) -> Result<UncertifiedNames> {
    if !certified {
        if !table.is_empty() {
            bail!(
                "[unix_names] is given but no client CA (--client-ca): without certified names any local client \
                 may take any name, so there is nothing to restrict"
            );
        }
        return Ok(UncertifiedNames::Any);
    }
    let mut names = BTreeMap::new();
    for (uid, patterns) in table {
        let Ok(n) = uid.parse::<u32>() else {
            bail!("[unix_names]: {uid:?} is not a Unix user id (a number such as 1000; `id -u` shows yours)");
        };
        names.insert(n, patterns);
    }
    Ok(UncertifiedNames::ByUid(names))
}

/// The TLS listener from the flags and the `[tls]` section, with the
/// certificates loaded, and the files of the client certificate authority if
/// it demands client certificates; `None` when TLS is not asked for.
fn tls_config(args: &DaemonArgs, file: FileTls) -> Result<Option<(TlsListen, Option<TrustFiles>)>> {
    let listen = match (&args.tls_listen, &file.listen) {
        (Some(addr), _) => Some(resolve_listen(addr, DEFAULT_TLS_PORT, "--tls-listen")?),
        (None, Some(addr)) => Some(resolve_listen(addr, DEFAULT_TLS_PORT, "[tls] listen")?),
        (None, None) => None,
    };
    let cert = args.tls_cert.clone().or(file.cert);
    let key = args.tls_key.clone().or(file.key);
    let client_ca = args.client_ca.clone().or(file.client_ca);
    let crls = if args.client_crl.is_empty() { file.client_crl } else { args.client_crl.clone() };
    let no_crl = args.no_crl || file.no_crl;
    let Some(addr) = listen else {
        if cert.is_some() || key.is_some() || client_ca.is_some() || !crls.is_empty() {
            bail!("TLS certificates are given but no TLS address to listen on (use --tls-listen ADDR)");
        }
        return Ok(None);
    };
    let (Some(cert), Some(key)) = (cert, key) else {
        bail!("TLS on {addr} needs the daemon's certificate and key (--tls-cert PEM --tls-key PEM)");
    };
    if client_ca.is_none() && !crls.is_empty() {
        bail!("a client CRL is given but no client CA (--client-ca PEM) whose revocations it lists");
    }
    if no_crl && !crls.is_empty() {
        bail!("no_crl is set and client CRLs are given too: choose one");
    }
    if client_ca.is_some() && crls.is_empty() && !no_crl {
        bail!(
            "client certificates (--client-ca) without a CRL could never be revoked: give the authority's CRL \
             (--client-crl authority.crl; `conclave keys authority` writes it and `conclave keys revoke` updates it), \
             or --no-crl to run without revocation"
        );
    }
    let identity = Identity::from_pem_files(&cert, &key).context("cannot load the daemon's TLS identity")?;
    let mut trust = client_ca.map(|ca| TrustFiles::new(ca, crls));
    let client_auth = trust.as_mut().map(TrustFiles::load).transpose()?;
    Ok(Some((TlsListen { addr, identity, client_auth }, trust)))
}

/// A week: a CRL due for its next update sooner than this is warned about.
const CRL_WARNING: Duration = Duration::from_secs(7 * 86_400);

/// How often the CA and CRL files are checked for changes.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The files client certificates are checked against, and what is known of
/// them since they were last loaded.
#[derive(Debug)]
struct TrustFiles {
    ca: PathBuf,
    crls: Vec<PathBuf>,
    /// What each file (CA first) looked like when last loaded; a change is a
    /// new file (`conclave keys revoke` renames one into place) or a rewrite.
    stamps: Vec<Option<Stamp>>,
    /// The earliest nextUpdate of the CRLs loaded.
    next_update: Option<SystemTime>,
    /// Whether the loaded CRLs' expiry has been reported.
    expiry_reported: bool,
}

/// What tells one version of a file from another.
type Stamp = (u64, Option<SystemTime>, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.ino(), meta.modified().ok(), meta.len()))
}

impl TrustFiles {
    fn new(ca: PathBuf, crls: Vec<PathBuf>) -> Self {
        Self { ca, crls, stamps: Vec::new(), next_update: None, expiry_reported: false }
    }

    fn files(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.ca).chain(&self.crls)
    }

    /// Loads the CA and the CRLs; refuses a CRL past its nextUpdate and
    /// warns of one due within a week.
    fn load(&mut self) -> Result<ClientAuth> {
        self.stamps = self.files().map(|p| stamp(p)).collect();
        let auth = ClientAuth::from_pem_files(&self.ca, &self.crls)
            .context("cannot load the client certificate authority (--client-ca, --client-crl)")?;
        self.next_update = auth.next_update().with_context(|| {
            let files: Vec<String> = self.crls.iter().map(|p| p.display().to_string()).collect();
            format!("cannot use the client CRL {}", files.join(", "))
        })?;
        self.expiry_reported = false;
        if let Some(at) = self.next_update.filter(|&at| at < SystemTime::now() + CRL_WARNING) {
            tracing::warn!(
                "the client CRL is due for its next update on {}, in less than a week: install a fresh one before \
                 then, or the daemon will refuse every certified client",
                when(at)
            );
        }
        Ok(auth)
    }

    /// Whether a file changed since it was last loaded.
    fn changed(&self) -> bool {
        self.files().map(|p| stamp(p)).ne(self.stamps.iter().copied())
    }

    /// Reports, once per load, that the loaded CRLs are past their nextUpdate.
    fn check_expiry(&mut self) {
        if let Some(at) = self.next_update.filter(|&at| at <= SystemTime::now() && !self.expiry_reported) {
            self.expiry_reported = true;
            tracing::error!(
                "the client CRL expired on {} (its nextUpdate): every new certified client is refused until a fresh \
                 CRL is installed (rewrite {} or send SIGHUP after replacing it)",
                when(at),
                self.crls.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            );
        }
    }
}

/// A time for the log, to the minute, in UTC.
fn when(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!("{} {:02}:{:02} UTC", t.date(), t.hour(), t.minute())
}

/// Reloads the client CA and CRLs into the running daemon, saying what
/// happened; a failure keeps the trust the daemon had.
async fn reload(daemon: &Daemon, trust: &mut TrustFiles, why: &str) {
    tracing::info!("{why}: reloading the client CA and CRLs");
    let auth = match trust.load() {
        Ok(auth) => auth,
        Err(e) => {
            tracing::error!("{}; the daemon keeps the client CA and CRLs it had", crate::error_text(&e));
            return;
        }
    };
    match daemon.reload_client_auth(Some(auth)).await {
        Ok(cut) if cut.is_empty() => tracing::info!("reloaded the client CA and CRLs; every client may stay"),
        Ok(cut) => {
            let names: Vec<String> = cut.iter().map(|n| n.to_string()).collect();
            tracing::info!("reloaded the client CA and CRLs; disconnected {}", names.join(", "));
        }
        Err(e) => tracing::error!("cannot use the new client CA and CRLs: {e}; the daemon keeps those it had"),
    }
}

/// Joins the backbone. Blocking: runs before the runtime starts.
#[cfg(feature = "cluster")]
fn join_backbone(choice: &BackboneChoice) -> Result<Backbone> {
    match choice.kind {
        BackboneKind::Standalone => Ok(Backbone::standalone()),
        BackboneKind::Cluster => conclave_gcs_net::cluster::join(&choice.cpg_group)
            .with_context(|| format!("cannot join the cluster (CPG group {:?})", choice.cpg_group)),
    }
}

/// Joins the backbone: only the standalone one in this build.
#[cfg(not(feature = "cluster"))]
fn join_backbone(choice: &BackboneChoice) -> Result<Backbone> {
    match choice.kind {
        BackboneKind::Standalone => Ok(Backbone::standalone()),
        BackboneKind::Cluster => bail!(
            "this conclave was built without the cluster backbone: install corosync's development libraries \
             (Debian: libcpg-dev libcfg-dev libcmap-dev libquorum-dev libvotequorum-dev libcorosync-common-dev) \
             and build with `cargo build --release -p conclave --features cluster`"
        ),
    }
}

/// Makes way for the daemon's socket at `path`: refuses a live daemon's
/// socket and any file that is not a socket, and removes a stale socket (one
/// nothing listens on: a crashed daemon's). Says whether it removed one.
fn check_socket_path(path: &Path) -> Result<bool> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(false);
    };
    if !meta.file_type().is_socket() {
        bail!(
            "{} already exists and is not a socket; remove it (rm {}) or choose another path",
            path.display(),
            path.display()
        );
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => bail!("another daemon is already listening on {}", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
            Ok(true)
        }
        Err(e) => bail!(
            "{} already exists and cannot be checked ({e}); if no daemon uses it, remove it (rm {}) and try again",
            path.display(),
            path.display()
        ),
    }
}

/// What `--check-config` prints for a configuration the daemon could start with.
fn check_summary(file: &Path, config: &DaemonConfig, choice: &BackboneChoice, certified: bool) -> String {
    let mut listeners = Vec::new();
    if let Some(path) = &config.unix {
        listeners.push(format!("unix socket {}", path.display()));
    }
    if let Some(addr) = config.tcp {
        listeners.push(format!("tcp {addr}"));
    }
    if let Some(tls) = &config.tls {
        let who = if certified { "client certificates required" } else { "no client certificates" };
        listeners.push(format!("tls {} ({who})", tls.addr));
    }
    let backbone = match choice.kind {
        BackboneKind::Standalone => "standalone".to_owned(),
        BackboneKind::Cluster => format!("cluster (CPG group {:?})", choice.cpg_group),
    };
    let mut out = format!("{}: ok\n  listening on: {}\n  backbone: {backbone}\n", file.display(), listeners.join(", "));
    match &config.access {
        None => out.push_str("  access: no rules (every client may create, join and send to every group)\n"),
        Some(access) => {
            let _ = writeln!(out, "  access: {} rules, first match decides; other groups closed", access.rules.len());
            for (i, rule) in access.rules.iter().enumerate() {
                let _ = writeln!(out, "    {}. {rule}", i + 1);
            }
        }
    }
    let operators: Vec<String> = config.operators.iter().map(Who::to_string).collect();
    let _ = writeln!(
        out,
        "  status: the daemon's own Unix user and root{}{}",
        if operators.is_empty() { "" } else { ", and " },
        operators.join(", ")
    );
    for w in policy_warnings(config, certified) {
        let _ = writeln!(out, "  warning: {w}");
    }
    out
}

/// This cluster daemon's identity in the daemons' key agreement
/// (`--daemon-cert`), checked against `--daemon-ca` and `--daemon-crl`.
fn daemon_identity(
    args: &DaemonArgs,
    choice: &BackboneChoice,
    me: conclave_gcs::core::DaemonId,
) -> Result<Option<conclave_secure::trust::CertifiedDaemon>> {
    let (Some(cert), Some(key), Some(ca), Some(crl)) =
        (&args.daemon_cert, &args.daemon_key, &args.daemon_ca, &args.daemon_crl)
    else {
        return Ok(None);
    };
    if choice.kind != BackboneKind::Cluster {
        bail!("--daemon-cert is for a cluster daemon (--backbone cluster): a standalone daemon keys groups by itself");
    }
    let read = |path: &Path| std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()));
    let identity = conclave_secure::trust::Identity::from_pem(&read(cert)?, &read(key)?)
        .with_context(|| format!("cannot load the daemon identity {} / {}", cert.display(), key.display()))?;
    let authority = conclave_secure::trust::Authority::from_pem(&read(ca)?, Some(&read(crl)?))
        .with_context(|| format!("cannot load the authority {} with its CRL {}", ca.display(), crl.display()))?;
    let certified = conclave_secure::trust::CertifiedDaemon::new(me, identity, authority).with_context(|| {
        format!(
            "{} is not a valid certificate for daemon-{} (this node's daemon number) under {}",
            cert.display(),
            me.0,
            ca.display()
        )
    })?;
    Ok(Some(certified))
}

/// Runs the daemon until Ctrl-C or SIGTERM.
pub fn run(args: DaemonArgs) -> Result<()> {
    let (config, choice, mut trust) = build_config(&args)?;
    if let Some(file) = &args.check_config {
        print!("{}", check_summary(file, &config, &choice, trust.is_some()));
        return Ok(());
    }
    let stale = match &config.unix {
        Some(path) => check_socket_path(path)?,
        None => false,
    };
    crate::logging::init(args.log_format)?;
    for w in policy_warnings(&config, trust.is_some()) {
        tracing::warn!("{w}");
    }
    if let Some(access) = &config.access {
        tracing::info!(
            "access rules: {} (first match decides; other groups are closed to everyone)",
            access.rules.len()
        );
    }
    if let (true, Some(path)) = (stale, &config.unix) {
        tracing::info!("removed the stale socket {} (nothing was listening on it)", path.display());
    }
    let backbone = join_backbone(&choice)?;
    if choice.kind == BackboneKind::Cluster {
        tracing::info!("cluster backbone: daemon {} of CPG group {:?}", backbone.daemon_id().0, choice.cpg_group);
    }
    let backbone = match daemon_identity(&args, &choice, backbone.daemon_id())? {
        Some(certified) => {
            tracing::info!("keyed groups: this daemon takes part in the daemons' key agreement as {certified:?}");
            let backbone = backbone.with_daemon_trust(certified);
            if args.plain_backbone {
                tracing::warn!("--plain-backbone: client operations cross between the daemons unsealed");
                backbone.unsealed()
            } else {
                backbone
            }
        }
        None => backbone,
    };
    // The daemon fits its connection caps under the descriptor limit: first make that as high as it may be.
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let raised = conclave_gcs_net::daemon::raise_descriptor_limit();
    if raised != soft {
        let show = |l: Option<u64>| l.map_or("unlimited".to_owned(), |n| n.to_string());
        tracing::info!("descriptor limit (ulimit -n) raised from {} to {}", show(soft), show(raised));
    }
    crate::block_on(async move {
        let mut daemon = Daemon::start_with(config.clone(), backbone).await.context("cannot start the daemon")?;
        if let Some(path) = daemon.unix_path() {
            tracing::info!("listening on unix socket {}", path.display());
        }
        if let Some(addr) = daemon.tcp_addr() {
            tracing::info!("listening on tcp {addr}");
            if !loopback_only(&addr) {
                tracing::warn!(
                    "plain TCP on {addr}, which other machines may reach: its traffic is neither encrypted nor \
                     authenticated, and anyone who reaches it may connect under any free name; listen on loopback \
                     (--tcp localhost) or serve remote clients over TLS with client certificates (--tls-listen with \
                     --client-ca)"
                );
            }
        }
        if let (Some(_), UncertifiedNames::ByUid(names)) = (&trust, &config.uncertified_names) {
            if config.unix.is_some() {
                let users: Vec<String> = names.keys().map(|uid| uid.to_string()).collect();
                tracing::info!(
                    "local clients without a certificate may take only the names [unix_names] lists for their user \
                     (users: {})",
                    if users.is_empty() { "none".to_owned() } else { users.join(", ") }
                );
            }
            if config.tcp.is_some() {
                tracing::warn!("plain TCP clients cannot show a certificate: on this daemon they may take no name");
            }
        }
        if let Some(addr) = daemon.tls_addr() {
            let who = if trust.is_some() { "client certificates required" } else { "no client certificates" };
            tracing::info!("listening on tls {addr} ({who})");
            if trust.is_none() && !loopback_only(&addr) {
                tracing::warn!(
                    "TLS on {addr} without client certificates, and other machines may reach it: anyone who connects \
                     may take any free name; demand certificates with --client-ca authority.crt --client-crl \
                     authority.crl (`conclave keys authority` writes them)"
                );
            }
        }
        tracing::info!(
            "limits: max message size {} bytes, {} groups per client, queue depth {} frames or {} bytes, \
             hello timeout {:?}, frame timeout {:?}, at most {} client connections ({} per IP address or Unix user), \
             TCP keepalive {}",
            config.max_payload,
            config.max_groups_per_client,
            config.queue_depth,
            config.queue_bytes,
            config.hello_timeout,
            config.frame_timeout,
            daemon.max_connections(),
            config.max_connections_per_peer,
            config.keepalive.map_or("off".to_owned(), |k| format!("{k:?}")),
        );
        if config.tls.is_some() {
            tracing::info!(
                "TLS handshakes: timeout {:?}, at most {} under way, {} per IP address",
                config.handshake_timeout,
                daemon.max_handshakes(),
                config.max_handshakes_per_ip
            );
        }
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
        let mut hup = signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?;
        let mut watch = tokio::time::interval(WATCH_INTERVAL);
        loop {
            tokio::select! {
                _ = int.recv() => break,
                _ = term.recv() => break,
                _ = hup.recv() => match &mut trust {
                    Some(trust) => reload(&daemon, trust, "SIGHUP").await,
                    None => tracing::info!("SIGHUP: nothing to reload (no client certificates demanded)"),
                },
                _ = watch.tick(), if trust.is_some() => {
                    let Some(trust) = &mut trust else { continue };
                    if trust.changed() {
                        reload(&daemon, trust, "a client CA or CRL file changed").await;
                    }
                    trust.check_expiry();
                }
                reason = daemon.failed() => {
                    // The clients were told; let their connections take the news.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    // Dropping the daemon removes its socket.
                    drop(daemon);
                    bail!("the daemon stopped: {reason}");
                }
            }
        }
        tracing::info!("shutting down");
        daemon.shutdown().await;
        // Give the connections a moment to send their last words.
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_addresses_take_host_names_and_default_ports() {
        let v4 = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(resolve_listen("localhost", 4803, "--tcp").unwrap(), v4("127.0.0.1:4803"));
        assert_eq!(resolve_listen("localhost:7800", 4803, "--tcp").unwrap(), v4("127.0.0.1:7800"));
        assert_eq!(resolve_listen(" [localhost]:9 ", 4803, "--tcp").unwrap(), v4("127.0.0.1:9"));
        assert_eq!(resolve_listen("127.0.0.1", 4804, "--tls-listen").unwrap(), v4("127.0.0.1:4804"));
        assert_eq!(resolve_listen("::1", 4803, "--tcp").unwrap(), v4("[::1]:4803"));
        assert_eq!(resolve_listen("[::1]:5", 4803, "--tcp").unwrap(), v4("[::1]:5"));
        assert_eq!(resolve_listen("0.0.0.0:0", 4803, "--tcp").unwrap(), v4("0.0.0.0:0"));
        for (bad, says) in
            [("localhost:", "not a port"), ("localhost:-1", "not a port"), (":1", "no host"), (" ", "empty")]
        {
            let e = resolve_listen(bad, 4803, "--tcp").unwrap_err().to_string();
            assert!(e.starts_with("--tcp: ") && e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn only_loopback_listeners_are_private() {
        for (addr, private) in
            [("127.0.0.1:1", true), ("127.3.2.1:1", true), ("[::1]:1", true), ("0.0.0.0:1", false), ("[::]:1", false)]
        {
            assert_eq!(loopback_only(&addr.parse().unwrap()), private, "{addr}");
        }
    }
}
