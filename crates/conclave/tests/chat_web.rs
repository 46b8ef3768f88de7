//! The web Chatter in a real browser, side by side with the terminal one:
//! one daemon, two `conclave chat --web` members (alice, bob) driven in
//! headless Chromium over WebDriver (chromedriver + fantoccini), one terminal
//! member (carol, in tmux), and a revoked one (mallory, in tmux).
//!
//! It checks that typed messages appear on all three with the same key
//! fingerprint everywhere; that `<script>` shows as text and runs nowhere;
//! that input history works on the page; that the revoked member is shown as
//! refused with its reason; that a web member's `/leave` shows a rekey with
//! its duration on the others; and that the server refuses a request
//! without the token, with a foreign Host (a DNS-rebound name, in the
//! browser and raw) or with a foreign Origin (a cross-origin post from the
//! browser must not reach the chat). Screenshots of the pages (and the
//! terminal's screen as text) go to a directory the test prints.
//!
//! Ignored by default (it needs `chromium`, `chromium-driver` and `tmux`,
//! and takes a while); `.ci/run` runs it:
//! `cargo nextest run -p conclave --run-ignored ignored-only -E 'binary(chat_web)'`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};

mod common;
use common::{installed, sh_quote, Proc, Tmux};

/// How long one page or screen may take to show what is expected.
const WAIT: Duration = Duration::from_secs(30);

/// A name the browser resolves to loopback, as a DNS rebinding attack would.
const REBOUND: &str = "rebind.test";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `conclave chat --web` as `name`; returns it and the URL it prints.
fn web_chat(exe: &Path, name: &str, socket: &Path, keys: &Path, dir: &Path) -> (Proc, String) {
    let mut child = Command::new(exe)
        .env_remove("RUST_LOG")
        .args(["chat", "--web", "--create-identity", "--name", name, "--group", "room", "--unix"])
        .arg(socket)
        .arg("--keys")
        .arg(keys)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(dir.join(format!("{name}.err"))).unwrap())
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
    let url = rx.recv_timeout(WAIT).unwrap_or_else(|_| {
        let err = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
        panic!("{name} printed no URL; stderr:\n{err}")
    });
    (Proc(child), url)
}

/// One raw HTTP request to `port`; returns the status code and the whole response.
fn raw(port: u16, head: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    write!(s, "{head}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    (text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), text)
}

/// Another origin on loopback: a page of its own on a free port (returned).
fn another_site() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = "<!doctype html><title>other</title><p>another site</p>";
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// A headless Chromium of its own (own profile), through chromedriver.
async fn browser(driver: &str) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1000,620", "--hide-scrollbars", "--lang=en-US",
                format!("--host-resolver-rules=MAP {REBOUND} 127.0.0.1"),
            ],
        }),
    );
    ClientBuilder::native().capabilities(caps).connect(driver).await.expect("a Chromium session from chromedriver")
}

/// The text of the first element matching `css`.
async fn text(c: &Client, css: &str) -> String {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Polls the page until `css`'s text holds every one of `want`; returns it.
async fn until(c: &Client, who: &str, css: &str, want: &[&str]) -> String {
    let start = Instant::now();
    loop {
        let t = text(c, css).await;
        if want.iter().all(|w| t.contains(w)) {
            return t;
        }
        if start.elapsed() > WAIT {
            let body = text(c, "body").await;
            panic!("{who}: timed out waiting for {want:?} in {css}; page:\n{body}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Types a line into the page's input box and sends it.
async fn say(c: &Client, line: &str) {
    c.find(Locator::Css("#input")).await.unwrap().send_keys(line).await.unwrap();
    c.find(Locator::Css("#form button")).await.unwrap().click().await.unwrap();
}

async fn screenshot(c: &Client, path: &Path) {
    std::fs::write(path, c.screenshot().await.expect("a screenshot")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "drives headless Chromium (apt: chromium chromium-driver) and tmux; .ci/run runs it"]
async fn web_and_terminal_members_share_a_group() {
    for (cmd, arg, pkg) in [
        ("chromium", "--version", "chromium"),
        ("chromedriver", "--version", "chromium-driver"),
        ("tmux", "-V", "tmux"),
    ] {
        assert!(installed(cmd, arg), "{cmd} is not installed (apt-get install {pkg})");
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("chat_web-{}", std::process::id()));
    std::fs::create_dir_all(&shots).unwrap();
    println!("screenshots in {}", shots.display());
    let socket = dir.path().join("conclave.sock");
    let keys = dir.path().join("keys");
    let exe = Path::new(env!("CARGO_BIN_EXE_conclave"));

    // The authority, and mallory's certificate, revoked before anyone starts.
    for args in [
        &["keys", "authority", "--dir"][..],
        &["keys", "issue", "mallory", "--dir"],
        &["keys", "revoke", "mallory", "--reason", "key-compromise", "--dir"],
    ] {
        let out = Command::new(exe).args(args).arg(&keys).output().unwrap();
        assert!(out.status.success(), "conclave {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    let _daemon = Proc(
        Command::new(exe)
            .env_remove("RUST_LOG")
            .args(["daemon", "--unix"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(File::create(dir.path().join("daemon.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let driver_port = free_port();
    let _driver = Proc(
        Command::new("chromedriver")
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(File::create(dir.path().join("chromedriver.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + WAIT;
    while !socket.exists() || TcpStream::connect(("127.0.0.1", driver_port)).is_err() {
        assert!(Instant::now() < deadline, "the daemon or chromedriver did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let driver = format!("http://127.0.0.1:{driver_port}");

    let (mut alice_proc, alice_url) = web_chat(exe, "alice", &socket, &keys, dir.path());
    let (_bob_proc, bob_url) = web_chat(exe, "bob", &socket, &keys, dir.path());
    assert!(alice_url.starts_with("http://127.0.0.1:") && alice_url.contains("/?token="), "{alice_url}");
    let port: u16 = alice_url["http://127.0.0.1:".len()..].split('/').next().unwrap().parse().unwrap();
    let token = alice_url.split("token=").nth(1).unwrap().to_owned();
    assert_eq!(token.len(), 32, "a 128-bit token");
    assert_ne!(bob_url.split("token=").nth(1).unwrap(), token, "a token per run");

    let alice = browser(&driver).await;
    let bob = browser(&driver).await;
    alice.goto(&alice_url).await.unwrap();
    bob.goto(&bob_url).await.unwrap();

    let tmux = Tmux::new("web-test", 110, WAIT);
    let term = |name: &str| {
        format!(
            "env -u RUST_LOG {} chat --create-identity --name {name} --group room --unix {} --keys {} 2>{}",
            sh_quote(exe),
            sh_quote(&socket),
            sh_quote(&keys),
            sh_quote(&dir.path().join(format!("{name}.err"))),
        )
    };
    tmux.start("carol", &term("carol"));

    // One group: the same members and the same key on the pages and in the terminal.
    for (c, who) in [(&alice, "alice"), (&bob, "bob")] {
        until(c, who, "#members", &["alice", "bob", "carol"]).await;
        until(c, who, "#count", &["3"]).await;
        until(c, who, "#status", &["3 members", "(tgdh) in "]).await;
    }
    tmux.until("carol", &[" alice", " bob", " carol", "3 members"], None);
    let fingerprint = text(&alice, "#key").await;
    assert!(fingerprint.len() >= 8 && fingerprint.chars().all(|c| c.is_ascii_hexdigit()), "{fingerprint:?}");
    until(&bob, "bob", "#key", &[&fingerprint]).await;
    tmux.until("carol", &[&format!("key {fingerprint}")], None);
    let epoch = text(&alice, "#epoch").await;
    assert_eq!(text(&bob, "#epoch").await, epoch);
    tmux.until("carol", &[&format!("epoch    {epoch}")], None);
    assert_eq!(text(&alice, "#protocol").await, "tgdh");

    // Messages typed anywhere appear everywhere, with their sender and time.
    say(&alice, "hello from alice").await;
    say(&bob, "hello from bob").await;
    tmux.type_line("carol", "hello from carol");
    let all = ["alice: hello from alice", "bob: hello from bob", "carol: hello from carol"];
    until(&alice, "alice", "#log", &all).await;
    until(&bob, "bob", "#log", &all).await;
    tmux.until("carol", &all, None);
    let stamped: bool = alice
        .execute(
            "return [...document.querySelectorAll('#log .entry.message time')].every(t => /^\\d\\d:\\d\\d:\\d\\d$/.test(t.textContent))",
            vec![],
        )
        .await
        .unwrap()
        .as_bool()
        .unwrap();
    assert!(stamped, "every message shows its time");

    // Markup is text.
    let evil = "<script>window.pwned=1</script><b>bold?</b><img src=x onerror=\"window.pwned=2\">";
    say(&alice, evil).await;
    until(&bob, "bob", "#log", &[&format!("alice: {evil}")]).await;
    tmux.until("carol", &["<script>window.pwned=1</script>"], None);
    for (c, who) in [(&alice, "alice"), (&bob, "bob")] {
        let r = c
            .execute(
                "return [typeof window.pwned, document.querySelectorAll('#log script, #log b, #log img').length]",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(r, serde_json::json!(["undefined", 0]), "{who}: markup in a message became markup");
    }

    // Input history: Up brings back the last line, then the one before.
    let input = alice.find(Locator::Css("#input")).await.unwrap();
    input.send_keys("\u{E013}").await.unwrap(); // Up
    assert_eq!(input.prop("value").await.unwrap().as_deref(), Some(evil));
    input.send_keys("\u{E013}").await.unwrap();
    assert_eq!(input.prop("value").await.unwrap().as_deref(), Some("hello from alice"));
    input.send_keys("\u{E015}\u{E015}").await.unwrap(); // Down, Down: back to the empty line
    assert_eq!(input.prop("value").await.unwrap().as_deref(), Some(""));

    // A revoked member is refused, with the reason, on every screen.
    tmux.start("mallory", &term("mallory"));
    tmux.until("mallory", &["no key: standing aside", "refused you"], None);
    for (c, who) in [(&alice, "alice"), (&bob, "bob")] {
        until(c, who, "#log", &["! refused mallory: its certificate", "was revoked (key compromise)"]).await;
        until(c, who, "#count", &["3"]).await;
    }
    tmux.until("carol", &["! refused mallory: its certificate", "revoked (key compromise)"], None);

    // The server refuses requests without the token, for another Host, or from another Origin.
    let host = format!("Host: 127.0.0.1:{port}");
    assert_eq!(raw(port, &format!("GET / HTTP/1.1\r\n{host}")).0, 401, "no token");
    let wrong = format!("{}{}", if token.starts_with('0') { '1' } else { '0' }, &token[1..]);
    assert_eq!(raw(port, &format!("GET /events?token={wrong} HTTP/1.1\r\n{host}")).0, 401, "wrong token");
    assert_eq!(raw(port, &format!("GET /?token={token} HTTP/1.1\r\nHost: {REBOUND}:{port}")).0, 421, "foreign Host");
    let origin = format!(
        "POST /send?token={token} HTTP/1.1\r\n{host}\r\nOrigin: http://{REBOUND}:{port}\r\nContent-Type: text/plain"
    );
    assert_eq!(raw(port, &origin).0, 403, "foreign Origin");
    let (code, page) = raw(port, &format!("GET /?token={token} HTTP/1.1\r\n{host}"));
    assert_eq!(code, 200, "{page}");
    // ... and so it does for a real browser.
    let probe = browser(&driver).await;
    probe.goto(&format!("http://127.0.0.1:{port}/")).await.unwrap();
    assert!(text(&probe, "body").await.contains("missing or wrong token"), "{}", text(&probe, "body").await);
    probe.goto(&format!("http://{REBOUND}:{port}/?token={token}")).await.unwrap();
    let body = text(&probe, "body").await;
    assert!(body.contains("foreign Host header"), "a DNS-rebound name is refused: {body}");
    assert!(text(&probe, "#log").await.is_empty());
    // A page of another origin posts with the token (as a cross-site form or fetch could): refused.
    let other = another_site();
    probe.goto(&format!("http://127.0.0.1:{other}/")).await.unwrap();
    assert!(text(&probe, "body").await.contains("another site"));
    let sent = probe
        .execute(
            "return fetch(arguments[0], {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: 'forged from another origin'}).then(() => 'sent', e => 'failed: ' + e)",
            vec![serde_json::json!(format!("http://127.0.0.1:{port}/send?token={token}"))],
        )
        .await
        .unwrap();
    // (An opaque response: the post reached the server, which answered.)
    assert_eq!(sent, serde_json::json!("sent"), "the browser sent the cross-origin post");
    say(&alice, "after the forgery").await;
    for (c, who) in [(&alice, "alice"), (&bob, "bob")] {
        let log = until(c, who, "#log", &["alice: after the forgery"]).await;
        assert!(!log.contains("forged from another origin"), "{who}: a cross-origin post reached the chat");
    }
    probe.close().await.unwrap();

    // Screenshots of each page, and the terminal's screen.
    screenshot(&alice, &shots.join("alice.png")).await;
    screenshot(&bob, &shots.join("bob.png")).await;
    std::fs::write(shots.join("carol.txt"), tmux.screen("carol")).unwrap();
    std::fs::write(shots.join("mallory.txt"), tmux.screen("mallory")).unwrap();

    // A web member leaves: the others show it, and the rekey with its duration.
    say(&bob, "/leave").await;
    until(&bob, "bob", "#log", &["you left #room"]).await;
    until(&bob, "bob", "#key", &["not joined"]).await;
    let log = until(&alice, "alice", "#log", &["* bob left"]).await;
    let rekey = log.lines().rev().find(|l| l.contains("* rekey to epoch")).unwrap_or_default().to_owned();
    let ms = rekey.split(" in ").nth(1).and_then(|r| r.split(" ms").next()).and_then(|m| m.parse::<f64>().ok());
    assert!(ms.is_some() && rekey.ends_with("2 members"), "a rekey with its duration after bob left: {rekey:?}");
    until(&alice, "alice", "#status", &["2 members", " ms"]).await;
    until(&alice, "alice", "#count", &["2"]).await;
    tmux.until("carol", &["bob left", "2 members"], None);
    screenshot(&alice, &shots.join("alice-after-bob-left.png")).await;
    screenshot(&bob, &shots.join("bob-after-leaving.png")).await;
    std::fs::write(shots.join("carol-after-bob-left.txt"), tmux.screen("carol")).unwrap();

    // /quit on the page ends the process; the page says so.
    say(&alice, "/quit").await;
    until(&alice, "alice", "#conn", &["chat ended"]).await;
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = alice_proc.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "alice's process did not end on /quit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "alice ended with {status}");
    tmux.until("carol", &["alice left", "1 members"], None);

    alice.close().await.unwrap();
    bob.close().await.unwrap();
    println!("alice's page at {} (and the others) in {}", shots.join("alice.png").display(), shots.display());
    println!("took {:?}", started.elapsed());
}
