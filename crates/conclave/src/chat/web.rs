//! `conclave chat --web`: the chat model served as a web page by the chat
//! process itself.
//!
//! The page is a window on a local member, not a second member: the session,
//! its keys and its certificate stay in this process; the page gets what the
//! terminal would show (a JSON snapshot of the [`Chat`] model, pushed as
//! server-sent events on every change) and posts the lines typed into it.
//!
//! Guarding it:
//! * it binds loopback (`127.0.0.1`, a free port) unless told otherwise, and
//!   then warns;
//! * every request, the page's own files included, carries the random
//!   per-run token of the printed URL (`?token=`, or the `X-Conclave-Token`
//!   header), compared in constant time;
//! * the `Host` header must name the address served (`127.0.0.1:PORT`,
//!   `localhost:PORT`, `[::1]:PORT`, or the bound address), so a DNS
//!   rebinding attack (a foreign name resolved to loopback) is refused; and
//!   an `Origin` header, when a browser sends one, must be this page's own
//!   origin, so other sites cannot post or listen in;
//! * the page renders message text with `textContent` only, and a strict
//!   Content-Security-Policy forbids inline script;
//! * responses are not cached and send no referrer (the token is in the URL).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::Stream;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use super::model::{Chat, Entry, KeyState, Stamped};
use super::{Front, UserInput};

const PAGE: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/chat.js");
const STYLE: &str = include_str!("page/chat.css");

/// Most entries in one snapshot (the page keeps what it has seen).
const SNAPSHOT_ENTRIES: usize = 500;

/// Largest line the page may post.
const MAX_LINE: usize = 64 * 1024;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                   frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Who may ask: the token, and the hosts the page is served as.
pub struct Guard {
    token: String,
    addr: SocketAddr,
    hosts: Vec<String>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("token", &"<redacted>").field("hosts", &self.hosts).finish()
    }
}

/// Why a request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    NoHost,
    ForeignHost,
    ForeignOrigin,
    Token,
}

impl Refusal {
    fn response(&self) -> Response {
        let (code, text) = match self {
            Refusal::NoHost => (StatusCode::BAD_REQUEST, "no Host header"),
            Refusal::ForeignHost => (StatusCode::MISDIRECTED_REQUEST, "foreign Host header: refused"),
            Refusal::ForeignOrigin => (StatusCode::FORBIDDEN, "foreign Origin header: refused"),
            Refusal::Token => (StatusCode::UNAUTHORIZED, "missing or wrong token: use the URL conclave printed"),
        };
        (code, text).into_response()
    }
}

impl Guard {
    /// A guard for a page served at `addr` (the bound address, port known).
    pub fn new(token: String, addr: SocketAddr) -> Guard {
        let port = addr.port();
        let mut hosts = vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")];
        if !addr.ip().is_unspecified() && !hosts.contains(&addr.to_string()) {
            hosts.push(addr.to_string());
        }
        Guard { token, addr, hosts }
    }

    /// The URL to print.
    pub fn url(&self) -> String {
        let host = match self.addr.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => format!("127.0.0.1:{}", self.addr.port()),
            ip if ip.is_unspecified() => format!("[::1]:{}", self.addr.port()),
            _ => self.addr.to_string(),
        };
        format!("http://{host}/?token={}", self.token)
    }

    fn host_ok(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        if self.hosts.contains(&host) {
            return true;
        }
        // Bound to all addresses: any IP literal with our port (no names: a
        // name is what DNS rebinding needs).
        self.addr.ip().is_unspecified() && host.parse::<SocketAddr>().is_ok_and(|a| a.port() == self.addr.port())
    }

    /// Checks a request's Host, Origin and token.
    pub fn check(&self, headers: &HeaderMap, query: Option<&str>) -> Result<(), Refusal> {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).ok_or(Refusal::NoHost)?;
        if !self.host_ok(host) {
            return Err(Refusal::ForeignHost);
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().map_err(|_| Refusal::ForeignOrigin)?;
            let ok = origin.strip_prefix("http://").is_some_and(|h| self.host_ok(h));
            if !ok {
                return Err(Refusal::ForeignOrigin);
            }
        }
        let given = headers
            .get("x-conclave-token")
            .and_then(|v| v.to_str().ok())
            .or_else(|| query.and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token="))));
        match given {
            Some(t) if same(t.as_bytes(), self.token.as_bytes()) => Ok(()),
            _ => Err(Refusal::Token),
        }
    }
}

/// Constant-time comparison (the token's length is public).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A fresh random token: 128 bits, hex.
pub fn new_token() -> String {
    use rand_core::RngCore;
    let mut b = [0u8; 16];
    rand_core::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

struct Shared {
    guard: Guard,
    lines: mpsc::UnboundedSender<String>,
    snapshot: watch::Receiver<Arc<str>>,
}

/// The page's side of the chat loop: publishes snapshots, hands over posted lines.
pub struct WebFront {
    snapshot: watch::Sender<Arc<str>>,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Front for WebFront {
    fn show(&mut self, chat: &Chat) -> Result<()> {
        self.snapshot.send_replace(snapshot(chat, false).into());
        Ok(())
    }

    async fn next(&mut self) -> Result<UserInput> {
        tokio::select! {
            line = self.lines.recv() => Ok(line.map_or(UserInput::Quit, UserInput::Line)),
            r = tokio::signal::ctrl_c() => {
                r.context("cannot wait for Ctrl-C")?;
                Ok(UserInput::Quit)
            }
        }
    }
}

impl WebFront {
    /// Tells the page that the chat has ended.
    pub fn end(&mut self, chat: &Chat) {
        self.snapshot.send_replace(snapshot(chat, true).into());
    }
}

/// A bound listener and its guard.
pub struct Server {
    listener: TcpListener,
    pub guard: Guard,
}

impl Server {
    /// Binds `addr` (warning on stderr if it is not loopback).
    pub async fn bind(addr: SocketAddr) -> Result<Server> {
        let listener =
            TcpListener::bind(addr).await.with_context(|| format!("cannot serve the chat page on {addr}"))?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() {
            eprintln!(
                "conclave: warning: the chat page is served on {addr}, not on loopback: whoever can reach it \
                 and learns the URL's token reads and writes as you, and plain HTTP does not hide the token \
                 on the network"
            );
        }
        Ok(Server { listener, guard: Guard::new(new_token(), addr) })
    }

    /// Starts serving on the runtime; returns the chat loop's side.
    pub fn start(self) -> WebFront {
        let (snap_tx, snap_rx) = watch::channel::<Arc<str>>(Arc::from("{}"));
        let (line_tx, line_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared { guard: self.guard, lines: line_tx, snapshot: snap_rx });
        let app = router(shared);
        let listener = self.listener;
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("conclave: the chat page's server stopped: {e}");
            }
        });
        WebFront { snapshot: snap_tx, lines: line_rx }
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/chat.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT) }))
        .route("/chat.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }))
        .route("/events", get(events))
        .route("/send", post(send))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found") })
        .layer(middleware::from_fn_with_state(shared.clone(), guard))
        .with_state(shared)
}

/// Every request: Host, Origin and token first, then the security headers.
async fn guard(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let mut res = match s.guard.check(req.headers(), req.uri().query()) {
        Ok(()) => next.run(req).await,
        Err(r) => r.response(),
    };
    let h = res.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    res
}

async fn page(State(s): State<Arc<Shared>>) -> Response {
    // The token is hex, so it needs no escaping.
    let html = PAGE.replace("{{TOKEN}}", &s.guard.token);
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

async fn events(State(s): State<Arc<Shared>>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = s.snapshot.clone();
    let stream = futures_util::stream::unfold((rx, true), |(mut rx, first)| async move {
        if !first {
            rx.changed().await.ok()?;
        }
        let data = rx.borrow_and_update().clone();
        Some((Ok(Event::default().data(&*data)), (rx, false)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn send(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    let ok_type =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("text/plain"));
    if !ok_type {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, "post the line as text/plain").into_response();
    }
    let bytes = match axum::body::to_bytes(body, MAX_LINE).await {
        Ok(b) => b,
        Err(_) => return (StatusCode::PAYLOAD_TOO_LARGE, "line too long").into_response(),
    };
    let Ok(line) = String::from_utf8(bytes.to_vec()) else {
        return (StatusCode::BAD_REQUEST, "not UTF-8").into_response();
    };
    match s.lines.send(line) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(_) => (StatusCode::GONE, "the chat has ended").into_response(),
    }
}

#[derive(Serialize)]
struct Snapshot<'a> {
    me: &'a str,
    group: &'a str,
    protocol: &'a str,
    joined: bool,
    connected: bool,
    ended: bool,
    members: &'a [String],
    /// Members of the view that wait for the next rekey (interval rekeying).
    waiting: Vec<&'a str>,
    epoch: Option<String>,
    fingerprint: Option<&'a str>,
    /// "none", "waiting", "keyed" or "aside".
    key_state: &'static str,
    key: String,
    status: &'a str,
    entries: Vec<EntryJson<'a>>,
}

#[derive(Serialize)]
struct EntryJson<'a> {
    seq: u64,
    time_ms: u64,
    /// "message", "rekey", "system" or "warning".
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    sender: Option<&'a str>,
    text: &'a str,
    mine: bool,
}

impl<'a> From<&'a Stamped> for EntryJson<'a> {
    fn from(s: &'a Stamped) -> Self {
        let (kind, sender, text, mine) = match &s.entry {
            Entry::Message { sender, text, mine } => ("message", Some(sender.as_str()), text.as_str(), *mine),
            Entry::Rekey(t) => ("rekey", None, t.as_str(), false),
            Entry::System(t) => ("system", None, t.as_str(), false),
            Entry::Warning(t) => ("warning", None, t.as_str(), false),
        };
        EntryJson { seq: s.seq, time_ms: s.time_ms, kind, sender, text, mine }
    }
}

/// The model as the page gets it (JSON).
pub fn snapshot(chat: &Chat, ended: bool) -> String {
    let (key_state, fingerprint) = match &chat.key {
        KeyState::NotJoined => ("none", None),
        KeyState::Waiting => ("waiting", None),
        KeyState::Keyed { fingerprint, .. } => ("keyed", Some(fingerprint.as_str())),
        KeyState::Aside { .. } => ("aside", None),
    };
    let from = chat.entries.len().saturating_sub(SNAPSHOT_ENTRIES);
    let s = Snapshot {
        me: &chat.me,
        group: &chat.group,
        protocol: &chat.protocol,
        joined: chat.joined,
        connected: chat.connected,
        ended,
        members: &chat.members,
        waiting: chat.roster().into_iter().filter(|(_, w)| *w).map(|(m, _)| m).collect(),
        epoch: chat.epoch().map(|e| e.to_string()),
        fingerprint,
        key_state,
        key: chat.key.describe(),
        status: &chat.status,
        entries: chat.entries[from..].iter().map(EntryJson::from).collect(),
    };
    serde_json::to_string(&s).expect("a snapshot serializes")
}

/// Opens `url` in a browser, if one can be found.
pub fn open_browser(url: &str) {
    for opener in ["xdg-open", "sensible-browser", "x-www-browser", "chromium", "firefox"] {
        let spawned = std::process::Command::new(opener)
            .arg(url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        if spawned.is_ok() {
            eprintln!("conclave: opened the page with {opener}");
            return;
        }
    }
    eprintln!("conclave: no browser found to open the page (tried xdg-open, sensible-browser, chromium, firefox); open the URL yourself");
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_secure::Policy;
    use std::net::{IpAddr, Ipv4Addr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const DEFAULT_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

    #[test]
    fn the_snapshot_lists_the_members_waiting_for_the_next_rekey_apart() {
        let mut chat = Chat::new("alice", "room", "batch:15s".parse().unwrap());
        chat.members = vec!["alice".into()];
        chat.waiting = vec!["bob".into(), "carol".into()];
        let v: serde_json::Value = serde_json::from_str(&snapshot(&chat, false)).unwrap();
        assert_eq!(v["members"], serde_json::json!(["alice"]));
        assert_eq!(v["waiting"], serde_json::json!(["bob", "carol"]));
        chat.waiting.clear();
        let v: serde_json::Value = serde_json::from_str(&snapshot(&chat, false)).unwrap();
        assert_eq!(v["waiting"], serde_json::json!([]));
    }

    /// A server on a free loopback port with a chat model behind it.
    async fn serve() -> (SocketAddr, String, WebFront) {
        let server = Server::bind(DEFAULT_ADDR).await.unwrap();
        let token = server.guard.token.clone();
        let addr = server.guard.addr;
        let mut front = server.start();
        let mut chat = Chat::new("alice", "room", Policy::default());
        chat.push(super::super::model::Entry::Message {
            sender: "bob".into(),
            text: "<script>alert(1)</script>".into(),
            mine: false,
        });
        front.show(&chat).unwrap();
        (addr, token, front)
    }

    /// One raw HTTP/1.1 request; returns the status code and the response head and body.
    async fn request(addr: SocketAddr, head: &str, body: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        // Event streams do not end: read what comes within a moment.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), s.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, text)
    }

    #[tokio::test]
    async fn the_token_is_required_everywhere() {
        let (addr, token, _front) = serve().await;
        let host = format!("Host: 127.0.0.1:{}", addr.port());
        for path in ["/", "/chat.js", "/chat.css", "/events", "/nope"] {
            let (code, _) = request(addr, &format!("GET {path} HTTP/1.1\r\n{host}"), "").await;
            assert_eq!(code, 401, "GET {path} without a token");
            let (code, _) = request(addr, &format!("GET {path}?token=0123 HTTP/1.1\r\n{host}"), "").await;
            assert_eq!(code, 401, "GET {path} with a wrong token");
            let wrong = format!("{}0", &token[..token.len() - 1]);
            let wrong = if wrong == token { format!("{}1", &token[..token.len() - 1]) } else { wrong };
            let (code, _) = request(addr, &format!("GET {path}?token={wrong} HTTP/1.1\r\n{host}"), "").await;
            assert_eq!(code, 401, "GET {path} with a token one digit off");
        }
        let (code, _) =
            request(addr, &format!("POST /send HTTP/1.1\r\n{host}\r\nContent-Type: text/plain"), "hi").await;
        assert_eq!(code, 401, "POST without a token");
        let (code, page) = request(addr, &format!("GET /?token={token} HTTP/1.1\r\n{host}"), "").await;
        assert_eq!(code, 200, "{page}");
        assert!(page.contains("content-security-policy: default-src 'none'"), "{page}");
        assert!(page.contains(&format!("/chat.js?token={token}")), "the page loads its script with the token");
        let (code, _) =
            request(addr, &format!("GET /chat.js HTTP/1.1\r\n{host}\r\nX-Conclave-Token: {token}"), "").await;
        assert_eq!(code, 200, "the token in a header");
    }

    #[tokio::test]
    async fn foreign_host_and_origin_are_refused() {
        let (addr, token, mut front) = serve().await;
        let port = addr.port();
        for host in [format!("evil.example:{port}"), format!("127.0.0.1:{}", port.wrapping_add(1)), "localhost".into()]
        {
            let (code, _) = request(addr, &format!("GET /?token={token} HTTP/1.1\r\nHost: {host}"), "").await;
            assert_eq!(code, 421, "Host {host}");
        }
        let (code, _) = request(addr, &format!("GET /?token={token} HTTP/1.0"), "").await;
        assert_eq!(code, 400, "no Host");
        let host = format!("Host: localhost:{port}");
        for origin in [
            "http://evil.example",
            "null",
            &format!("https://127.0.0.1:{port}"),
            &format!("http://evil.example:{port}"),
        ] {
            let head =
                format!("POST /send?token={token} HTTP/1.1\r\n{host}\r\nOrigin: {origin}\r\nContent-Type: text/plain");
            let (code, _) = request(addr, &head, "/quit").await;
            assert_eq!(code, 403, "Origin {origin}");
            let (code, _) =
                request(addr, &format!("GET /events?token={token} HTTP/1.1\r\n{host}\r\nOrigin: {origin}"), "").await;
            assert_eq!(code, 403, "events with Origin {origin}");
        }
        assert!(front.lines.try_recv().is_err(), "nothing refused reached the chat");
        let head =
            format!("POST /send?token={token} HTTP/1.1\r\n{host}\r\nOrigin: http://127.0.0.1:{port}\r\nContent-Type: text/plain");
        let (code, _) = request(addr, &head, "hello").await;
        assert_eq!(code, 204);
        assert_eq!(front.lines.recv().await.as_deref(), Some("hello"));
        // A cross-site form post cannot send text/plain with our Origin anyway; a form type is refused too.
        let head =
            format!("POST /send?token={token} HTTP/1.1\r\n{host}\r\nContent-Type: application/x-www-form-urlencoded");
        let (code, _) = request(addr, &head, "a=b").await;
        assert_eq!(code, 415);
    }

    #[tokio::test]
    async fn events_carry_text_as_json_not_html() {
        let (addr, token, _front) = serve().await;
        let (code, text) =
            request(addr, &format!("GET /events?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{}", addr.port()), "").await;
        assert_eq!(code, 200, "{text}");
        assert!(text.contains("text/event-stream"), "{text}");
        assert!(text.contains(r#""text":"<script>alert(1)</script>""#), "{text}");
        assert!(!text.contains("token"), "snapshots do not carry the token: {text}");
    }

    #[test]
    fn the_page_renders_text_as_text() {
        // The script puts message text into the page with textContent only.
        assert!(
            !SCRIPT.contains("innerHTML") && !SCRIPT.contains("outerHTML") && !SCRIPT.contains("insertAdjacentHTML")
        );
        assert!(!SCRIPT.contains("document.write") && !SCRIPT.contains("eval("));
        assert!(SCRIPT.contains("textContent"));
        assert!(!PAGE.contains("<script>"), "no inline script (the CSP forbids it)");
    }

    #[test]
    fn urls_and_hosts_follow_the_bound_address() {
        let g = Guard::new("t".into(), "127.0.0.2:8080".parse().unwrap());
        assert_eq!(g.url(), "http://127.0.0.2:8080/?token=t");
        assert!(g.host_ok("127.0.0.2:8080") && g.host_ok("LOCALHOST:8080") && !g.host_ok("127.0.0.2:8081"));
        let g = Guard::new("t".into(), "[::1]:8080".parse().unwrap());
        assert_eq!(g.url(), "http://[::1]:8080/?token=t");
        let g = Guard::new("t".into(), "0.0.0.0:8080".parse().unwrap());
        assert_eq!(g.url(), "http://127.0.0.1:8080/?token=t");
        assert!(g.host_ok("192.0.2.7:8080"), "bound to all: IP literals with our port");
        assert!(!g.host_ok("attacker.example:8080") && !g.host_ok("192.0.2.7:80"), "never a name");
    }

    #[test]
    fn debug_hides_the_token() {
        let g = Guard::new("secret0123".into(), DEFAULT_ADDR);
        assert!(!format!("{g:?}").contains("secret0123"));
        assert!(g.url().contains("token=secret0123"));
    }
}
