//! `conclave chat`: a secure chat room in the terminal.
//!
//! One [`Session`](conclave_secure::Session) to the daemon, one group: a
//! message pane (`sender: text`, with `*` system lines for joins, leaves and
//! rekeys and `!` lines for rejected messages and errors), a side panel with
//! the secure view's members, epoch, protocol and key fingerprint, a status
//! line that each rekey updates (`rekey to epoch E (protocol) in X ms, N
//! members`) and an input line. Commands: `/who`, `/leave`, `/join`, `/quit`
//! (Esc and Ctrl-C quit too).
//!
//! # Identities and trust
//!
//! Chat uses the certified identities of `conclave keys` (`--keys DIR`, the
//! authority's key directory): it presents `DIR/members/<name>.crt` and
//! trusts `DIR/authority.crt` and its CRL, so members not certified by that
//! authority, or revoked, are refused (shown as `!` lines) and never get the
//! room's key. For zero-config use, a directory without an authority gets
//! one on first run, and a member without a certificate gets one when the
//! directory holds the authority's key; chat says so on stderr.

mod ui;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use conclave_secure::{MemberId, Policy, ProtocolId, SecureEvent, SecureViewInfo, Session};
use crossterm::event::{Event, EventStream, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use futures_util::StreamExt;
use ratatui::DefaultTerminal;

use crate::client::Endpoint;
use ui::{App, Entry};

/// Options of `conclave chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Member name to chat as (unique on the daemon).
    #[arg(long)]
    name: String,
    /// The chat room (daemon group) to join.
    #[arg(long)]
    group: String,
    /// Key agreement protocol, if this member creates the group: gdh, ckd, tgdh, str or bd.
    #[arg(long, default_value = "tgdh", value_parser = parse_protocol)]
    protocol: ProtocolId,
    /// Unix socket of the daemon [default: $XDG_RUNTIME_DIR/conclave.sock or /tmp/conclave-$UID.sock].
    #[arg(long, value_name = "PATH", conflicts_with = "tls")]
    unix: Option<PathBuf>,
    /// TLS address of a remote daemon, HOST:PORT. The key directory's authority must have certified the daemon
    /// (`conclave keys daemon`), and this member's certificate is shown to it.
    #[arg(long, value_name = "HOST:PORT")]
    tls: Option<String>,
    /// Name the daemon's certificate must carry [default: the HOST of --tls].
    #[arg(long, value_name = "NAME", requires = "tls")]
    server_name: Option<String>,
    /// Key directory of `conclave keys` (authority + members/<name>.crt/.key); created with a new
    /// authority if empty [default: $XDG_RUNTIME_DIR/conclave-keys or /tmp/conclave-keys-$UID].
    #[arg(long, value_name = "DIR")]
    keys: Option<PathBuf>,
}

fn parse_protocol(s: &str) -> Result<ProtocolId, String> {
    ProtocolId::from_name(s).ok_or_else(|| format!("unknown protocol {s:?} (gdh, ckd, tgdh, str or bd)"))
}

/// Runs `conclave chat`.
pub fn run(args: ChatArgs) -> Result<()> {
    let dir = args.keys.clone().unwrap_or_else(crate::keys::default_dir);
    let me = MemberId::new(args.name.clone()).with_context(|| format!("bad member name {:?}", args.name))?;
    let (identity, authority) = crate::keys::chat_identity(&dir, &args.name, &mut rand_core::OsRng)?;
    let endpoint = match &args.tls {
        Some(addr) => {
            let kd = crate::keys::KeyDir::new(dir.clone());
            let cert_key = (kd.member_cert(&args.name), kd.member_key(&args.name));
            Endpoint::tls(addr.clone(), kd.ca_cert(), Some(cert_key), args.server_name.clone())
        }
        None => Endpoint::unix(args.unix.clone()),
    };
    crate::block_on(async move {
        let client = endpoint.connect(&args.name).await?;
        let session = Session::connect_certified(client, me, identity, Arc::new(authority));
        let terminal = ratatui::try_init().context("cannot set up the terminal")?;
        let _restore = Restore;
        chat(terminal, session, &args).await
    })
}

/// Gives the terminal back (raw mode off, main screen) however chat ends.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

async fn chat(mut terminal: DefaultTerminal, mut session: Session, args: &ChatArgs) -> Result<()> {
    let policy = Policy { protocol: args.protocol, ..Policy::default() };
    let mut app = App::new(&args.name, &args.group, args.protocol.name());
    session.join(&args.group, policy)?;
    app.joined = true;
    app.system(format!("joining #{} as {} ({}); /who, /leave, /join, /quit", args.group, args.name, app.protocol));
    let mut keys = EventStream::new();
    let mut connected = true;
    loop {
        terminal.draw(|f| app.draw(f))?;
        tokio::select! {
            ev = session.recv(), if connected => match ev {
                Ok(ev) => on_event(&mut app, ev),
                Err(e) => {
                    connected = false;
                    app.joined = false;
                    app.warning(format!("session ended: {e}"));
                    app.status = "disconnected from the daemon; /quit to exit".into();
                }
            },
            key = keys.next() => match key {
                Some(Ok(Event::Key(k))) if k.kind != KeyEventKind::Release => {
                    if on_key(&mut app, &mut session, policy, k) == Flow::Quit {
                        return Ok(());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(anyhow!("reading the terminal: {e}")),
                None => return Ok(()),
            },
        }
    }
}

#[derive(PartialEq, Eq)]
enum Flow {
    Go,
    Quit,
}

fn on_key(app: &mut App, session: &mut Session, policy: Policy, k: KeyEvent) -> Flow {
    match k.code {
        KeyCode::Char('c' | 'd') if k.modifiers.contains(KeyModifiers::CONTROL) => return Flow::Quit,
        KeyCode::Esc => return Flow::Quit,
        KeyCode::Char(c) => app.input.push(c),
        KeyCode::Backspace => {
            app.input.pop();
        }
        KeyCode::Enter => {
            let line = std::mem::take(&mut app.input);
            return submit(app, session, policy, line.trim());
        }
        _ => {}
    }
    Flow::Go
}

fn submit(app: &mut App, session: &mut Session, policy: Policy, line: &str) -> Flow {
    let group = app.group.clone();
    match line {
        "" => {}
        "/quit" => {
            if app.joined {
                let _ = session.leave(&group);
            }
            return Flow::Quit;
        }
        "/who" => {
            let epoch = app.epoch.map_or("none yet".to_owned(), |e| e.to_string());
            let who = if app.members.is_empty() { "nobody".to_owned() } else { app.members.join(", ") };
            app.system(format!("members of #{group} (epoch {epoch}, {}): {who}", app.protocol));
        }
        "/leave" => match session.leave(&group) {
            Ok(()) => app.system(format!("leaving #{group} ...")),
            Err(e) => app.warning(e.to_string()),
        },
        "/join" => match session.join(&group, policy) {
            Ok(()) => {
                app.joined = true;
                app.system(format!("joining #{group} ..."));
            }
            Err(e) => app.warning(e.to_string()),
        },
        cmd if cmd.starts_with('/') => app.warning(format!("unknown command {cmd} (/who, /leave, /join, /quit)")),
        text => {
            if let Err(e) = session.send(&group, text.as_bytes()) {
                app.warning(format!("not sent: {e}"));
            }
        }
    }
    Flow::Go
}

fn on_event(app: &mut App, ev: SecureEvent) {
    match ev {
        SecureEvent::View(v) => on_view(app, v),
        SecureEvent::Message { sender, data, .. } => {
            let mine = sender.as_str() == app.me;
            let text = String::from_utf8_lossy(&data).replace(|c: char| c.is_control(), " ");
            app.push(Entry::Message { sender: sender.as_str().to_owned(), text, mine });
        }
        SecureEvent::Rejected { sender, reason, .. } => {
            app.warning(format!("rejected a message from {sender}: {reason}"))
        }
        SecureEvent::PolicyMismatch { theirs, from, .. } => {
            let theirs =
                theirs.map_or("another policy".to_owned(), |p| format!("{} over {:?}", p.protocol.name(), p.group_id));
            app.warning(format!("#{} runs {theirs} (told by {from}), not {}; left it", app.group, app.protocol));
        }
        SecureEvent::Refused { member, reason, .. } => app.warning(format!("refused {member}: {reason}")),
        SecureEvent::Excluded { by, reason, .. } => {
            // Standing aside: no key, so show none.
            app.epoch = None;
            app.fingerprint.clear();
            app.warning(format!("{by} refused you: you {reason}; you get no key in this view"))
        }
        SecureEvent::KeyMismatch { epoch, unconfirmed, .. } => {
            let who: Vec<&str> = unconfirmed.iter().map(|m| m.as_str()).collect();
            app.warning(format!(
                "key confirmation failed in epoch {epoch}: {} did not confirm your key; rekeying (nothing was sent under it)",
                who.join(", ")
            ))
        }
        SecureEvent::Left { group } => {
            app.joined = false;
            app.members.clear();
            app.epoch = None;
            app.fingerprint.clear();
            app.system(format!("you left #{group}; /join to come back, /quit to exit"));
            app.status = format!("not in #{group}");
        }
        SecureEvent::DaemonError { code, text } => app.warning(format!("daemon: {code:?}: {text}")),
    }
}

fn on_view(app: &mut App, v: SecureViewInfo) {
    let members: Vec<String> = v.members.iter().map(|m| m.as_str().to_owned()).collect();
    let joined: Vec<String> = members.iter().filter(|m| !app.members.contains(m)).cloned().collect();
    let left: Vec<String> = app.members.iter().filter(|m| !members.contains(m)).cloned().collect();
    joined.iter().for_each(|m| app.system(format!("{m} joined")));
    left.iter().for_each(|m| app.system(format!("{m} left")));
    let ms = v.rekey_time.as_secs_f64() * 1000.0;
    app.status = format!("rekey to epoch {} ({}) in {ms:.1} ms, {} members", v.epoch, v.protocol.name(), members.len());
    app.system(app.status.clone());
    app.members = members;
    app.epoch = Some(v.epoch);
    app.protocol = v.protocol.name().to_owned();
    app.fingerprint = v.fingerprint;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    #[test]
    fn draws_members_status_and_messages() {
        let mut app = App::new("alice", "room", "tgdh");
        app.members = vec!["alice".into(), "bob".into()];
        let epoch = conclave_secure::Epoch::new(conclave_secure::ViewId::new(0xabcd << 48, 7), 0);
        app.epoch = Some(epoch);
        app.status = format!("rekey to epoch {epoch} (tgdh) in 3.2 ms, 2 members");
        app.push(Entry::Message { sender: "bob".into(), text: "hi".into(), mine: false });
        app.input = "typing".into();
        let mut t = Terminal::new(TestBackend::new(80, 12)).unwrap();
        t.draw(|f| app.draw(f)).unwrap();
        let screen: String = t.backend().buffer().content().iter().map(|c| c.symbol()).collect();
        for want in ["bob: hi", " alice", " bob", "epoch    v7.abcd/0", "2 members", "> typing", "#room"] {
            assert!(screen.contains(want), "{want:?} missing from {screen}");
        }
    }
}
