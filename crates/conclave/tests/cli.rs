//! The networked commands as a user runs them: a daemon on a temporary Unix
//! socket, `conclave client` processes driven by scripts on stdin, a small
//! `conclave flood`, help texts and the errors for bad input.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long any one process may take.
const LIMIT: Duration = Duration::from_secs(15);

fn conclave() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_conclave"));
    c.env_remove("XDG_RUNTIME_DIR").env_remove("RUST_LOG");
    c
}

/// A spawned process, killed when the test ends however it ends.
struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Self {
        Proc { child: cmd.spawn().expect("spawn conclave") }
    }

    /// Waits for the process to exit; fails the test after [`LIMIT`].
    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "process {} did not exit in time", self.child.id());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process and returns its status, stdout and stderr.
    /// The pipes are read while it runs: a process whose output fills a
    /// pipe (64 KiB) would otherwise never exit.
    fn finish(&mut self) -> (ExitStatus, String, String) {
        fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
            std::thread::spawn(move || {
                let mut text = String::new();
                if let Some(mut p) = pipe {
                    p.read_to_string(&mut text).unwrap();
                }
                text
            })
        }
        let out = drain(self.child.stdout.take());
        let err = drain(self.child.stderr.take());
        let status = self.wait();
        (status, out.join().unwrap(), err.join().unwrap())
    }
}

/// A daemon on a socket in its own temporary directory, logging to a file.
struct TestDaemon {
    proc: Proc,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl TestDaemon {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("conclave.sock");
        let log = File::create(dir.path().join("daemon.log")).unwrap();
        let proc = Proc::spawn(conclave().arg("daemon").arg("--unix").arg(&socket).stderr(log).stdout(Stdio::null()));
        wait_for_socket(&socket);
        TestDaemon { proc, dir, socket }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap()
    }

    /// A `conclave client` with `script` on stdin (which then closes).
    fn client(&self, name: &str, script: &str) -> Proc {
        let mut p = Proc::spawn(
            conclave()
                .args(["client", "--name", name, "--unix"])
                .arg(&self.socket)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        let mut stdin = p.child.stdin.take().unwrap();
        stdin.write_all(script.as_bytes()).unwrap();
        p
    }
}

fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + LIMIT;
    while !path.exists() {
        assert!(Instant::now() < deadline, "daemon did not create {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(cmd: &mut Command) -> (ExitStatus, String, String) {
    Proc::spawn(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped())).finish()
}

fn has_line(out: &str, pred: impl Fn(&str) -> bool) -> bool {
    out.lines().any(pred)
}

#[test]
fn help_texts() {
    let (status, out, _) = run(conclave().arg("--help"));
    assert!(status.success());
    for cmd in ["daemon", "client", "flood", "bench"] {
        assert!(out.contains(cmd), "conclave --help lacks {cmd}:\n{out}");
    }
    for (cmd, needle) in [
        ("daemon", "--config"),
        ("client", "join-open"),
        ("client", "unicast"),
        ("flood", "--sizes"),
        ("client", "--tls"),
        ("daemon", "--client-ca"),
        ("daemon", "--queue-bytes"),
        ("daemon", "67108864"),
        ("daemon", "--frame-timeout"),
        ("daemon", "--handshake-timeout"),
        ("daemon", "--max-handshakes-per-ip"),
        ("bench", "gcs"),
    ] {
        let (status, out, _) = run(conclave().args([cmd, "--help"]));
        assert!(status.success());
        assert!(out.contains(needle), "conclave {cmd} --help lacks {needle}:\n{out}");
    }
}

#[test]
fn two_clients_talk() {
    let d = TestDaemon::start();
    let mut alice = d.client(
        "alice",
        "join chat\nwait chat 2\nsend chat hello from alice\nwait-msgs chat 3\nunicast chat bob psst\nleave chat\n",
    );
    let mut bob = d.client(
        "bob",
        "join chat\nwait chat 2\nsend chat hi from bob\nfifo chat in order\nwait-msgs chat 3\nwait chat 1\nleave chat\n",
    );
    let (a_status, a, a_err) = alice.finish();
    let (b_status, b, b_err) = bob.finish();
    assert!(a_status.success(), "alice failed:\n{a}\n{a_err}");
    assert!(b_status.success(), "bob failed:\n{b}\n{b_err}");
    for out in [&a, &b] {
        let both = |l: &str| {
            l.starts_with("view v") && l.contains(" of chat (join): ") && l.contains("alice") && l.contains("bob")
        };
        assert!(has_line(out, both), "no joint view:\n{out}");
        assert!(has_line(out, |l| l.starts_with("[chat v") && l.ends_with("] alice: hello from alice")), "{out}");
        assert!(has_line(out, |l| l.starts_with("[chat v") && l.ends_with("] bob: hi from bob")), "{out}");
        assert!(has_line(out, |l| l.starts_with("[chat v") && l.ends_with(" fifo] bob: in order")), "{out}");
        assert!(has_line(out, |l| l == "left chat"), "{out}");
    }
    assert!(has_line(&b, |l| l.ends_with("-> bob] alice: psst")), "bob missed the unicast:\n{b}");
    assert!(has_line(&b, |l| l.starts_with("view v") && l.ends_with(" of chat (leave): bob")), "{b}");
    // Agreed order: both saw the two agreed messages in the same order.
    let agreed = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("[chat v") && !l.contains("fifo") && !l.contains("->"))
            .map(String::from)
            .collect()
    };
    assert_eq!(agreed(&a), agreed(&b));
    let log = d.log();
    assert!(log.contains("listening on unix socket"), "{log}");
    assert!(log.contains("client connected"), "{log}");
}

#[test]
fn client_reports_bad_lines_and_daemon_errors() {
    let d = TestDaemon::start();
    let mut carol = d.client("carol", "bogus stuff\nsend\nsend nowhere hi\nwait nowhere x\nhelp\n");
    let (status, out, _) = carol.finish();
    assert_eq!(status.code(), Some(1), "rejected lines should fail the run:\n{out}");
    assert!(has_line(&out, |l| l.starts_with("error: unknown command \"bogus\"")), "{out}");
    assert!(has_line(&out, |l| l == "error: usage: send GROUP TEXT..."), "{out}");
    assert!(has_line(&out, |l| l.starts_with("error: ") && l.contains("not a number")), "{out}");
    // Sending to a group carol is not in is refused by the daemon, with its text.
    assert!(has_line(&out, |l| l.starts_with("error (") && l.contains("): ")), "{out}");
    assert!(out.contains("join-open"), "help text missing:\n{out}");

    // A name that is taken is refused at connect.
    let mut dup = d.client("dave", "wait never 5\n");
    std::thread::sleep(Duration::from_millis(300));
    let (status, _, err) = d.client("dave", "").finish();
    assert!(!status.success());
    assert!(err.contains("cannot connect") && err.contains("dave"), "{err}");
    let _ = dup.child.kill();
}

#[test]
fn daemon_errors_and_shutdown() {
    let d = TestDaemon::start();
    // A second daemon on the same socket.
    let (status, _, err) = run(conclave().arg("daemon").arg("--unix").arg(&d.socket));
    assert!(!status.success());
    assert!(err.contains("already listening"), "{err}");
    // A stale file where the socket should go.
    let stale = d.dir.path().join("stale.sock");
    std::fs::write(&stale, b"").unwrap();
    let (status, _, err) = run(conclave().arg("daemon").arg("--unix").arg(&stale));
    assert!(!status.success());
    assert!(err.contains("already exists") && err.contains("not a socket") && err.contains("rm "), "{err}");
    // No listener at all.
    let (status, _, err) = run(conclave().args(["daemon", "--no-unix"]));
    assert!(!status.success());
    assert!(err.contains("--tcp"), "{err}");
    // A bad configuration file.
    let bad = d.dir.path().join("bad.toml");
    std::fs::write(&bad, "[limits]\nqueue_deep = 3\n").unwrap();
    let (status, _, err) = run(conclave().arg("daemon").arg("--config").arg(&bad));
    assert!(!status.success());
    assert!(err.contains("bad configuration file") && err.contains("queue_deep"), "{err}");
    // A client with no daemon behind its socket.
    let missing = d.dir.path().join("missing.sock");
    let (status, _, err) = run(conclave().args(["client", "--name", "x", "--unix"]).arg(&missing));
    assert!(!status.success());
    assert!(err.contains("no such socket"), "{err}");

    // SIGTERM stops the daemon cleanly and removes its socket.
    let mut d = d;
    let pid = d.proc.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(d.proc.wait().success());
    assert!(!d.socket.exists(), "socket left behind");
    assert!(d.log().contains("shutting down"));
}

/// SIGHUP does not stop the daemon; SIGINT does, and removes the socket; a
/// socket left behind by a daemon that crashed (nothing listens on it) is
/// replaced at start, while a live daemon's socket is refused.
#[test]
fn daemon_survives_sighup_and_replaces_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("conclave.sock");
    // What a crashed daemon leaves: a socket file nothing listens on.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let log = File::create(dir.path().join("daemon.log")).unwrap();
    let proc = Proc::spawn(conclave().arg("daemon").arg("--unix").arg(&socket).stderr(log).stdout(Stdio::null()));
    let mut d = TestDaemon { proc, dir, socket };
    let deadline = Instant::now() + LIMIT;
    while !d.log().contains("listening on unix socket") {
        assert!(d.proc.child.try_wait().unwrap().is_none(), "the daemon exited:\n{}", d.log());
        assert!(Instant::now() < deadline, "the daemon did not start:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(d.log().contains("removed the stale socket"), "{}", d.log());
    // A second daemon is refused: this one is alive.
    let (status, _, err) = run(conclave().arg("daemon").arg("--unix").arg(&d.socket));
    assert!(!status.success());
    assert!(err.contains("already listening"), "{err}");

    let pid = d.proc.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    let deadline = Instant::now() + LIMIT;
    while !d.log().contains("SIGHUP") {
        assert!(d.proc.child.try_wait().unwrap().is_none(), "SIGHUP stopped the daemon:\n{}", d.log());
        assert!(Instant::now() < deadline, "the daemon did not log the SIGHUP:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(d.log().contains("nothing to reload"), "{}", d.log());
    let (status, out, _) = d.client("hal", "join g\nwait g 1\nsend g after the hangup\n").finish();
    assert!(status.success() && has_line(&out, |l| l.ends_with("] hal: after the hangup")), "{out}");

    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    assert!(d.proc.wait().success());
    assert!(!d.socket.exists(), "socket left behind");
    assert!(d.log().contains("shutting down"));
}

#[test]
fn daemon_reads_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("from-config.sock");
    let config = dir.path().join("conclave.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\nunix = {:?}\n\n[limits]\nmax_message_size = 100\nqueue_depth = 64\nqueue_bytes = 100000\n\
             frame_timeout_secs = 7\nhandshake_timeout_secs = 2\nmax_handshakes = 10\nmax_handshakes_per_ip = 5\n",
            socket.display().to_string()
        ),
    )
    .unwrap();
    let log = File::create(dir.path().join("daemon.log")).unwrap();
    let daemon = Proc::spawn(conclave().arg("daemon").arg("--config").arg(&config).stderr(log));
    wait_for_socket(&socket);
    let d = TestDaemon { proc: daemon, dir, socket };
    let big = "x".repeat(200);
    let (status, out, _) = d.client("erin", &format!("join g\nwait g 1\nsend g {big}\nsend g small\n")).finish();
    assert!(status.success(), "{out}");
    assert!(has_line(&out, |l| l.starts_with("error (TooLarge)")), "{out}");
    assert!(has_line(&out, |l| l.ends_with("] erin: small")), "{out}");
    assert!(d.log().contains("max message size 100 bytes"), "{}", d.log());
    assert!(d.log().contains("queue depth 64 frames or 100000 bytes"), "{}", d.log());
    assert!(d.log().contains("frame timeout 7s"), "{}", d.log());
}

#[test]
fn flood_prints_a_table() {
    let d = TestDaemon::start();
    let (status, out, err) = run(conclave()
        .args([
            "flood",
            "--name",
            "fl",
            "--group",
            "load",
            "--count",
            "300",
            "--senders",
            "2",
            "--sizes",
            "64,1024",
            "--unix",
        ])
        .arg(&d.socket));
    assert!(status.success(), "{out}\n{err}");
    let mut lines = out.lines();
    let header = lines.next().unwrap();
    for col in ["size", "senders", "messages", "msg/s", "MB/s", "p50 ms", "p99 ms"] {
        assert!(header.contains(col), "{header}");
    }
    let rows: Vec<Vec<f64>> =
        lines.map(|l| l.split_whitespace().map(|f| f.parse().unwrap_or_else(|_| panic!("{l}"))).collect()).collect();
    assert_eq!(rows.len(), 2, "{out}");
    for (row, size) in rows.iter().zip([64.0, 1024.0]) {
        assert_eq!(row.len(), 9, "{out}");
        assert_eq!(row[0], size);
        assert_eq!(row[1], 2.0);
        assert_eq!(row[2], 600.0);
        assert!(row[4] > 0.0 && row[5] > 0.0, "{out}");
        assert!(row[6] <= row[7] && row[7] <= row[8], "percentiles out of order: {out}");
    }
    // Too small a payload is refused up front.
    let (status, _, err) = run(conclave().args(["flood", "--size", "8", "--unix"]).arg(&d.socket));
    assert!(!status.success());
    assert!(err.contains("too small"), "{err}");
}

/// Certificates as `conclave keys` writes them (PEM, Ed25519 in PKCS#8, a
/// self-signed authority, member CommonName = member name), made by rcgen.
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "test authority");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Writes `<cn>.crt` and `<cn>.key`.
    fn issue(&self, cn: &str, sans: &[&str]) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params = rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        std::fs::write(self.path(&format!("{cn}.crt")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{cn}.key")), key.serialize_pem()).unwrap();
    }

    /// Writes `<file>`: an empty CRL due for its next update at the start of `year`.
    fn crl(&self, file: &str, year: i32) -> PathBuf {
        let crl = rcgen::CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(year, 1, 1),
            crl_number: rcgen::SerialNumber::from(1),
            issuing_distribution_point: None,
            revoked_certs: vec![],
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&self.ca, &self.ca_key)
        .unwrap();
        std::fs::write(self.path(file), crl.pem().unwrap()).unwrap();
        self.path(file)
    }
}

#[test]
fn tls_daemon_with_client_certificates() {
    let pki = Pki::new();
    pki.issue("daemon", &["localhost"]);
    pki.issue("alice", &[]);
    let log_path = pki.path("daemon.log");
    let log = File::create(&log_path).unwrap();
    // TLS from the configuration file; the flags are the same settings.
    let config = pki.path("conclave.toml");
    let file = |name: &str| format!("{:?}", pki.path(name).display().to_string());
    let tls = format!(
        "[listen]\nunix = false\n\n[tls]\nlisten = \"127.0.0.1:0\"\ncert = {}\nkey = {}\nclient_ca = {}\n",
        file("daemon.crt"),
        file("daemon.key"),
        file("ca.pem")
    );
    // Client certificates without a CRL are refused unless asked for.
    std::fs::write(&config, &tls).unwrap();
    let (status, _, err) = run(conclave().arg("daemon").arg("--config").arg(&config));
    assert!(!status.success());
    assert!(err.contains("could never be revoked") && err.contains("--no-crl") && err.contains("keys"), "{err}");
    // A CRL past its nextUpdate is refused.
    let flags = |crl: &Path| {
        let (cert, key, ca) = (pki.path("daemon.crt"), pki.path("daemon.key"), pki.path("ca.pem"));
        let mut cmd = conclave();
        cmd.args(["daemon", "--no-unix", "--tls-listen", "127.0.0.1:0", "--tls-cert"]).arg(cert).arg("--tls-key");
        cmd.arg(key).arg("--client-ca").arg(ca).arg("--client-crl").arg(crl);
        cmd
    };
    let (status, _, err) = run(&mut flags(&pki.crl("old.crl", 2021)));
    assert!(!status.success());
    assert!(err.contains("out of date") && err.contains("2021") && err.contains("old.crl"), "{err}");
    std::fs::write(&config, format!("{tls}no_crl = true\n")).unwrap();
    let _daemon = Proc::spawn(conclave().arg("daemon").arg("--config").arg(&config).stderr(log).stdout(Stdio::null()));
    // The daemon logs the port it got.
    let deadline = Instant::now() + LIMIT;
    let addr = loop {
        let log = std::fs::read_to_string(&log_path).unwrap();
        if let Some(rest) = log.split("listening on tls ").nth(1) {
            assert!(rest.contains("client certificates required"), "{log}");
            break rest.split_whitespace().next().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "the daemon did not log its TLS address:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let client = |name: &str, with_cert: bool, script: &str| {
        let mut cmd = conclave();
        cmd.args(["client", "--name", name, "--tls", &addr, "--server-name", "localhost", "--ca"])
            .arg(pki.path("ca.pem"));
        if with_cert {
            cmd.arg("--cert").arg(pki.path("alice.crt")).arg("--key").arg(pki.path("alice.key"));
        }
        let mut p = Proc::spawn(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()));
        // A client the daemon refuses may be gone before it reads its script.
        let _ = p.child.stdin.take().unwrap().write_all(script.as_bytes());
        p.finish()
    };
    let (status, out, err) = client("alice", true, "join g\nwait g 1\nsend g over tls\nwait-msgs g 1\n");
    assert!(status.success(), "{out}\n{err}");
    assert!(has_line(&out, |l| l.starts_with("[g v") && l.ends_with("] alice: over tls")), "{out}");
    let (status, _, err) = client("bob", true, "");
    assert!(!status.success());
    assert!(err.contains("certificate is for alice, Hello says bob"), "{err}");
    let (status, _, err) = client("alice", false, "");
    assert!(!status.success());
    assert!(err.contains("cannot connect") && err.contains("tls"), "{err}");
    // TLS options that do not fit together are refused up front.
    let (status, _, err) = run(conclave().args(["daemon", "--no-unix", "--tls-listen", "127.0.0.1:0"]));
    assert!(!status.success());
    assert!(err.contains("--tls-cert"), "{err}");
    let (status, _, err) = run(conclave().args(["client", "--name", "x", "--tls", &addr]));
    assert!(!status.success());
    assert!(err.contains("--ca"), "{err}");
}

#[test]
fn bench_gcs_prints_tables_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("gcs.json");
    let (status, out, err) = run(conclave()
        .args(["bench", "gcs", "--quick", "--tls", "--sizes", "64,1024", "--senders", "1,2", "--receivers", "3"])
        .arg("--json")
        .arg(&json));
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("p50 µs") && out.contains("msg/s / unix") && out.contains("join p50 µs"), "{out}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let multicast = report["multicast"].as_array().unwrap();
    // Two targets (unix, tls) × two sender counts × two sizes.
    assert_eq!(multicast.len(), 8, "{out}");
    for row in multicast {
        let f = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("{k} in {row}"));
        assert!(0.0 < f("latency_p50_us") && f("latency_p50_us") <= f("latency_p99_us"), "{row}");
        assert!(f("messages_per_s") > 0.0 && f("mb_per_s") > 0.0, "{row}");
        // Every receiver measured every latency message: 20 per sender.
        assert_eq!(f("latency_samples"), 20.0 * f("senders") * 3.0, "{row}");
    }
    let membership = report["membership"].as_array().unwrap();
    assert_eq!(membership.len(), 4, "{out}");
    for row in membership {
        assert!(row["join_p50_us"].as_f64().unwrap() > 0.0 && row["leave_p50_us"].as_f64().unwrap() > 0.0);
    }
    // Against a daemon given by its socket, with no TLS.
    let d = TestDaemon::start();
    let (status, out, err) = run(conclave()
        .args(["bench", "gcs", "--quick", "--sizes", "64", "--senders", "1", "--receivers", "2", "--unix"])
        .arg(&d.socket));
    assert!(status.success(), "{out}\n{err}");
    // A markdown table: | target | senders | size | ...
    let cells = |l: &str| l.split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
    assert!(out.lines().map(cells).any(|c| c.len() > 3 && c[1] == "unix" && c[3] == "64"), "{out}");
    assert!(!out.contains("tls"), "{out}");
}

/// `bench form` runs its daemon as a process of its own by default, and
/// gives the members' memory and the daemon's apart, with the daemon's CPU
/// and the bytes it wrote; embedded, the process's memory and both byte
/// counts.
#[test]
fn bench_form_measures_a_daemon_process_apart() {
    let (status, out, err) = run(conclave().args(["bench", "form", "--sizes", "4", "--no-mls", "--json"]));
    assert!(status.success(), "{out}\n{err}");
    let row: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let f = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("{k} in {row}"));
    assert_eq!(row["daemon"], "process", "{row}");
    assert!(f("peak_rss_mib") > 0.0 && f("daemon_peak_rss_mib") > 0.0, "{row}");
    assert!(f("daemon_cpu_ms") >= 0.0 && f("cpu_ms") >= f("daemon_cpu_ms"), "{row}");
    assert!(f("daemon_written_bytes") > 0.0 && row["daemon_read_bytes"].is_null(), "{row}");
    assert_eq!(f("n"), 4.0);

    let (status, out, err) =
        run(conclave().args(["bench", "form", "--sizes", "4", "--no-mls", "--json", "--daemon", "embedded"]));
    assert!(status.success(), "{out}\n{err}");
    let row: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(row["daemon"], "embedded", "{row}");
    assert!(row["daemon_peak_rss_mib"].is_null() && row["daemon_cpu_ms"].is_null(), "{row}");
    assert!(row["daemon_read_bytes"].as_f64().unwrap() > 0.0, "{row}");

    // A table by default, with the daemon's columns.
    let (status, out, err) = run(conclave().args(["bench", "form", "--sizes", "3", "--no-mls"]));
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("daemon RSS MiB") && out.contains("daemon process of their own"), "{out}");
}

/// `conclave keys` alone sets up a daemon that demands certified members:
/// its server certificate, members' client certificates and the CRL.
#[test]
fn keys_make_everything_a_certifying_tls_daemon_needs() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let keys_cmd = |args: &[&str]| {
        let (status, out, err) = run(conclave().arg("keys").args(args).arg("--dir").arg(&keys));
        assert!(status.success(), "keys {args:?}: {out}\n{err}");
    };
    keys_cmd(&["authority"]);
    keys_cmd(&["issue", "alice"]);
    keys_cmd(&["issue", "mallory"]);
    keys_cmd(&["revoke", "mallory", "--reason", "key-compromise"]);
    keys_cmd(&["daemon", "--host", "localhost", "--host", "127.0.0.1"]);
    // A second daemon certificate would overwrite the first: refused.
    let (status, _, err) = run(conclave().args(["keys", "daemon", "--host", "x", "--dir"]).arg(&keys));
    assert!(!status.success() && err.contains("already holds a daemon certificate"), "{err}");

    let (_daemon, addr) = certified_tls_daemon(&keys, &dir.path().join("daemon.log"));
    let client = |name: &str, server_name: &str, script: &str| {
        let member = keys.join("members");
        let mut cmd = conclave();
        cmd.args(["client", "--name", name, "--tls", &addr, "--server-name", server_name, "--ca"])
            .arg(keys.join("authority.crt"))
            .arg("--cert")
            .arg(member.join(format!("{name}.crt")))
            .arg("--key")
            .arg(member.join(format!("{name}.key")));
        let mut p = Proc::spawn(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()));
        // A client the daemon refuses may be gone before it reads its script.
        let _ = p.child.stdin.take().unwrap().write_all(script.as_bytes());
        p.finish()
    };
    // The daemon's certificate is good for both of its names.
    for server_name in ["localhost", "127.0.0.1"] {
        let (status, out, err) = client("alice", server_name, "join g\nwait g 1\nsend g certified\nwait-msgs g 1\n");
        assert!(status.success(), "{server_name}: {out}\n{err}");
        assert!(has_line(&out, |l| l.ends_with("] alice: certified")), "{out}");
    }
    // The revoked member is turned away at connect.
    let (status, _, err) = client("mallory", "localhost", "join g\n");
    assert!(!status.success(), "a revoked member got in: {err}");
    assert!(err.contains("cannot connect") && err.contains("CertificateRevoked"), "{err}");
}

/// Polls `path` until one of its lines satisfies `pred`; fails the test after `limit`.
/// A daemon serving TLS on a free loopback port with the certificates of key
/// directory `keys`, clients certified by its authority and checked against
/// its CRL, logging to `log_path`; returns it and its TLS address once it
/// has logged it.
fn certified_tls_daemon(keys: &Path, log_path: &Path) -> (Proc, String) {
    let log = File::create(log_path).unwrap();
    let daemon = Proc::spawn(
        conclave()
            .args(["daemon", "--no-unix", "--tls-listen", "127.0.0.1:0", "--tls-cert"])
            .arg(keys.join("daemon.crt"))
            .arg("--tls-key")
            .arg(keys.join("daemon.key"))
            .arg("--client-ca")
            .arg(keys.join("authority.crt"))
            .arg("--client-crl")
            .arg(keys.join("authority.crl"))
            .stderr(log)
            .stdout(Stdio::null()),
    );
    until_line(log_path, LIMIT, "TLS address", |l| l.contains("listening on tls "));
    let text = std::fs::read_to_string(log_path).unwrap();
    let addr = text.split("listening on tls ").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    (daemon, addr)
}

fn until_line(path: &Path, limit: Duration, what: &str, pred: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if has_line(&text, &pred) {
            return;
        }
        assert!(Instant::now() < deadline, "no {what} within {limit:?} in {}:\n{text}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `conclave keys revoke` reaches a running daemon: after SIGHUP, and with no
/// signal when the CRL file changes, the revoked member is disconnected
/// within 2 s, told why, and its group sees it leave; the daemon goes on.
#[test]
fn keys_revoke_disconnects_a_connected_member_of_a_running_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let keys_cmd = |args: &[&str]| {
        let (status, out, err) = run(conclave().arg("keys").args(args).arg("--dir").arg(&keys));
        assert!(status.success(), "keys {args:?}: {out}\n{err}");
    };
    keys_cmd(&["authority"]);
    for name in ["alice", "carol", "dave"] {
        keys_cmd(&["issue", name]);
    }
    keys_cmd(&["daemon", "--host", "localhost"]);
    let log_path = dir.path().join("daemon.log");
    let (mut daemon, addr) = certified_tls_daemon(&keys, &log_path);
    let daemon_log = || std::fs::read_to_string(&log_path).unwrap();
    // Each member's output goes to a file the test polls.
    let member = |name: &str, script: &str| {
        let out = dir.path().join(format!("{name}.out"));
        let mut cmd = conclave();
        cmd.args(["client", "--name", name, "--tls", &addr, "--server-name", "localhost", "--ca"])
            .arg(keys.join("authority.crt"))
            .arg("--cert")
            .arg(keys.join("members").join(format!("{name}.crt")))
            .arg("--key")
            .arg(keys.join("members").join(format!("{name}.key")));
        let mut p = Proc::spawn(cmd.stdin(Stdio::piped()).stdout(File::create(&out).unwrap()).stderr(Stdio::piped()));
        p.child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        (p, out)
    };
    let (mut alice, alice_out) = member("alice", "join g\nwait g 3\nwait g 2\nwait g 1\n");
    let (mut carol, carol_out) = member("carol", "join g\nwait g 3\nsleep 30000\n");
    let (_dave, _) = member("dave", "join g\nwait g 3\nsleep 30000\n");
    until_line(&alice_out, LIMIT, "view of three", |l| l.starts_with("view ") && l.split(' ').count() == 8);
    let pid = daemon.child.id().to_string();

    keys_cmd(&["revoke", "carol"]);
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    let left =
        |gone: &'static str| move |l: &str| l.starts_with("view ") && l.contains("(disconnect)") && !l.contains(gone);
    until_line(&alice_out, Duration::from_secs(2), "view without carol", left("carol"));
    let (status, _, err) = carol.finish();
    assert!(!status.success() && err.contains("Revoked"), "{err}");
    let told = std::fs::read_to_string(&carol_out).unwrap();
    assert!(told.contains("error (Revoked): the certificate of carol has been revoked: disconnected"), "{told}");
    assert!(daemon.child.try_wait().unwrap().is_none(), "SIGHUP stopped the daemon:\n{}", daemon_log());

    // No signal this time: the daemon sees the CRL file change.
    keys_cmd(&["revoke", "dave"]);
    until_line(&alice_out, Duration::from_secs(2), "view of alice alone", |l| {
        l.starts_with("view ") && l.ends_with("(disconnect): alice")
    });
    let (status, out, err) = alice.finish();
    assert!(status.success(), "{out}\n{err}");
    let log = daemon_log();
    assert!(log.contains("SIGHUP: reloading") && log.contains("disconnected carol"), "{log}");
    assert!(log.contains("file changed") && log.contains("disconnected dave"), "{log}");
    assert!(daemon.child.try_wait().unwrap().is_none(), "the daemon stopped:\n{log}");
}

/// With client certificates, the Unix socket is off unless asked for; when
/// it is on, a local client may take only the names `[unix_names]` lists for
/// its user: a squatter's Hello as bob is refused and the real bob, with his
/// certificate, gets in over TLS.
#[test]
fn a_certifying_daemon_binds_local_clients_to_the_names_of_their_user() {
    use std::os::unix::fs::MetadataExt;
    let pki = Pki::new();
    pki.issue("daemon", &["localhost"]);
    pki.issue("bob", &[]);
    pki.crl("authority.crl", 2100);
    let file = |name: &str| format!("{:?}", pki.path(name).display().to_string());
    let tls = format!(
        "[tls]\nlisten = \"127.0.0.1:0\"\ncert = {}\nkey = {}\nclient_ca = {}\nclient_crl = [{}]\n",
        file("daemon.crt"),
        file("daemon.key"),
        file("ca.pem"),
        file("authority.crl")
    );
    // Starts a daemon from `config_text`; returns it, its TLS address and its log.
    let start = |name: &str, config_text: String| {
        let config = pki.path(&format!("{name}.toml"));
        std::fs::write(&config, config_text).unwrap();
        let log_path = pki.path(&format!("{name}.log"));
        let log = File::create(&log_path).unwrap();
        let daemon =
            Proc::spawn(conclave().arg("daemon").arg("--config").arg(&config).stderr(log).stdout(Stdio::null()));
        until_line(&log_path, LIMIT, "TLS address", |l| l.contains("listening on tls "));
        let log = std::fs::read_to_string(&log_path).unwrap();
        let addr = log.split("listening on tls ").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
        (daemon, addr, log)
    };
    let (daemon, _, log) = start("no-unix", tls.clone());
    assert!(!log.contains("listening on unix socket"), "{log}");
    drop(daemon);

    let socket = pki.path("conclave.sock");
    let uid = std::fs::metadata("/proc/self").unwrap().uid();
    let (_daemon, addr, _) = start(
        "unix",
        format!(
            "[listen]\nunix = {:?}\n\n{tls}\n[unix_names]\n{uid} = [\"alice\", \"bot-*\"]\n",
            socket.display().to_string()
        ),
    );
    let local = |name: &str, script: &str| {
        let mut cmd = conclave();
        cmd.args(["client", "--name", name, "--unix"]).arg(&socket);
        let mut p = Proc::spawn(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()));
        // A client the daemon refuses may be gone before it reads its script.
        let _ = p.child.stdin.take().unwrap().write_all(script.as_bytes());
        p.finish()
    };
    let (status, _, err) = local("bob", "join g\n");
    assert!(!status.success(), "a local client took bob: {err}");
    assert!(err.contains(&format!("a local client of user {uid} may not take the name bob")), "{err}");
    let mut cmd = conclave();
    cmd.args(["client", "--name", "bob", "--tls", &addr, "--server-name", "localhost", "--ca"])
        .arg(pki.path("ca.pem"))
        .arg("--cert")
        .arg(pki.path("bob.crt"))
        .arg("--key")
        .arg(pki.path("bob.key"));
    let mut bob = Proc::spawn(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()));
    bob.child.stdin.take().unwrap().write_all(b"join g\nwait g 1\n").unwrap();
    let (status, out, err) = bob.finish();
    assert!(status.success(), "the real bob was refused: {out}\n{err}");
    let (status, out, err) = local("bot-7", "join g\nwait g 1\n");
    assert!(status.success(), "a listed pattern was refused: {out}\n{err}");
}

#[test]
fn chat_web_refuses_bad_addresses_clearly() {
    let keys = tempfile::tempdir().unwrap();
    // A key directory must be private (tempfile creates directories 0755).
    std::fs::set_permissions(keys.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let chat = |extra: &[&str]| {
        let mut c = conclave();
        c.args(["chat", "--name", "alice", "--group", "room", "--keys"]).arg(keys.path()).args(extra);
        run(&mut c)
    };
    let (status, _, err) = chat(&["--web", "localhost"]);
    assert!(!status.success() && err.contains("not an IP:PORT address"), "{err}");
    let (status, _, err) = chat(&["--open"]);
    assert!(!status.success() && err.contains("--web"), "--open needs --web: {err}");
    // An address this machine does not have: refused before the daemon is tried or anything is created.
    let (status, _, err) = chat(&["--web", "192.0.2.1:0", "--unix", "/nonexistent/conclave.sock", "--create-identity"]);
    assert!(!status.success() && err.contains("cannot serve the chat page on 192.0.2.1:0"), "{err}");
    assert_eq!(std::fs::read_dir(keys.path()).unwrap().count(), 0, "chat created files");
    let (status, out, _) = run(conclave().args(["chat", "--help"]));
    assert!(status.success() && out.contains("--web [<ADDR>]") && out.contains("--open"), "{out}");
}

/// Runs `cmd` with TMPDIR at `tmp` and its stdout into a pipe whose reader
/// takes `lines` lines and closes it, as `| head -1` does (`lines` = 0: the
/// reader is gone before the first write). Returns the exit status, what was
/// read and stderr.
fn read_then_close(cmd: &mut Command, tmp: &Path, lines: usize) -> (ExitStatus, String, String) {
    use std::io::BufRead;
    let mut p = Proc::spawn(cmd.env("TMPDIR", tmp).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()));
    let mut read = String::new();
    let mut stdout = std::io::BufReader::new(p.child.stdout.take().unwrap());
    for _ in 0..lines {
        stdout.read_line(&mut read).unwrap();
    }
    drop(stdout); // the pipe has no reader any more
    let (status, _, err) = p.finish();
    (status, read, err)
}

/// `conclave demo | head -1`, `conclave bench counts | head -1` and
/// `conclave keys list | head -1` end with success, no panic message and no
/// temporary files left behind; so do they when stdout has no reader from
/// the start. `keys list` and `bench counts` print more than a pipe holds
/// (64 KiB), so their writes outlast the reader whatever the timing; the
/// demo prints for seconds after its first line.
#[test]
fn a_closed_stdout_ends_quietly_with_success_and_no_leftovers() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("keys");
    let (status, _, err) = run(conclave().args(["keys", "authority", "--dir"]).arg(&keys));
    assert!(status.success(), "{err}");
    let (status, _, err) = run(conclave().args(["keys", "issue", "alice", "--dir"]).arg(&keys));
    assert!(status.success(), "{err}");
    // Enough members for `keys list` to print more than a pipe holds.
    let members = keys.join("members");
    for i in 0..1500 {
        std::fs::copy(members.join("alice.crt"), members.join(format!("m{i:04}.crt"))).unwrap();
    }
    let scratch = tmp.path().join("tmp");
    std::fs::create_dir(&scratch).unwrap();
    let commands: [(&str, Vec<std::ffi::OsString>); 3] = [
        ("keys list", vec!["keys".into(), "list".into(), "--dir".into(), keys.clone().into()]),
        ("bench counts", ["bench", "counts", "--sizes", "2,3,4,5,6,7,8", "--json"].map(Into::into).to_vec()),
        ("demo", vec!["demo".into()]),
    ];
    for (what, args) in &commands {
        for lines in [1, 0] {
            let (status, read, err) = read_then_close(conclave().args(args), &scratch, lines);
            assert_eq!(read.lines().count(), lines, "{what} printed too little: {err}");
            assert!(status.success(), "{what} | head -{lines} ended with {status}:\n{err}");
            assert!(!err.contains("panicked"), "{what} panicked:\n{err}");
            let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().map(|e| e.unwrap().path()).collect();
            assert!(left.is_empty(), "{what} left temporary files: {left:?}");
        }
    }
}

/// A message cannot act on the reader's terminal: `conclave client` prints
/// its control characters (a clear-screen escape sequence, a bell, a line
/// break that would fake a line from someone else) as escapes.
#[test]
fn client_escapes_control_characters() {
    let d = TestDaemon::start();
    let (status, out, err) =
        d.client("eve", "join g\nwait g 1\nsend g \x1b[2Jhello\x07 there\rfake\nwait-msgs g 1\n").finish();
    assert!(status.success(), "{out}\n{err}");
    assert!(!out.contains(['\x1b', '\x07', '\r']), "raw control characters printed: {out:?}");
    assert!(has_line(&out, |l| l.ends_with("] eve: \\x1b[2Jhello\\x07 there\\rfake")), "{out}");
}

/// `keys issue --days 0` is refused (the certificate would be expired when
/// issued); a revoked member's name can be issued again with `--replace`,
/// which a valid certificate is not replaced by.
#[test]
fn keys_refuse_zero_days_and_reissue_revoked_names_with_replace() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().join("keys");
    let keys = |args: &[&str]| run(conclave().arg("keys").args(args).arg("--dir").arg(&dir));
    let ok = |args: &[&str]| {
        let (status, out, err) = keys(args);
        assert!(status.success(), "keys {args:?}: {out}\n{err}");
        out
    };
    ok(&["authority"]);
    let (status, _, err) = keys(&["issue", "alice", "--days", "0"]);
    assert!(!status.success() && err.contains("--days must be at least 1"), "{err}");
    assert!(!dir.join("members/alice.crt").exists(), "an expired certificate was issued");

    ok(&["issue", "alice"]);
    // A valid certificate is replaced only after it is revoked.
    let (status, _, err) = keys(&["issue", "alice"]);
    assert!(!status.success() && err.contains("already has a valid certificate"), "{err}");
    let (status, _, err) = keys(&["issue", "alice", "--replace"]);
    assert!(!status.success() && err.contains("revoke it first"), "{err}");
    ok(&["revoke", "alice"]);
    // Revoked: the error says how to re-issue, not to revoke again.
    let (status, _, err) = keys(&["issue", "alice"]);
    assert!(!status.success(), "{err}");
    assert!(err.contains("is revoked") && err.contains("--replace") && !err.contains("revoke it"), "{err}");
    ok(&["issue", "alice", "--replace"]);
    let list = ok(&["list"]);
    let alice: Vec<&str> = list.lines().filter(|l| l.starts_with("alice ")).collect();
    assert_eq!(alice.len(), 1, "{list}");
    assert!(alice[0].ends_with("valid"), "the new certificate is not valid:\n{list}");
}

/// docs/wire.md's table of error codes has a row for every code the daemon
/// sends, with its number, name and whether it is fatal.
#[test]
fn wire_md_documents_every_error_code() {
    use conclave_gcs::core::ErrorCode;
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/wire.md")).unwrap();
    let rows: Vec<Vec<&str>> = doc
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    let mut n = 1;
    while !matches!(ErrorCode::from_u16(n), ErrorCode::Other(_)) {
        let code = ErrorCode::from_u16(n);
        let row = rows.iter().find(|r| r.len() == 4 && r[0] == n.to_string());
        let row = row.unwrap_or_else(|| panic!("docs/wire.md has no row for error code {n} ({code:?})"));
        assert_eq!(row[1], format!("{code:?}"), "docs/wire.md names code {n} wrongly");
        assert_eq!(row[2], if code.is_fatal() { "yes" } else { "no" }, "docs/wire.md: is code {n} fatal?");
        n += 1;
    }
    assert!(n > 15, "the codes stopped at {n}");
    // Codes the daemon shell sends that the core does not know.
    let code = conclave_gcs::wire::ACCESS_DENIED;
    let row = rows.iter().find(|r| r.len() == 4 && r[0] == code.to_u16().to_string()).expect("AccessDenied's row");
    assert_eq!((row[1], row[2]), (conclave_gcs::wire::code_name(code).as_str(), "no"));
}

/// Errors are said once and in words: a cause that its context already
/// states is not repeated, and no internal type name shows.
#[test]
fn errors_are_printed_once_in_words() {
    let pki = Pki::new();
    pki.issue("daemon", &["localhost"]);
    pki.issue("other", &["localhost"]);
    let missing = pki.path("missing");
    let once = |err: &str, what: &str| {
        assert_eq!(err.matches(what).count(), 1, "{what:?} not said exactly once:\n{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    };
    // A socket in a directory that does not exist.
    let (status, _, err) = run(conclave().arg("daemon").arg("--unix").arg(missing.join("x.sock")));
    assert!(!status.success());
    once(&err, "No such file or directory");
    // A TLS file that does not exist, for the daemon and for the client.
    let (status, _, err) = run(conclave()
        .args(["daemon", "--no-unix", "--tls-listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&missing)
        .arg("--tls-key")
        .arg(&missing));
    assert!(!status.success());
    once(&err, "No such file or directory");
    let (status, _, err) =
        run(conclave().args(["client", "--name", "x", "--tls", "127.0.0.1:1", "--ca"]).arg(&missing));
    assert!(!status.success());
    once(&err, "No such file or directory");
    // A key that is not the certificate's, for the daemon and for the client.
    let (status, _, err) = run(conclave()
        .args(["daemon", "--no-unix", "--tls-listen", "127.0.0.1:0", "--tls-cert"])
        .arg(pki.path("daemon.crt"))
        .arg("--tls-key")
        .arg(pki.path("other.key")));
    assert!(!status.success());
    assert!(
        err.contains("the private key does not belong to the certificate") && !err.contains("KeyMismatch"),
        "{err}"
    );
    let (status, _, err) = run(conclave()
        .args(["client", "--name", "x", "--tls", "127.0.0.1:1", "--ca"])
        .arg(pki.path("ca.pem"))
        .arg("--cert")
        .arg(pki.path("daemon.crt"))
        .arg("--key")
        .arg(pki.path("other.key")));
    assert!(!status.success());
    assert!(
        err.contains("the private key does not belong to the certificate") && !err.contains("KeyMismatch"),
        "{err}"
    );
    // A configuration value of the wrong kind says what the setting takes.
    let config = pki.path("bad.toml");
    std::fs::write(&config, "[listen]\nunix = 3\n").unwrap();
    let (status, _, err) = run(conclave().arg("daemon").arg("--config").arg(&config));
    assert!(!status.success());
    assert!(err.contains("a socket path (a string) or false") && !err.contains("UnixSetting"), "{err}");
}

/// The README's `conclave client` lines ("Using the daemon by hand") run as
/// written, against a daemon on their default socket (with `$XDG_RUNTIME_DIR`
/// a temporary directory), and end with success after both members heard
/// both messages.
#[test]
fn the_readmes_client_example_works_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let block = readme.split("### Using the daemon by hand").nth(1).unwrap();
    let block = block.split("```sh\n").nth(1).unwrap().split("```").next().unwrap();
    let clients: Vec<&str> = block.lines().filter(|l| l.contains("conclave client")).collect();
    assert!(!clients.is_empty(), "{block}");
    let dir = tempfile::tempdir().unwrap();
    // $XDG_RUNTIME_DIR must be private (tempfile creates directories 0755).
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let socket = dir.path().join("conclave.sock");
    let log = File::create(dir.path().join("daemon.log")).unwrap();
    let proc = Proc::spawn(conclave().arg("daemon").arg("--unix").arg(&socket).stderr(log).stdout(Stdio::null()));
    wait_for_socket(&socket);
    let _d = TestDaemon { proc, dir, socket: socket.clone() };
    // As typed into a shell; then wait for the clients sent to the background.
    let mut script = String::new();
    for line in &clients {
        script.push_str(line);
        if line.trim_end().ends_with('&') {
            script.push_str("\npids=\"$pids $!\"");
        }
        script.push('\n');
    }
    script.push_str("for pid in $pids; do wait $pid || exit 1; done\n");
    let bin = Path::new(env!("CARGO_BIN_EXE_conclave")).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let (status, out, err) = run(Command::new("sh")
        .arg("-ec")
        .arg(&script)
        .env("PATH", path)
        .env("XDG_RUNTIME_DIR", socket.parent().unwrap())
        .env_remove("RUST_LOG"));
    assert!(status.success(), "the README's client example failed:\n{script}\n{out}\n{err}");
    for (who, said) in [("alice", "hello"), ("bob", "hi")] {
        let heard = out.lines().filter(|l| l.starts_with("[chat v") && l.ends_with(&format!("] {who}: {said}")));
        assert_eq!(heard.count(), 2, "both should hear {who}:\n{out}\n{err}");
    }
}

/// The commands `conclave --help` lists.
fn subcommands() -> Vec<String> {
    let (status, out, _) = run(conclave().arg("--help"));
    assert!(status.success());
    let list = out.split("Commands:").nth(1).expect("a Commands: section").split("\n\n").next().unwrap();
    let names: Vec<String> =
        list.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| *n != "help").map(str::to_owned).collect();
    assert!(names.len() >= 8 && names.iter().any(|n| n == "daemon"), "{out}");
    names
}

/// A man page: roff whose first request, after clap_mangen's string
/// definitions (`.ie`/`.el`), is `.TH TITLE 1`, with the usual sections.
fn assert_man_page(page: &str, title: &str) {
    let first = page.lines().find(|l| !l.starts_with(".ie ") && !l.starts_with(".el ")).unwrap_or_default();
    assert!(first.starts_with(&format!(".TH {title} 1 ")), "{}", &page[..page.len().min(300)]);
    for section in [".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH OPTIONS"] {
        assert!(page.contains(section), "no {section}:\n{page}");
    }
}

/// `conclave completions SHELL` prints a script for each shell that names
/// every command; `conclave man` prints a man page, for conclave and for one
/// command; an unknown shell or command is refused in words.
#[test]
fn completions_and_man_page() {
    let commands = subcommands();
    assert!(commands.iter().any(|c| c == "completions") && commands.iter().any(|c| c == "man"), "{commands:?}");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (status, out, err) = run(conclave().args(["completions", shell]));
        assert!(status.success(), "{shell}: {err}");
        assert!(out.len() > 500, "{shell}: {out}");
        assert!(out.contains("log-format") && out.contains("check-config"), "{shell}: {out}");
        if shell == "bash" {
            for c in &commands {
                assert!(out.contains(&format!("conclave,{c})")), "bash completion lacks {c}:\n{out}");
            }
            // The daemon's options are completed too.
            assert!(out.contains("--log-format") && out.contains("--check-config") && out.contains("--tcp"), "{out}");
        }
    }
    let (status, _, err) = run(conclave().args(["completions", "tcsh"]));
    assert!(!status.success() && err.contains("tcsh") && err.contains("bash"), "{err}");

    let (status, out, err) = run(conclave().arg("man"));
    assert!(status.success(), "{err}");
    assert_man_page(&out, "conclave");
    for c in &commands {
        assert!(out.contains(&format!("conclave\\-{c}(1)")), "the man page lacks {c}");
    }
    let (status, out, err) = run(conclave().args(["man", "daemon"]));
    assert!(status.success(), "{err}");
    assert_man_page(&out, "conclave-daemon");
    assert!(out.contains("log\\-format") && out.contains("check\\-config") && out.contains("\\-\\-quiet"), "{out}");
    let (status, _, err) = run(conclave().args(["man", "deamon"]));
    assert!(!status.success() && err.contains("\"deamon\"") && err.contains("daemon"), "{err}");
}

/// Starts `conclave ARGS --unix SOCKET` (ARGS with `daemon`) with `env`, waits until
/// it has been listening for a moment, stops it with SIGTERM and returns its
/// stderr.
fn daemon_stderr(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("conclave.sock");
    let log_path = dir.path().join("daemon.log");
    let mut cmd = conclave();
    cmd.args(args).arg("--unix").arg(&socket);
    cmd.envs(env.iter().copied()).stdout(Stdio::null()).stderr(File::create(&log_path).unwrap());
    let mut p = Proc::spawn(&mut cmd);
    wait_for_socket(&socket);
    // The start-up lines follow the socket at once.
    std::thread::sleep(Duration::from_millis(300));
    assert!(Command::new("kill").args(["-TERM", &p.child.id().to_string()]).status().unwrap().success());
    assert!(p.wait().success());
    std::fs::read_to_string(&log_path).unwrap()
}

/// `--log-format json`: every line the daemon logs is a JSON object with a
/// level and a message.
#[test]
fn daemon_logs_json_lines() {
    let log = daemon_stderr(&["daemon"], &[]);
    assert!(log.contains("INFO") && log.contains("listening on unix socket"), "{log}");
    assert!(serde_json::from_str::<serde_json::Value>(log.lines().next().unwrap()).is_err(), "{log}");

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("conclave.sock");
    let log_path = dir.path().join("daemon.log");
    let mut p = Proc::spawn(
        conclave()
            .args(["daemon", "--log-format", "json", "--unix"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(File::create(&log_path).unwrap()),
    );
    wait_for_socket(&socket);
    std::thread::sleep(Duration::from_millis(300));
    assert!(Command::new("kill").args(["-TERM", &p.child.id().to_string()]).status().unwrap().success());
    assert!(p.wait().success());
    let log = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}\n{log}")))
        .collect();
    assert!(lines.len() >= 3, "{log}");
    for line in &lines {
        assert!(line["level"].is_string() && line["message"].is_string() && line["timestamp"].is_string(), "{line}");
    }
    let messages: Vec<&str> = lines.iter().filter_map(|l| l["message"].as_str()).collect();
    assert!(messages.iter().any(|m| m.starts_with("listening on unix socket")), "{log}");
    assert!(messages.contains(&"shutting down"), "{log}");

    let (status, _, err) = run(conclave().args(["daemon", "--log-format", "xml", "--no-unix"]));
    assert!(!status.success() && err.contains("json") && err.contains("text"), "{err}");
}

/// The daemon's stderr on a terminal (a pseudo-terminal from `script`), with
/// `env` set.
fn daemon_on_a_terminal(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("conclave.sock");
    // The shell stops the daemon (SIGTERM) once it has been listening for a moment, so nothing outlives the
    // pseudo-terminal; the daemon's exit status is the shell's, and script's.
    let inner = format!(
        "{bin} daemon --unix {sock} & pid=$!; n=0; while [ ! -S {sock} ] && [ $n -lt 200 ]; do sleep 0.05; \
         n=$((n+1)); done; sleep 0.3; kill -TERM $pid; wait $pid",
        bin = env!("CARGO_BIN_EXE_conclave"),
        sock = socket.display()
    );
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-c", &inner, "/dev/null"]).env_remove("NO_COLOR").envs(env.iter().copied());
    cmd.env_remove("XDG_RUNTIME_DIR").env_remove("RUST_LOG");
    let (status, out, err) = run(&mut cmd);
    assert!(status.success(), "the daemon under script (util-linux) failed: {status:?} {err}\n{out}");
    assert!(out.contains("listening on unix socket") && out.contains("shutting down"), "{out}");
    out
}

/// Colour on a terminal, but never with NO_COLOR set, nor when stderr is
/// not a terminal.
#[test]
fn the_log_respects_no_color() {
    assert!(daemon_on_a_terminal(&[]).contains("\x1b["), "no colour on a terminal: the test proves nothing");
    let out = daemon_on_a_terminal(&[("NO_COLOR", "1")]);
    assert!(!out.contains("\x1b["), "escape sequences with NO_COLOR=1: {out:?}");
    assert!(!daemon_stderr(&["daemon"], &[]).contains("\x1b["));
}

/// `-q` leaves warnings and errors only, `-qqq` nothing, `-v` adds debug
/// (before or after the command); RUST_LOG, when set, wins over them; a
/// RUST_LOG that is not a filter is an error in words.
#[test]
fn verbosity_flags_and_rust_log() {
    let normal = daemon_stderr(&["daemon"], &[]);
    assert!(normal.contains(" INFO ") && normal.contains("listening on unix socket"), "{normal}");
    assert!(!normal.contains("DEBUG"), "{normal}");
    for quiet in [&["-q", "daemon"][..], &["daemon", "-q"], &["daemon", "--quiet"]] {
        let log = daemon_stderr(quiet, &[]);
        assert!(!log.contains("INFO") && !log.contains("listening"), "{quiet:?} logged INFO lines:\n{log}");
    }
    let quietest = daemon_stderr(&["daemon", "-qqq"], &[]);
    assert!(quietest.is_empty(), "{quietest}");
    let verbose = daemon_stderr(&["-v", "daemon"], &[]);
    assert!(verbose.contains(" INFO ") && !verbose.contains("TRACE"), "{verbose}");
    // RUST_LOG wins over -q and -v.
    let forced = daemon_stderr(&["daemon", "-q"], &[("RUST_LOG", "info")]);
    assert!(forced.contains("listening on unix socket"), "RUST_LOG=info did not win over -q:\n{forced}");
    let forced = daemon_stderr(&["-vv", "daemon"], &[("RUST_LOG", "warn")]);
    assert!(!forced.contains("INFO") && !forced.contains("DEBUG"), "{forced}");
    let (status, _, err) =
        run(conclave().args(["daemon", "--no-unix", "--tcp", "localhost:0"]).env("RUST_LOG", "lots=of=noise"));
    assert!(!status.success() && err.contains("RUST_LOG") && err.contains("not a log filter"), "{err}");
    let (status, _, err) = run(conclave().args(["-v", "-q", "daemon"]));
    assert!(!status.success() && err.contains("--quiet"), "{err}");
}

/// Waits for a line of the log at `path` that `pred` picks, and returns it.
fn log_line(path: &Path, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + LIMIT;
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| pred(l)) {
            return line.to_owned();
        }
        assert!(Instant::now() < deadline, "no {what} in the log:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--tcp` and `--tls-listen` (and the configuration file's addresses) take
/// host names, resolved at start; on loopback there is no warning; a bad
/// port or a missing host is refused in words.
#[test]
fn tcp_and_tls_listen_take_host_names() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("tcp.log");
    let _daemon = Proc::spawn(
        conclave()
            .args(["daemon", "--no-unix", "--tcp", "localhost:0"])
            .stdout(Stdio::null())
            .stderr(File::create(&log_path).unwrap()),
    );
    let line = log_line(&log_path, "tcp listener", |l| l.contains("listening on tcp "));
    let addr: std::net::SocketAddr = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{line}");
    std::net::TcpStream::connect(addr).expect("connect to the daemon's TCP address");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains("WARN"), "a warning for loopback:\n{log}");

    let pki = Pki::new();
    pki.issue("daemon", &["localhost"]);
    let tls_log = pki.path("tls.log");
    let config = pki.path("conclave.toml");
    let file = |name: &str| format!("{:?}", pki.path(name).display().to_string());
    std::fs::write(
        &config,
        format!(
            "[listen]\nunix = false\ntcp = \"localhost:0\"\n\n[tls]\nlisten = \"localhost:0\"\ncert = {}\nkey = {}\n",
            file("daemon.crt"),
            file("daemon.key")
        ),
    )
    .unwrap();
    let _tls = Proc::spawn(
        conclave()
            .arg("daemon")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(File::create(&tls_log).unwrap()),
    );
    let line = log_line(&tls_log, "tls listener", |l| l.contains("listening on tls "));
    assert!(line.contains("127.0.0.1:") && line.contains("no client certificates"), "{line}");
    log_line(&tls_log, "tcp listener", |l| l.contains("listening on tcp 127.0.0.1:"));
    let log = std::fs::read_to_string(&tls_log).unwrap();
    assert!(!log.contains("WARN"), "a warning for loopback:\n{log}");

    for (addr, says) in
        [("localhost:99999", "not a port"), ("localhost:http", "not a port"), (":4803", "no host"), ("", "empty")]
    {
        let (status, _, err) = run(conclave().args(["daemon", "--no-unix", "--tcp", addr]));
        assert!(!status.success() && err.contains("--tcp") && err.contains(says), "{addr}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    std::fs::write(&config, "[listen]\nunix = false\ntcp = \"localhost:65536\"\n").unwrap();
    let (status, _, err) = run(conclave().arg("daemon").arg("--config").arg(&config));
    assert!(!status.success() && err.contains("[listen] tcp") && err.contains("not a port"), "{err}");
}

/// `conclave daemon --check-config FILE`: 0 and a summary for a file the
/// daemon could start with (nothing started, no socket made), 1 and what is
/// wrong, once, for one it could not.
#[test]
fn daemon_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("checked.sock");
    let config = dir.path().join("conclave.toml");
    std::fs::write(&config, format!("[listen]\nunix = {:?}\ntcp = \"localhost\"\n", socket.display().to_string()))
        .unwrap();
    let (status, out, err) = run(conclave().arg("daemon").arg("--check-config").arg(&config));
    assert!(status.success(), "{err}");
    assert!(out.contains(": ok") && out.contains(&socket.display().to_string()), "{out}");
    assert!(out.contains("tcp 127.0.0.1:4803") && out.contains("standalone"), "{out}");
    assert!(!socket.exists(), "--check-config made the socket");

    for (text, says) in [
        ("[limits]\nqueue_deep = 3\n", &["unknown field", "queue_deep", "line 2"][..]),
        ("[limits]\nqueue_depth = \"many\"\n", &["queue_depth", "line 2"]),
        ("[listen]\nunix = 3\n", &["a socket path (a string) or false"]),
        ("[listen]\nunix = false\n[tls]\nlisten = \"localhost\"\n", &["--tls-cert", "127.0.0.1:4804"]),
        ("[listen]\nunix = false\n", &["no listener"]),
        ("[listen]\nunix = \"/x.sock\"\n[limits]\nqueue_bytes = 1000\n", &["queue_bytes", "at least 1049600 bytes"]),
        ("[listen]\nunix = \"/x.sock\"\n[limits]\nmax_connections = 0\n", &["max_connections", "at least 1"]),
        ("backbone = \"ring\"\n", &["backbone", "standalone", "cluster"]),
        ("[unix_names]\n1000 = [\"alice\"]\n[listen]\nunix = \"/x.sock\"\n", &["no client CA"]),
    ] {
        std::fs::write(&config, text).unwrap();
        let (status, out, err) = run(conclave().arg("daemon").arg("--check-config").arg(&config));
        assert_eq!(status.code(), Some(1), "{text}: {out} {err}");
        assert!(out.is_empty(), "{text}: {out}");
        for s in says {
            assert!(err.contains(s), "{text}: no {s:?} in {err}");
        }
        assert!(!err.contains("UnixSetting") && !err.contains("FileConfig"), "{err}");
    }
    let (status, _, err) = run(conclave().arg("daemon").arg("--check-config").arg(dir.path().join("missing.toml")));
    assert_eq!(status.code(), Some(1));
    assert!(err.contains("cannot read configuration file") && err.contains("missing.toml"), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
}

/// docs/conclave.toml passes `--check-config` and names every key of the
/// configuration file that the daemon's documentation lists.
#[test]
fn the_sample_configuration_is_complete_and_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let sample_path = root.join("docs/conclave.toml");
    let (status, out, err) = run(conclave().arg("daemon").arg("--check-config").arg(&sample_path));
    assert!(status.success(), "{err}");
    assert!(out.contains("unix socket /run/conclave/conclave.sock"), "{out}");
    let sample = std::fs::read_to_string(&sample_path).unwrap();
    let source = std::fs::read_to_string(root.join("crates/conclave/src/daemon.rs")).unwrap();
    let documented: Vec<&str> = source
        .lines()
        .filter_map(|l| l.strip_prefix("//! "))
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim()))
        .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect();
    assert!(documented.len() >= 20, "{documented:?}");
    for key in documented {
        let set = |l: &str| l.trim_start_matches('#').starts_with(&format!("{key} = "));
        assert!(sample.lines().any(set), "docs/conclave.toml lacks {key}");
    }
}

/// A daemon started with the configuration file `text` (its Unix socket is
/// added), logging to a file.
fn daemon_with_config(text: &str) -> TestDaemon {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("conclave.sock");
    let config = dir.path().join("conclave.toml");
    std::fs::write(&config, format!("[listen]\nunix = {:?}\n{text}", socket.display().to_string())).unwrap();
    let log = File::create(dir.path().join("daemon.log")).unwrap();
    let proc = Proc::spawn(conclave().arg("daemon").arg("--config").arg(&config).stderr(log).stdout(Stdio::null()));
    wait_for_socket(&socket);
    TestDaemon { proc, dir, socket }
}

/// This process's Unix user (the daemon's and the clients').
fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid()
}

/// `conclave status` shows the daemon's groups, members and connections,
/// as text and as JSON, to the daemon's own user; a client over TCP, which
/// is not an operator, is refused in words and sees no group.
#[test]
fn status_shows_what_the_daemon_holds_and_refuses_strangers() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let d = daemon_with_config(&format!("tcp = \"127.0.0.1:{port}\"\n[limits]\nqueue_depth = 99\n"));
    let mut alice = d.client("alice", "join-open lobby\nwait lobby 2\nwait-msgs lobby 1\n");
    // Either join may come first and create the group: both ask for it open.
    let (_, out, _) = d.client("bob", "join-open lobby\nwait lobby 2\n").finish();
    assert!(out.contains("of lobby"), "{out}");
    // bob has left; alice is still there, waiting for a message.
    std::thread::sleep(Duration::from_millis(200));
    let (status, out, err) = run(conclave().arg("status").arg("--unix").arg(&d.socket));
    assert!(status.success(), "{err}");
    assert!(out.starts_with("daemon 0 (standalone), up "), "{out}");
    assert!(has_line(&out, |l| l.starts_with("  lobby [open] v") && l.ends_with(": alice")), "{out}");
    assert!(has_line(&out, |l| l.contains(" alice (unix: uid ") && l.contains(", 1 group,")), "{out}");
    assert!(out.contains("queue_depth=99"), "{out}");
    assert!(out.contains("no access rules"), "{out}");

    let (status, out, err) = run(conclave().arg("status").arg("--json").arg("--unix").arg(&d.socket));
    assert!(status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["groups"][0]["name"], "lobby");
    assert_eq!(v["groups"][0]["members"], serde_json::json!(["alice"]));
    assert_eq!(v["limits"]["queue_depth"], 99);
    assert_eq!(v["counters"]["clients"], 1);
    assert_eq!(v["backbone"], "standalone");

    let (status, out, err) = run(conclave().arg("status").arg("--tcp").arg(format!("127.0.0.1:{port}")));
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(err.contains("refused to give its status (AccessDenied)"), "{err}");
    assert!(!err.contains("lobby") && !err.contains("alice"), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(d.log().contains("may not read the daemon's status"), "{}", d.log());

    let (status, _, err) = run(conclave().arg("status").arg("--unix").arg(d.dir.path().join("none.sock")));
    assert_eq!(status.code(), Some(1));
    assert!(err.contains("no such socket (is `conclave daemon` running?)"), "{err}");
    drop(alice.child.stdin.take());
    let _ = alice.child.kill();
}

/// `[[access]]` rules: a refused join and send reach `conclave client` as
/// AccessDenied in words, the daemon logs them, and `conclave status` shows
/// the rules in force.
#[test]
fn access_rules_refuse_in_words_log_and_show_in_status() {
    let uid = my_uid();
    let d = daemon_with_config(&format!(
        "[[access]]\ngroups = \"chat\"\ncreate = [\"uid:{uid}\"]\njoin = [\"uid:{uid}\"]\nsend = [\"uid:4242\"]\n"
    ));
    let (_, out, err) =
        d.client("carol", "join chat\nwait chat 1\nsend chat hello\njoin elsewhere\nsleep 300\n").finish();
    assert!(has_line(&out, |l| l.starts_with("view v") && l.ends_with(" of chat (join): carol")), "{out}\n{err}");
    assert!(
        has_line(&out, |l| l.starts_with("error (AccessDenied): you may not send to group chat")
            && l.contains(&format!("Unix user {uid}"))),
        "{out}"
    );
    assert!(has_line(&out, |l| l.starts_with("error (AccessDenied): you may not join group elsewhere")), "{out}");
    assert!(!out.contains("] carol: hello"), "the refused message was delivered:\n{out}");
    let log = d.log();
    assert!(log.contains("access denied") && log.contains("may not send to the group"), "{log}");
    assert!(log.contains("may not create the group"), "{log}");
    let (status, out, err) = run(conclave().arg("status").arg("--unix").arg(&d.socket));
    assert!(status.success(), "{err}");
    assert!(out.contains(&format!("groups chat: create: uid:{uid}; join: uid:{uid}; send: uid:4242")), "{out}");
    assert!(out.contains("any other group: no one may create, join or send to it"), "{out}");
}

/// `--check-config` prints the access rules and operators, warns of name
/// entries a daemon without client certificates can never match, and
/// refuses bad entries in words.
#[test]
fn check_config_validates_access_rules_and_operators() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("conclave.toml");
    let good = "[listen]\nunix = \"/x.sock\"\n[status]\noperators = [\"uid:1001\"]\n\
                [[access]]\ngroups = \"ops-*\"\ncreate = [\"alice\"]\njoin = [\"bot-*\", \"uid:1000\"]\n\
                [[access]]\ngroups = \"*\"\njoin = [\"*\"]\nsend = [\"*\"]\n";
    std::fs::write(&config, good).unwrap();
    let (status, out, err) = run(conclave().arg("daemon").arg("--check-config").arg(&config));
    assert!(status.success(), "{err}");
    assert!(out.contains("access: 2 rules, first match decides"), "{out}");
    assert!(out.contains("1. groups ops-*: create: alice; join: bot-*, uid:1000; send: no one"), "{out}");
    assert!(out.contains("2. groups *: create: no one; join: *; send: *"), "{out}");
    assert!(out.contains("status: the daemon's own Unix user and root, and uid:1001"), "{out}");
    assert!(out.contains("warning: [[access]] rule 1 (groups ops-*) names member names"), "{out}");
    assert!(!out.lines().any(|l| l.trim_start().contains("  ")), "a message with a run of spaces: {out}");

    for (text, says) in [
        ("[[access]]\ngroups = \"g\"\njoin = [\"uid:me\"]\n", &["rule 1", "join", "Unix user id"][..]),
        ("[[access]]\ngroups = \"a b\"\n", &["rule 1", "not a group name"]),
        ("[[access]]\ngroups = \"g\"\nsend = [\"bad name\"]\n", &["send", "not a member name"]),
        ("[[access]]\ngroups = \"g\"\nreed = [\"*\"]\n", &["unknown field", "reed"]),
        ("[[access]]\njoin = [\"*\"]\n", &["missing field", "groups"]),
        ("[status]\noperators = [\"uid:-1\"]\n", &["[status] operators", "Unix user id"]),
    ] {
        std::fs::write(&config, format!("[listen]\nunix = \"/x.sock\"\n{text}")).unwrap();
        let (status, out, err) = run(conclave().arg("daemon").arg("--check-config").arg(&config));
        assert_eq!(status.code(), Some(1), "{text}: {out} {err}");
        for s in says {
            assert!(err.contains(s), "{text}: no {s:?} in {err}");
        }
        assert!(!err.contains("FileRule") && !err.contains("FileStatus"), "{err}");
    }
}

/// Every line of `out` as JSON.
fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

/// `--json` on client, flood, keys list and demo: every line of output is
/// one JSON object, with the fields their help names.
#[test]
fn client_flood_keys_list_and_demo_speak_json() {
    let d = TestDaemon::start();
    let mut client = Proc::spawn(
        conclave()
            .args(["client", "--json", "--name", "jay", "--unix"])
            .arg(&d.socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let script = "join g\nwait g 1\nsend g hi \u{1b}[2J\nwait-msgs g 1\nfrobnicate\nleave g\n";
    client.child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let (_, out, err) = client.finish();
    let events = json_lines(&out);
    let kinds: Vec<&str> = events.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["view", "message", "command_error", "left"], "{out}\n{err}");
    assert_eq!(events[0]["group"], "g");
    assert_eq!(events[0]["members"], serde_json::json!(["jay"]));
    assert_eq!(events[0]["cause"], "join");
    assert_eq!(events[1]["sender"], "jay");
    assert_eq!(events[1]["service"], "agreed");
    // The text as sent: JSON escapes what a terminal would act on.
    assert_eq!(events[1]["text"], "hi \u{1b}[2J");
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(events[2]["text"].as_str().unwrap().contains("unknown command \"frobnicate\""), "{out}");

    let (status, out, err) = run(conclave()
        .args(["flood", "--json", "--count", "50", "--senders", "2", "--sizes", "64,256", "--unix"])
        .arg(&d.socket));
    assert!(status.success(), "{err}");
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for (row, size) in rows.iter().zip([64, 256]) {
        assert_eq!(
            (row["size"].as_u64(), row["senders"].as_u64(), row["messages"].as_u64()),
            (Some(size), Some(2), Some(100))
        );
        for key in ["seconds", "msg_per_s", "mb_per_s", "p50_ms", "p99_ms", "max_ms"] {
            assert!(row[key].as_f64().is_some_and(|v| v >= 0.0), "{key}: {row}");
        }
    }

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("keys");
    let keys = |args: &[&str]| {
        let (status, out, err) = run(conclave().arg("keys").args(args).arg("--dir").arg(&dir));
        assert!(status.success(), "keys {args:?}: {err}");
        out
    };
    keys(&["authority"]);
    keys(&["issue", "alice"]);
    keys(&["issue", "bob"]);
    keys(&["revoke", "bob"]);
    let list: serde_json::Value = serde_json::from_str(&keys(&["list", "--json"])).unwrap();
    assert!(list["authority"].as_str().unwrap().ends_with("authority.crt"), "{list}");
    let members = list["members"].as_array().unwrap();
    let status_of = |name: &str| members.iter().find(|m| m["name"] == name).map(|m| m["status"].clone());
    assert_eq!(status_of("alice"), Some(serde_json::json!("valid")), "{list}");
    assert_eq!(status_of("bob"), Some(serde_json::json!("revoked")), "{list}");
    assert!(members.iter().all(|m| m["serial"].is_string() && m["not_after"].is_string()), "{list}");

    let (status, out, err) = run(conclave().args(["demo", "--json", "--protocols", "tgdh"]));
    assert!(status.success(), "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines[0]["event"], "daemon", "{out}");
    assert_eq!(lines[1]["event"], "protocol");
    assert_eq!(lines[1]["protocol"], "tgdh");
    assert!(
        lines.iter().any(|l| l["event"] == "view"
            && l["who"] == "alice"
            && l["members"].as_array().is_some_and(|m| m.len() == 4)),
        "{out}"
    );
    assert!(lines.iter().any(|l| l["event"] == "message" && l["text"] == "dave here"), "{out}");
    assert!(lines.iter().any(|l| l["event"] == "refused" && l["member"] == "mallory" && l["who"] == "bob"), "{out}");
}

/// docs/conclave.service starts the daemon with a command line this
/// version takes (checked on the sample configuration), as an unprivileged
/// user, with the sample's socket inside the runtime directory it makes.
#[test]
fn the_systemd_unit_runs_a_command_this_version_takes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let unit = std::fs::read_to_string(root.join("docs/conclave.service")).unwrap();
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("docs/conclave.service has no {key}="))
            .to_owned()
    };
    let exec = value("ExecStart");
    let words: Vec<&str> = exec.split_whitespace().collect();
    assert!(words[0].ends_with("/conclave") && words[1] == "daemon", "{exec}");
    let at = words.iter().position(|w| *w == "--config").expect("ExecStart names its configuration");
    let mut args: Vec<String> = words[1..].iter().map(|w| w.to_string()).collect();
    // The unit's configuration path, replaced by the sample it is made from.
    args[at - 1] = "--check-config".into();
    args[at] = root.join("docs/conclave.toml").display().to_string();
    let (status, out, err) = run(conclave().args(&args));
    assert!(status.success(), "{args:?}: {err}");
    let runtime = format!("/run/{}/", value("RuntimeDirectory"));
    assert!(out.contains(&format!("unix socket {runtime}")), "the sample's socket is not in {runtime}: {out}");
    assert_ne!(value("User"), "root");
    assert!(value("ExecReload").contains("-HUP"), "reload is SIGHUP");
    assert!(value("LimitNOFILE").parse::<u64>().unwrap() >= 4096);
}

/// Secret keys protected by a passphrase: `keys authority --passphrase-file`
/// writes an `ENCRYPTED PRIVATE KEY` that does not hold the plain key; `keys
/// issue` then works only with the authority's passphrase (none, wrong:
/// clear errors, nothing issued); `--member-passphrase-env` protects the
/// member's key, which `chat` and `client` open only with its passphrase,
/// and an unprotected key works as before.
#[test]
fn keys_protected_by_a_passphrase() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("keys");
    let pass = t.path().join("authority.pass");
    std::fs::write(&pass, "authority secret\n").unwrap();
    let wrong = t.path().join("wrong.pass");
    std::fs::write(&wrong, "not it\n").unwrap();
    let keys = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = conclave();
        c.arg("keys").args(args).arg("--dir").arg(&dir).envs(env.iter().copied());
        run(&mut c)
    };
    let (status, out, err) = keys(&["authority", "--passphrase-file", pass.to_str().unwrap()], &[]);
    assert!(status.success() && out.contains("protected by a passphrase"), "{out}\n{err}");
    let key = std::fs::read_to_string(dir.join("authority.key")).unwrap();
    assert!(key.starts_with("-----BEGIN ENCRYPTED PRIVATE KEY-----\n"), "{key}");
    assert!(!key.contains("BEGIN PRIVATE KEY"), "{key}");

    // No passphrase (stdin is not a terminal): refused, and says how.
    let (status, _, err) = keys(&["issue", "alice"], &[]);
    assert!(!status.success(), "issued without the authority's passphrase");
    assert!(
        err.contains("authority.key is protected by a passphrase: give --passphrase-file or --passphrase-env, or run on a terminal"),
        "{err}"
    );
    assert_eq!(err.matches("protected by a passphrase").count(), 1, "said once: {err}");
    let (status, _, err) = keys(&["issue", "alice", "--passphrase-file", wrong.to_str().unwrap()], &[]);
    assert!(!status.success() && err.contains("wrong passphrase for") && err.contains("authority.key"), "{err}");
    assert!(!dir.join("members/alice.crt").exists(), "a certificate was issued without the right passphrase");
    let (status, _, err) = keys(&["revoke", "alice"], &[]);
    assert!(!status.success(), "{err}");

    // The right passphrase (by file, by environment); alice's own key protected by another one.
    let (status, out, err) = keys(
        &["issue", "alice", "--passphrase-file", pass.to_str().unwrap(), "--member-passphrase-env", "ALICE_PASS"],
        &[("ALICE_PASS", "alice's secret")],
    );
    assert!(status.success() && out.contains("issued alice"), "{out}\n{err}");
    let alice_key = std::fs::read_to_string(dir.join("members/alice.key")).unwrap();
    assert!(alice_key.starts_with("-----BEGIN ENCRYPTED PRIVATE KEY-----\n"), "{alice_key}");
    let (status, _, err) = keys(&["issue", "bob", "--passphrase-env", "CA_PASS"], &[("CA_PASS", "authority secret")]);
    assert!(status.success(), "{err}");
    assert!(std::fs::read_to_string(dir.join("members/bob.key")).unwrap().starts_with("-----BEGIN PRIVATE KEY-----"));
    let (status, out, err) = keys(&["list"], &[]);
    assert!(status.success() && out.contains("alice") && out.contains("bob"), "{out}\n{err}");

    // chat and client open alice's key only with its passphrase. Port 1 has no daemon: getting as far
    // as connecting shows the key was opened.
    let chat = |extra: &[&str], env: &[(&str, &str)]| {
        let mut c = conclave();
        c.args(["chat", "--name", "alice", "--group", "room", "--tls", "127.0.0.1:1", "--keys"])
            .arg(&dir)
            .args(extra)
            .envs(env.iter().copied());
        run(&mut c)
    };
    let alice_key_path = dir.join("members/alice.key");
    let (status, _, err) = chat(&[], &[]);
    let expected = format!(
        "{} is protected by a passphrase: give --passphrase-file or --passphrase-env, or run on a terminal",
        alice_key_path.display()
    );
    assert!(!status.success() && err.contains(&expected), "{err}");
    let (status, _, err) = chat(&["--passphrase-env", "P"], &[("P", "authority secret")]);
    assert!(!status.success() && err.contains("wrong passphrase for") && err.contains("alice.key"), "{err}");
    let (status, _, err) = chat(&["--passphrase-env", "P"], &[("P", "alice's secret")]);
    assert!(!status.success() && err.contains("cannot connect") && !err.contains("passphrase"), "{err}");

    let client = |name: &str, extra: &[&str], env: &[(&str, &str)]| {
        let mut c = conclave();
        c.args(["client", "--name", name, "--tls", "127.0.0.1:1", "--ca"])
            .arg(dir.join("authority.crt"))
            .arg("--cert")
            .arg(dir.join(format!("members/{name}.crt")))
            .arg("--key")
            .arg(dir.join(format!("members/{name}.key")))
            .args(extra)
            .envs(env.iter().copied());
        run(&mut c)
    };
    let (status, _, err) = client("alice", &[], &[]);
    assert!(!status.success() && err.contains(&expected), "{err}");
    let (status, _, err) = client("alice", &["--passphrase-file", wrong.to_str().unwrap()], &[]);
    assert!(!status.success() && err.contains("wrong passphrase for"), "{err}");
    let (status, _, err) = client("alice", &["--passphrase-env", "P"], &[("P", "alice's secret")]);
    assert!(!status.success() && err.contains("cannot connect") && !err.contains("passphrase"), "{err}");
    // An unprotected key needs no passphrase, and ignores one given.
    let (status, _, err) = client("bob", &[], &[]);
    assert!(!status.success() && err.contains("cannot connect") && !err.contains("passphrase"), "{err}");
    let (status, _, err) = client("bob", &["--passphrase-env", "P"], &[("P", "x")]);
    assert!(!status.success() && err.contains("cannot connect"), "{err}");
}

/// Runs `cmd` to its end within `limit`, reading its output as it runs.
fn run_within(cmd: &mut Command, limit: Duration) -> (ExitStatus, String, String) {
    let mut p = Proc::spawn(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()));
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                p.read_to_string(&mut text).unwrap();
            }
            text
        })
    };
    let out = drain(p.child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let err = drain(p.child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "process {} did not exit within {limit:?}", p.child.id());
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, out.join().unwrap(), err.join().unwrap())
}

/// `bench soak` at a small size: a daemon child, 40 certified clients with
/// churn and traffic in 8 groups, every attack in turn. The table has a row
/// per phase and a total; nothing well-behaved is lost or duplicated, every
/// phase delivered messages, the daemon's RSS and descriptors were read, and
/// each attack got the answer it must (pass). With --json, the same in one
/// object, and the daemon's temporary directory is gone after either run.
#[test]
fn bench_soak_runs_small_with_nothing_lost_and_every_attack_answered() {
    let before = soak_dirs();
    let (status, out, err) = run_within(
        conclave().args(["bench", "soak", "--clients", "40", "--groups", "8", "--duration", "8s", "--rate", "4"]),
        Duration::from_secs(120),
    );
    assert!(status.success(), "{out}\n{err}");
    let cells = |l: &str| l.split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
    let header = out.lines().find(|l| l.starts_with("| phase")).unwrap_or_else(|| panic!("no table:\n{out}"));
    let columns = cells(header);
    let col = |name: &str| columns.iter().position(|c| c == name).unwrap_or_else(|| panic!("no column {name}:\n{out}"));
    let rows: Vec<Vec<String>> =
        out.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| phase")).map(cells).collect();
    let phases: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(
        phases,
        [
            "no-attack",
            "tls-handshake-flood",
            "never-reads",
            "connection-exhaustion",
            "incomplete-frame",
            "name-squatting",
            "total"
        ],
        "{out}"
    );
    let num = |r: &Vec<String>, c: &str| r[col(c)].parse::<f64>().unwrap_or_else(|_| panic!("{c} in {r:?}"));
    for r in &rows {
        assert_eq!(num(r, "lost"), 0.0, "{out}");
        assert_eq!(num(r, "duplicated"), 0.0, "{out}");
        assert!(num(r, "sent") > 0.0 && num(r, "delivered") >= num(r, "sent"), "{out}");
        assert!(num(r, "p50 ms") > 0.0 && num(r, "p50 ms") <= num(r, "p99 ms"), "{out}");
        assert!(num(r, "daemon RSS MiB") > 1.0 && num(r, "daemon fds") >= 40.0, "{out}");
        if r[1] != "no-attack" && r[1] != "total" {
            assert_eq!(r[col("attack")], "pass", "{out}");
            let (answered, should) = r[col("refused/cut off")].split_once('/').unwrap();
            assert_eq!(answered, should, "{out}");
            assert!(num(r, "attack cycles") >= 1.0, "{out}");
        }
    }
    // The flood's idle sockets (1100) show in the daemon's descriptors, sampled while they are held.
    assert!(num(&rows[1], "daemon fds") > num(&rows[0], "daemon fds") + 200.0, "{out}");

    let (status, out, err) = run_within(
        conclave().args(["bench", "soak", "--clients", "12", "--groups", "3", "--duration", "6s", "--json"]),
        Duration::from_secs(120),
    );
    assert!(status.success(), "{out}\n{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let phases = report["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 7, "{out}");
    let total = &phases[6];
    assert_eq!(total["phase"], "total");
    assert_eq!((total["lost"].as_u64(), total["duplicated"].as_u64()), (Some(0), Some(0)), "{out}");
    assert!(total["delivered"].as_u64().unwrap() >= total["sent"].as_u64().unwrap(), "{out}");
    assert!(report["daemon_rss_hwm_mib"].as_f64().unwrap() > 1.0, "{out}");
    assert_eq!(soak_dirs(), before, "a soak left its temporary directory behind");
}

/// The soak's temporary directories present now.
fn soak_dirs() -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("conclave-soak-"))
        .collect();
    dirs.sort();
    dirs
}
