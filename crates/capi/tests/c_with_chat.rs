//! The C example joins a group with two `conclave chat` members and they
//! exchange messages: alice and bob are real `conclave chat --web`
//! processes (certified from the test's key directory, as a user runs them;
//! driven over their web page's HTTP interface, no browser needed), carol is
//! `examples/chat_pair.c` with bob as its peer. Every one of them must
//! receive the others' messages.
//!
//! It runs the `conclave` binary of the same target directory
//! (`target/<profile>/conclave`), which `cargo nextest run --workspace`
//! builds but `cargo test -p conclave-capi` does not, so it is ignored in
//! the normal run and `.ci/run` runs it after the workspace's tests:
//! `cargo nextest run -p conclave-capi --run-ignored ignored-only -E 'binary(c_with_chat)'`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::cbuild::{build_example, finish, lib_dir};
use common::World;

/// How long a chat member may take to show what is expected.
const WAIT: Duration = Duration::from_secs(30);

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `conclave` binary next to this test's target directory.
fn conclave_exe() -> PathBuf {
    let exe = lib_dir().parent().unwrap().join("conclave");
    assert!(
        exe.exists(),
        "no conclave binary at {} (build it first: cargo build -p conclave; cargo nextest run --workspace does)",
        exe.display()
    );
    exe
}

/// A `conclave chat --web` member; its page's port and token.
struct ChatMember {
    _proc: Proc,
    name: &'static str,
    port: u16,
    token: String,
}

impl ChatMember {
    fn start(exe: &Path, name: &'static str, w: &World, policy: &str) -> ChatMember {
        let err = w.dir.path().join(format!("{name}.err"));
        let mut child = Command::new(exe)
            .env_remove("RUST_LOG")
            .args(["chat", "--web", "--name", name, "--group", "room", "--policy", policy, "--unix"])
            .arg(&w.socket)
            .arg("--keys")
            .arg(&w.keys)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(i) = line.find("http://") {
                    let _ = tx.send(line[i..].split_whitespace().next().unwrap_or_default().to_owned());
                }
            }
        });
        let proc = Proc(child);
        let url = rx.recv_timeout(WAIT).unwrap_or_else(|_| {
            panic!("{name} printed no URL; stderr:\n{}", std::fs::read_to_string(&err).unwrap_or_default())
        });
        // http://127.0.0.1:PORT/?token=TOKEN
        let rest = url.strip_prefix("http://127.0.0.1:").unwrap_or_else(|| panic!("{name}'s URL {url}"));
        let (port, query) = rest.split_once('/').unwrap();
        let token = query.split_once("token=").unwrap().1.to_owned();
        ChatMember { _proc: proc, name, port: port.parse().unwrap(), token }
    }

    /// Types `line` into the chat (the page's POST /send).
    fn say(&self, line: &str) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "POST /send HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Conclave-Token: {}\r\nContent-Type: text/plain\r\n\
             Connection: close\r\nContent-Length: {}\r\n\r\n{line}",
            self.port,
            self.token,
            line.len()
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 2"), "{}: /send answered {out}", self.name);
    }

    /// Reads the page's event stream until a snapshot contains every one of
    /// `want`; returns it. Panics with the last snapshot after [`WAIT`].
    fn until(&self, want: &[&str]) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        write!(
            s,
            "GET /events HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Conclave-Token: {}\r\nConnection: close\r\n\r\n",
            self.port, self.token
        )
        .unwrap();
        let deadline = Instant::now() + WAIT;
        let mut stream = String::new();
        let mut buf = [0u8; 65536];
        loop {
            let last = stream.rsplit("data:").next().unwrap_or_default();
            let complete = last.contains("\n\n") || last.ends_with('\n');
            if complete && want.iter().all(|w| last.contains(w)) {
                return last.to_owned();
            }
            assert!(Instant::now() < deadline, "{} never showed {want:?}; last snapshot:\n{last}", self.name);
            match s.read(&mut buf) {
                Ok(0) => panic!("{}: the event stream ended", self.name),
                Ok(n) => stream.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("{}: reading the event stream: {e}", self.name),
            }
        }
    }
}

/// Runs the C example as carol, with two chat members, under `policy`.
fn c_member_and_two_chat_members(policy: &str) {
    let w = World::new(&["alice", "bob", "carol"]);
    let exe = build_example(w.dir.path());
    let conclave = conclave_exe();
    let alice = ChatMember::start(&conclave, "alice", &w, policy);
    alice.until(&[r#""members":["alice"]"#, r#""key_state":"keyed""#]);
    let bob = ChatMember::start(&conclave, "bob", &w, policy);
    for m in [&alice, &bob] {
        m.until(&[r#""members":["alice","bob"]"#]);
    }
    let carol = Command::new(&exe)
        .arg(&w.socket)
        .arg("carol")
        .arg(&w.keys)
        .args(["room", "bob", policy])
        // The rpath to the library built with this test decides (see c_example.rs).
        .env_remove("LD_LIBRARY_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once carol is in their secure view, both chat members write.
    for m in [&alice, &bob] {
        m.until(&[r#""members":["alice","bob","carol"]"#]);
        m.say(&format!("hello from {}", m.name));
    }
    let out = finish(carol, Duration::from_secs(90));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "chat_pair failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "carol: members: alice bob carol",
        "carol: received from bob: hello from bob",
        "carol: received from carol: hello from carol",
        "carol: left room",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} missing from:\n{stdout}");
    }
    // The chat members read carol's message, and each other's; carol's
    // leave shows in their views.
    for m in [&alice, &bob] {
        let other = if m.name == "alice" { "bob" } else { "alice" };
        m.until(&[
            r#""sender":"carol","text":"hello from carol""#,
            &format!(r#""sender":"{other}","text":"hello from {other}""#),
            r#""members":["alice","bob"]"#,
        ]);
    }
}

#[test]
#[ignore = "runs the conclave binary, which the workspace build makes; .ci/run runs it"]
fn the_c_example_and_two_chat_members_exchange_messages() {
    c_member_and_two_chat_members("tgdh");
}

#[test]
#[ignore = "runs the conclave binary, which the workspace build makes; .ci/run runs it"]
fn the_c_example_and_two_chat_members_exchange_messages_under_interval_rekeying() {
    c_member_and_two_chat_members("queue-batch:500ms");
}
