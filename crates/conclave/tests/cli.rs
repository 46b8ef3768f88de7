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
    fn finish(&mut self) -> (ExitStatus, String, String) {
        let status = self.wait();
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut s) = self.child.stdout.take() {
            s.read_to_string(&mut out).unwrap();
        }
        if let Some(mut s) = self.child.stderr.take() {
            s.read_to_string(&mut err).unwrap();
        }
        (status, out, err)
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
    for (cmd, needle) in [("daemon", "--config"), ("client", "join-open"), ("client", "unicast"), ("flood", "--sizes")]
    {
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
    assert!(err.contains("already exists") && err.contains("rm "), "{err}");
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

#[test]
fn daemon_reads_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("from-config.sock");
    let config = dir.path().join("conclave.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\nunix = {:?}\n\n[limits]\nmax_message_size = 100\nqueue_depth = 64\n",
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
