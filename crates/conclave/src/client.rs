//! `conclave client`: an interactive client in the manner of Spread's
//! spuser. It reads one command per line from stdin and prints every event
//! from the daemon as it arrives, so it works from a terminal and from a
//! script alike.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use conclave_gcs::view::Cause;
use conclave_gcs_net::{Client, ClientError, ClientReceiver, ClientSender, Event, Service, TlsClientOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;

/// Which daemon to connect to.
#[derive(Args, Debug, Clone)]
pub struct Endpoint {
    /// Unix socket of the daemon [default: $XDG_RUNTIME_DIR/conclave.sock].
    #[arg(long, value_name = "PATH", conflicts_with_all = ["tcp", "tls"])]
    unix: Option<PathBuf>,
    /// TCP address of the daemon, e.g. 127.0.0.1:4803 (plain, for loopback).
    #[arg(long, value_name = "ADDR", conflicts_with = "tls")]
    tcp: Option<SocketAddr>,
    /// TLS address of the daemon, HOST:PORT (e.g. daemon.example:4804); needs --ca.
    #[arg(long, value_name = "HOST:PORT", requires = "ca")]
    tls: Option<String>,
    /// CA certificate (PEM) that issued the daemon's TLS certificate.
    #[arg(long, value_name = "PEM", requires = "tls")]
    ca: Option<PathBuf>,
    /// Client certificate (PEM) to show a daemon that demands one; its CommonName must be --name.
    #[arg(long, value_name = "PEM", requires_all = ["tls", "key"])]
    cert: Option<PathBuf>,
    /// Private key (PEM, PKCS#8) of --cert.
    #[arg(long, value_name = "PEM", requires = "cert")]
    key: Option<PathBuf>,
    /// Name the daemon's certificate must carry [default: the HOST of --tls].
    #[arg(long, value_name = "NAME", requires = "tls")]
    server_name: Option<String>,
    /// The passphrase of --key, if it is protected by one.
    #[command(flatten)]
    passphrase: crate::passphrase::PassphraseArgs,
}

/// The host part of HOST:PORT, without the brackets of an IPv6 address.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

impl Endpoint {
    /// The daemon's Unix socket at `path` (the default socket if `None`).
    pub fn unix(path: Option<PathBuf>) -> Endpoint {
        Endpoint {
            unix: path,
            tcp: None,
            tls: None,
            ca: None,
            cert: None,
            key: None,
            server_name: None,
            passphrase: Default::default(),
        }
    }

    /// The daemon at TLS address `addr`, certified by the authority `ca`,
    /// shown the client certificate and key `cert_key` if any (the key
    /// opened with `passphrase` if it is protected).
    pub fn tls(
        addr: String,
        ca: PathBuf,
        cert_key: Option<(PathBuf, PathBuf)>,
        server_name: Option<String>,
        passphrase: crate::passphrase::PassphraseArgs,
    ) -> Endpoint {
        let (cert, key) = cert_key.unzip();
        Endpoint { unix: None, tcp: None, tls: Some(addr), ca: Some(ca), cert, key, server_name, passphrase }
    }

    /// The TLS options: trusts `ca`; shows --cert, its --key opened with
    /// the passphrase if it is protected.
    fn tls_options(&self, ca: &std::path::Path) -> Result<TlsClientOptions> {
        let Some((cert, key)) = self.cert.as_deref().zip(self.key.as_deref()) else {
            return TlsClientOptions::from_pem_files(ca, None).context("cannot set up TLS");
        };
        let pem = zeroize::Zeroizing::new(
            std::fs::read_to_string(key).with_context(|| format!("cannot read the key {}", key.display()))?,
        );
        if !conclave_secure::trust::key_is_protected(&pem) {
            return TlsClientOptions::from_pem_files(ca, Some((cert, key))).context("cannot set up TLS");
        }
        let plain = self.passphrase.open_key(&pem, key)?;
        let identity = conclave_gcs_net::Identity::from_cert_file_and_key_pem(cert, plain.as_bytes(), key)
            .context("cannot set up TLS")?;
        let roots = conclave_gcs_net::tls::load_certs(ca).context("cannot set up TLS")?;
        TlsClientOptions::new(&roots, Some(identity)).context("cannot set up TLS")
    }

    /// Connects as `name`, with an error that says where to.
    pub async fn connect(&self, name: &str) -> Result<Client> {
        let (what, r) = match (&self.tls, self.tcp) {
            (Some(addr), _) => {
                let ca = self.ca.as_deref().context("--tls needs --ca PEM")?;
                let options = self.tls_options(ca)?;
                let server_name = self.server_name.as_deref().unwrap_or_else(|| host_of(addr));
                (format!("tls {addr}"), Client::connect_tls(addr.as_str(), server_name, &options, name).await)
            }
            (None, Some(addr)) => (format!("tcp {addr}"), Client::connect_tcp(addr, name).await),
            (None, None) => {
                let path = match &self.unix {
                    Some(path) => path.clone(),
                    None => crate::daemon::default_socket()?,
                };
                let r = Client::connect_unix(&path, name).await;
                (format!("unix socket {}", path.display()), r)
            }
        };
        r.map_err(|e| match e {
            ClientError::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
                anyhow!("cannot connect to the daemon at {what}: no such socket (is `conclave daemon` running?)")
            }
            ClientError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                anyhow!("cannot connect to the daemon at {what}: connection refused (is `conclave daemon` running?)")
            }
            e => anyhow!("cannot connect to the daemon at {what} as {name:?}: {e}"),
        })
    }
}

impl Endpoint {
    /// Asks the daemon for its status, with an error that says where.
    pub async fn status(&self) -> Result<conclave_gcs::wire::Status> {
        use conclave_gcs_net::client::{status_tcp, status_tls, status_unix};
        let (what, r) = match (&self.tls, self.tcp) {
            (Some(addr), _) => {
                let ca = self.ca.as_deref().context("--tls needs --ca PEM")?;
                let options = self.tls_options(ca)?;
                let server_name = self.server_name.as_deref().unwrap_or_else(|| host_of(addr));
                (format!("tls {addr}"), status_tls(addr.as_str(), server_name, &options).await)
            }
            (None, Some(addr)) => (format!("tcp {addr}"), status_tcp(addr).await),
            (None, None) => {
                let path = match &self.unix {
                    Some(path) => path.clone(),
                    None => crate::daemon::default_socket()?,
                };
                (format!("unix socket {}", path.display()), status_unix(&path).await)
            }
        };
        r.map_err(|e| match e {
            ClientError::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
                anyhow!("cannot reach the daemon at {what}: no such socket (is `conclave daemon` running?)")
            }
            ClientError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                anyhow!("cannot reach the daemon at {what}: connection refused (is `conclave daemon` running?)")
            }
            ClientError::Refused { code, text } => anyhow!(
                "the daemon at {what} refused to give its status ({}): {}",
                conclave_gcs::wire::code_name(code),
                safe(&text)
            ),
            e => anyhow!("cannot read the status of the daemon at {what}: {e}"),
        })
    }
}

/// Options of `conclave client`.
#[derive(Args, Debug)]
#[command(after_help = HELP)]
pub struct ClientArgs {
    /// Member name to connect as (unique on the daemon).
    #[arg(long)]
    name: String,
    /// Print each event as one JSON object per line (for scripts) instead of text: {"event": "view", "group",
    /// "view", "cause", "members"}, {"event": "message", "group", "view", "sender", "service", "text" or "hex"},
    /// {"event": "unicast", ...}, {"event": "left", "group"}, {"event": "error", "code", "name", "text"}, and
    /// {"event": "command_error", "text"} for a rejected command line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    endpoint: Endpoint,
}

const HELP: &str = "\
Commands (one per line on stdin):
  join G                  join closed group G (created if needed)
  join-open G             join G, creating it as an open group (non-members may send)
  leave G                 leave G
  send G TEXT...          multicast TEXT to G in agreed (total) order
  fifo G TEXT...          multicast TEXT to G in per-sender FIFO order
  unicast G MEMBER TEXT...  send TEXT to one member of G
  wait G N                wait (up to 10 s) until the view of G has N members
  wait-msgs G N           wait (up to 10 s) until N messages of G have arrived in all
  sleep MS                pause for MS milliseconds
  help                    this text
  quit                    leave (as does end of input)
Events print as they arrive:
  view v12 of G (join): alice bob carol
  [G v12] alice: text          (agreed; fifo messages show [G v12 fifo], unicasts [G v12 -> me])
  left G
  error (NotMember): text      (errors from the daemon or about a command line)
At end of input the client says goodbye, prints what the daemon still delivers, and exits;
the exit status is 1 if any command line was rejected.";

/// How long `wait` and `wait-msgs` wait.
const WAIT: Duration = Duration::from_secs(10);

/// What the event printer has seen, for `wait` and `wait-msgs`.
#[derive(Default)]
struct Seen {
    members: HashMap<String, usize>,
    messages: HashMap<String, usize>,
}

#[derive(Default)]
struct State {
    seen: Mutex<Seen>,
    changed: Notify,
}

impl State {
    async fn wait_for(&self, what: &str, ok: impl Fn(&Seen) -> bool) -> Result<()> {
        let wait = async {
            loop {
                let notified = self.changed.notified();
                if ok(&self.seen.lock().unwrap()) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(WAIT, wait).await.map_err(|_| anyhow!("timed out after {WAIT:?} waiting for {what}"))
    }
}

/// One line of `conclave client` output for an event.
fn describe(ev: &Event, me: &str) -> String {
    match ev {
        Event::Welcome { member } => format!("welcome {member}"),
        Event::View { group, view } => {
            let cause = match view.cause {
                Cause::Join => "join",
                Cause::Leave => "leave",
                Cause::Disconnect => "disconnect",
                Cause::Network => "network",
                Cause::Refresh => "key refresh",
            };
            let members: Vec<String> = view.ids().map(|m| safe(m.as_str())).collect();
            format!("view {} of {} ({cause}): {}", view.id, safe(group.as_str()), members.join(" "))
        }
        Event::ViewChangeBegins { group } => format!("view change begins in {}", safe(group.as_str())),
        Event::Left { group } => format!("left {}", safe(group.as_str())),
        Event::Message { group, sender, service, view, payload } => {
            let tag = if *service == Service::Fifo { " fifo" } else { "" };
            format!("[{} {view}{tag}] {}: {}", safe(group.as_str()), safe(sender.as_str()), text(payload))
        }
        Event::Unicast { group, sender, view, payload } => {
            format!("[{} {view} -> {}] {}: {}", safe(group.as_str()), safe(me), safe(sender.as_str()), text(payload))
        }
        Event::Error { code, text } => format!("error ({}): {}", conclave_gcs::wire::code_name(*code), safe(text)),
        // The key itself is never printed.
        Event::GroupKey { group, view, .. } => format!("key for view {view} of {}", safe(group.as_str())),
    }
}

/// One line of `conclave client --json` output for an event.
fn describe_json(ev: &Event) -> serde_json::Value {
    use serde_json::json;
    let body = |payload: &Bytes| match std::str::from_utf8(payload) {
        Ok(s) => json!({ "text": s }),
        Err(_) => json!({ "hex": hex::encode(payload) }),
    };
    match ev {
        Event::Welcome { member } => json!({ "event": "welcome", "member": member.as_str() }),
        Event::View { group, view } => json!({
            "event": "view",
            "group": group.as_str(),
            "view": view.id.to_string(),
            "cause": match view.cause {
                Cause::Join => "join",
                Cause::Leave => "leave",
                Cause::Disconnect => "disconnect",
                Cause::Network => "network",
                Cause::Refresh => "key refresh",
            },
            "members": view.ids().map(|m| m.as_str()).collect::<Vec<_>>(),
        }),
        Event::ViewChangeBegins { group } => json!({ "event": "view_change_begins", "group": group.as_str() }),
        Event::Left { group } => json!({ "event": "left", "group": group.as_str() }),
        Event::Message { group, sender, service, view, payload } => {
            let mut v = body(payload);
            v["event"] = json!("message");
            v["group"] = json!(group.as_str());
            v["view"] = json!(view.to_string());
            v["sender"] = json!(sender.as_str());
            v["service"] = json!(if *service == Service::Fifo { "fifo" } else { "agreed" });
            v
        }
        Event::Unicast { group, sender, view, payload } => {
            let mut v = body(payload);
            v["event"] = json!("unicast");
            v["group"] = json!(group.as_str());
            v["view"] = json!(view.to_string());
            v["sender"] = json!(sender.as_str());
            v
        }
        Event::Error { code, text } => json!({
            "event": "error",
            "code": code.to_u16(),
            "name": conclave_gcs::wire::code_name(*code),
            "text": text,
        }),
        // The key itself is never printed.
        Event::GroupKey { group, view, .. } => {
            json!({ "event": "group_key", "group": group.as_str(), "view": view.to_string() })
        }
    }
}

fn text(payload: &Bytes) -> String {
    match std::str::from_utf8(payload) {
        Ok(s) => safe(s),
        Err(_) => format!("<{} bytes of binary>", payload.len()),
    }
}

/// `s` made safe to print on a terminal: control characters (escape
/// sequences, bells, carriage returns, newlines that would fake a line from
/// someone else) and the Unicode controls that reorder text are shown as
/// escapes (`\x1b`, `\u{202e}`), so what a member sends cannot act on the
/// reader's terminal.
pub(crate) fn safe(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x80 && c.is_control() => write!(out, "\\x{:02x}", c as u32).unwrap(),
            c if c.is_control()
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') =>
            {
                write!(out, "\\u{{{:x}}}", c as u32).unwrap()
            }
            c => out.push(c),
        }
    }
    out
}

/// Prints events until the connection closes; returns why it closed.
async fn print_events(mut rx: ClientReceiver, me: String, state: Arc<State>, json: bool) -> Option<String> {
    loop {
        let ev = match rx.recv().await {
            Ok(ev) => ev,
            Err(ClientError::Closed) => return None,
            Err(e) => return Some(e.to_string()),
        };
        if json {
            println!("{}", describe_json(&ev));
        } else {
            println!("{}", describe(&ev, &me));
        }
        {
            let mut seen = state.seen.lock().unwrap();
            match &ev {
                Event::View { group, view } => {
                    seen.members.insert(group.to_string(), view.members.len());
                }
                Event::Left { group } => {
                    seen.members.insert(group.to_string(), 0);
                }
                Event::Message { group, .. } => *seen.messages.entry(group.to_string()).or_default() += 1,
                _ => {}
            }
        }
        state.changed.notify_waiters();
        if let Event::Error { code, .. } = &ev {
            if code.is_fatal() {
                return Some(format!("the daemon closed the connection ({})", conclave_gcs::wire::code_name(*code)));
            }
        }
    }
}

/// What to do after a command.
enum Next {
    Go,
    Quit,
}

fn args<const N: usize>(rest: &str, usage: &str) -> Result<[String; N]> {
    let mut it = rest.split_whitespace();
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for slot in out.iter_mut() {
        *slot = it.next().ok_or_else(|| anyhow!("usage: {usage}"))?.to_string();
    }
    if it.next().is_some() {
        bail!("usage: {usage}");
    }
    Ok(out)
}

/// Splits off the first word: `(word, rest)`.
fn word(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], s[i..].trim_start()),
        None => (s, ""),
    }
}

/// Splits a group and a non-empty text.
fn group_text<'a>(rest: &'a str, usage: &str) -> Result<(&'a str, &'a str)> {
    let (g, text) = word(rest);
    if g.is_empty() || text.is_empty() {
        bail!("usage: {usage}");
    }
    Ok((g, text))
}

fn count(s: &str) -> Result<usize> {
    s.parse().with_context(|| format!("{s:?} is not a number"))
}

async fn command(line: &str, tx: &ClientSender, state: &State) -> Result<Next> {
    let (cmd, rest) = word(line);
    let payload = |t: &str| Bytes::copy_from_slice(t.as_bytes());
    match cmd {
        "" => {}
        "help" | "?" => println!("{HELP}"),
        "quit" | "exit" => return Ok(Next::Quit),
        "join" => tx.join(&args::<1>(rest, "join GROUP")?[0]).await?,
        "join-open" => tx.join_open(&args::<1>(rest, "join-open GROUP")?[0]).await?,
        "leave" => tx.leave(&args::<1>(rest, "leave GROUP")?[0]).await?,
        "send" => {
            let (g, t) = group_text(rest, "send GROUP TEXT...")?;
            tx.multicast(g, Service::Agreed, payload(t)).await?
        }
        "fifo" => {
            let (g, t) = group_text(rest, "fifo GROUP TEXT...")?;
            tx.multicast(g, Service::Fifo, payload(t)).await?
        }
        "unicast" => {
            let usage = "unicast GROUP MEMBER TEXT...";
            let (g, rest) = word(rest);
            let (to, t) = group_text(rest, usage)?;
            if g.is_empty() {
                bail!("usage: {usage}");
            }
            tx.unicast(g, to, payload(t)).await?
        }
        "wait" => {
            let [g, n] = args::<2>(rest, "wait GROUP MEMBERS")?;
            let n = count(&n)?;
            let what = format!("a view of {g} with {n} members");
            state.wait_for(&what, |s| s.members.get(&g).copied().unwrap_or(0) == n).await?
        }
        "wait-msgs" => {
            let [g, n] = args::<2>(rest, "wait-msgs GROUP COUNT")?;
            let n = count(&n)?;
            let what = format!("{n} messages in {g}");
            state.wait_for(&what, |s| s.messages.get(&g).copied().unwrap_or(0) >= n).await?
        }
        "sleep" => {
            let [ms] = args::<1>(rest, "sleep MILLISECONDS")?;
            tokio::time::sleep(Duration::from_millis(count(&ms)? as u64)).await
        }
        other => bail!("unknown command {other:?} (type help for the list)"),
    }
    Ok(Next::Go)
}

/// Runs the interactive client.
pub fn run(args: ClientArgs) -> Result<()> {
    let rejected = crate::block_on(async move {
        let client = args.endpoint.connect(&args.name).await?;
        eprintln!("connected as {}; type help for commands", args.name);
        let (tx, rx) = client.split();
        let state = Arc::new(State::default());
        let mut printer = tokio::spawn(print_events(rx, args.name.clone(), state.clone(), args.json));
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let mut rejected = false;
        loop {
            let line = tokio::select! {
                closed = &mut printer => {
                    let why = closed.ok().flatten().unwrap_or_else(|| "the daemon closed the connection".into());
                    bail!("{why}");
                }
                line = lines.next_line() => line.context("cannot read stdin")?,
            };
            let Some(line) = line else { break };
            let run = command(&line, &tx, &state);
            // Keep an eye on the connection while a command (a wait, say) runs.
            let r = tokio::select! {
                r = run => r,
                closed = &mut printer => {
                    let why = closed.ok().flatten().unwrap_or_else(|| "the daemon closed the connection".into());
                    bail!("{why}");
                }
            };
            match r {
                Ok(Next::Go) => {}
                Ok(Next::Quit) => break,
                Err(e) if args.json => {
                    rejected = true;
                    println!("{}", serde_json::json!({ "event": "command_error", "text": crate::error_text(&e) }));
                }
                Err(e) => {
                    rejected = true;
                    println!("error: {}", crate::error_text(&e));
                }
            }
        }
        // Say goodbye and print what the daemon still delivers.
        if tx.bye().await.is_ok() {
            if let Ok(Ok(Some(why))) = tokio::time::timeout(Duration::from_secs(5), printer).await {
                eprintln!("{why}");
            }
        }
        Ok(rejected)
    })?;
    if rejected {
        std::process::exit(1);
    }
    Ok(())
}
