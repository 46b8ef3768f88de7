//! `conclave chat`: a secure chat room in the terminal, or in the browser
//! (`--web`).
//!
//! One [`Session`](conclave_secure::Session) to the daemon, one group: a
//! message pane (`sender: text`, with `*` system lines for joins, leaves and
//! rekeys and `!` lines for refusals, rejected messages and errors), a side
//! panel with the secure view's members, epoch, protocol and key fingerprint
//! (or "waiting for key" / "standing aside" while this member holds none;
//! under interval rekeying, the members of the view not yet in the key are
//! listed too, marked as waiting for the next rekey), a
//! status line that each rekey updates (`rekey to epoch E (protocol) in X ms,
//! N members`) and an input line with history (Up/Down). Commands: `/who`,
//! `/leave`, `/join`, `/quit` (and Ctrl-C; Esc does not quit).
//!
//! [`model`] holds what a Chatter shows and how events and typed lines change
//! it; [`drive`] runs one session against a [`Front`]: the terminal screen
//! ([`ui`], ratatui: scrollback with PgUp/PgDn and the mouse wheel, cursor
//! movement with tui-input) or the web page ([`web`], axum, guarded by a
//! per-run token and Host/Origin checks).
//!
//! # Identities and trust
//!
//! Chat uses the certified identities of `conclave keys` (`--keys DIR`, the
//! authority's key directory): it presents `DIR/members/<name>.crt` and
//! trusts `DIR/authority.crt` and its CRL, so members not certified by that
//! authority, or revoked, are refused (shown as `!` lines) and never get the
//! room's key. Chat never creates an authority or a certificate unless
//! asked to: without `--create-identity` and without a certificate for the
//! name, it exits before its screen starts and names the `conclave keys`
//! commands that create one. With it, it first reaches the daemon (over the
//! Unix socket), then creates what is missing (an authority if the directory
//! has none, the member's certificate if the directory holds the authority's
//! key) and says so in one line before the screen starts.

mod model;
mod ui;
pub mod web;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use conclave_secure::{MemberId, Policy, Session};
use crossterm::event::{DisableMouseCapture, EnableMouseCapture, Event, EventStream, KeyEventKind};
use futures_util::StreamExt;
use ratatui::DefaultTerminal;

use crate::client::Endpoint;
use crate::keys::KeyDir;
use model::{Chat, Flow};
use ui::{Action, Screen};

/// Options of `conclave chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Member name to chat as (unique on the daemon).
    #[arg(long)]
    name: String,
    /// The chat room (daemon group) to join.
    #[arg(long)]
    group: String,
    /// Key agreement policy, if this member creates the group: gdh, ckd, tgdh, str or bd (rekeyed on every
    /// membership change), or SEAL's interval rekeying ALGORITHM:PERIOD with ALGORITHM rebuild, batch or
    /// queue-batch (e.g. queue-batch:15s): joins and leaves are batched into one rekey per PERIOD, so a joiner
    /// reads nothing until the next rekey and a leaver's last key stays in use until then (append
    /// :rekey-on-leave to rekey at once when a member leaves). The integrated architecture: integrated-vs (the
    /// daemons key every view), optimized-evs (also re-encrypting messages that cross a view change) or
    /// three-step (no group key: TLS or the local socket to the daemon, sealed between daemons; three-step:open
    /// also takes messages from non-members).
    #[arg(long, alias = "protocol", default_value = "tgdh", value_name = "POLICY")]
    policy: Policy,
    /// Unix socket of the daemon [default: $XDG_RUNTIME_DIR/conclave.sock].
    #[arg(long, value_name = "PATH", conflicts_with = "tls")]
    unix: Option<PathBuf>,
    /// TLS address of a remote daemon, HOST:PORT. The key directory's authority must have certified the daemon
    /// (`conclave keys daemon`), and this member's certificate is shown to it.
    #[arg(long, value_name = "HOST:PORT")]
    tls: Option<String>,
    /// Name the daemon's certificate must carry [default: the HOST of --tls].
    #[arg(long, value_name = "NAME", requires = "tls")]
    server_name: Option<String>,
    /// Key directory of `conclave keys` (authority + members/<name>.crt/.key), private to you (mode 0700)
    /// [default: $XDG_STATE_HOME/conclave/keys, else ~/.local/state/conclave/keys].
    #[arg(long, value_name = "DIR")]
    keys: Option<PathBuf>,
    /// If the key directory holds no certificate for --name: create an authority there if it has none, and
    /// issue the certificate (if it holds the authority's key). Without this chat creates nothing.
    #[arg(long)]
    create_identity: bool,
    /// If --name's secret key (DIR/members/NAME.key) is protected by a passphrase: how to give it (else it is
    /// asked on the terminal, before the chat screen starts). With --create-identity, the passphrase of the
    /// authority's key, if that is protected.
    #[command(flatten)]
    passphrase: crate::passphrase::PassphraseArgs,
    /// Chat in the browser: serve the chat page on ADDR (IP:PORT) [default: 127.0.0.1 and a free port] and print
    /// its URL, which carries a per-run token. Anything but loopback is warned about.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:0", value_parser = parse_web_addr)]
    web: Option<SocketAddr>,
    /// With --web: open the page in a browser, if one is installed.
    #[arg(long, requires = "web")]
    open: bool,
}

fn parse_web_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("{s:?} is not an IP:PORT address (for example 127.0.0.1:8080, or 127.0.0.1:0 for a free port)")
    })
}

/// Runs `conclave chat`.
pub fn run(args: ChatArgs) -> Result<()> {
    let me = MemberId::new(args.name.clone()).with_context(|| format!("bad member name {:?}", args.name))?;
    let dir = match &args.keys {
        Some(dir) => dir.clone(),
        None => crate::keys::default_dir("--keys DIR")?,
    };
    let kd = KeyDir::open(dir)?;
    // Nothing to chat as and not asked to create it: say how, before anything else.
    let missing = crate::keys::chat_identity_missing(&kd, &args.name);
    if let (Some(hint), false) = (&missing, args.create_identity) {
        bail!("{hint}");
    }
    let endpoint = match &args.tls {
        Some(addr) => {
            let cert_key = (kd.member_cert(&args.name), kd.member_key(&args.name));
            Endpoint::tls(addr.clone(), kd.ca_cert(), Some(cert_key), args.server_name.clone(), args.passphrase.clone())
        }
        None => Endpoint::unix(args.unix.clone()),
    };
    let create = |kd: &KeyDir| -> Result<()> {
        if missing.is_some() {
            if let Some(notice) =
                crate::keys::create_chat_identity(kd, &args.name, &args.passphrase, &mut rand_core::OsRng)?
            {
                eprintln!("conclave: {notice}");
            }
        }
        Ok(())
    };
    let policy = args.policy;
    crate::block_on(async {
        // Bind the page first: a bad address fails before the group sees us.
        let server = match args.web {
            Some(addr) => Some(web::Server::bind(addr).await?),
            None => None,
        };
        // Reach the daemon before creating anything, unless the connection
        // itself needs the certificate (TLS).
        if args.tls.is_some() {
            create(&kd)?;
        }
        let client = endpoint.connect(&args.name).await?;
        if args.tls.is_none() {
            create(&kd)?;
        }
        let identity = kd.identity_with(&args.name, &args.passphrase)?;
        let authority = kd.authority()?;
        let mut session = Session::connect_certified(client, me, identity, Arc::new(authority));
        let mut chat = Chat::new(&args.name, &args.group, policy);
        match server {
            Some(server) => {
                let url = server.guard.url();
                let mut front = server.start();
                println!("conclave chat: {} in #{} at {url}", args.name, args.group);
                println!("(the token in the URL is this chat's password: do not share it)");
                if args.open {
                    web::open_browser(&url);
                }
                let r = drive(&mut session, &mut chat, &mut front).await;
                front.end(&chat);
                // Let the page hear that the chat ended.
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                r
            }
            None => {
                let terminal = ratatui::try_init().context("cannot set up the terminal")?;
                let _restore = Restore;
                crossterm::execute!(std::io::stdout(), EnableMouseCapture).context("cannot set up the terminal")?;
                let mut front = Terminal { terminal, screen: Screen::default(), keys: EventStream::new() };
                drive(&mut session, &mut chat, &mut front).await
            }
        }
    })
}

/// Gives the terminal back (mouse capture and raw mode off, main screen) however chat ends.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = crossterm::execute!(std::io::stdout(), DisableMouseCapture);
        ratatui::restore();
    }
}

/// What the user did.
pub enum UserInput {
    /// A line to submit (command or message).
    Line(String),
    /// Quit now.
    Quit,
    /// Nothing that concerns the session (the front changed its own state).
    Nothing,
}

/// A way of showing the chat and taking the user's input: the terminal or the web page.
pub trait Front {
    /// Shows the chat model as it is now.
    fn show(&mut self, chat: &Chat) -> Result<()>;
    /// The next thing the user did. Must be cancel-safe (it races the session in `select!`).
    async fn next(&mut self) -> Result<UserInput>;
}

/// Joins the group and runs the session until the user quits: events and
/// typed lines change the model, the front shows it.
async fn drive(session: &mut Session, chat: &mut Chat, front: &mut impl Front) -> Result<()> {
    chat.join(session);
    loop {
        front.show(chat)?;
        tokio::select! {
            ev = session.recv(), if chat.connected => match ev {
                Ok(ev) => chat.on_event(ev),
                Err(e) => chat.disconnected(e),
            },
            input = front.next() => match input? {
                UserInput::Line(line) => {
                    if chat.submit(session, &line) == Flow::Quit {
                        return Ok(());
                    }
                }
                UserInput::Quit => {
                    if chat.joined {
                        let _ = session.leave(&chat.group);
                    }
                    return Ok(());
                }
                UserInput::Nothing => {}
            },
        }
    }
}

/// The terminal front.
struct Terminal {
    terminal: DefaultTerminal,
    screen: Screen,
    keys: EventStream,
}

impl Front for Terminal {
    fn show(&mut self, chat: &Chat) -> Result<()> {
        let screen = &mut self.screen;
        self.terminal.draw(|f| screen.draw(f, chat))?;
        Ok(())
    }

    async fn next(&mut self) -> Result<UserInput> {
        match self.keys.next().await {
            Some(Ok(Event::Key(k))) if k.kind != KeyEventKind::Release => Ok(match self.screen.on_key(k) {
                Action::Submit(line) => UserInput::Line(line),
                Action::Quit => UserInput::Quit,
                Action::None => UserInput::Nothing,
            }),
            Some(Ok(Event::Mouse(m))) => {
                self.screen.on_mouse(m);
                Ok(UserInput::Nothing)
            }
            Some(Ok(_)) => Ok(UserInput::Nothing),
            Some(Err(e)) => Err(anyhow!("reading the terminal: {e}")),
            None => Ok(UserInput::Quit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use model::{Entry, KeyState};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn screen_text(t: &Terminal<TestBackend>) -> String {
        let buf = t.backend().buffer();
        let w = buf.area.width as usize;
        let cells: Vec<&str> = buf.content().iter().map(|c| c.symbol()).collect();
        cells.chunks(w).map(|row| row.concat()).collect::<Vec<_>>().join("\n")
    }

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn type_str(s: &mut Screen, text: &str) {
        text.chars().for_each(|c| assert_eq!(s.on_key(key(KeyCode::Char(c))), Action::None));
    }

    #[test]
    fn draws_members_status_and_messages() {
        let mut chat = Chat::new("alice", "room", Policy::default());
        chat.joined = true;
        chat.members = vec!["alice".into(), "bob".into()];
        chat.waiting = vec!["carol".into()];
        let epoch = conclave_secure::Epoch::new(conclave_secure::ViewId::new(0xabcd << 48, 7), 0);
        chat.key = KeyState::Keyed { epoch, fingerprint: "f00d".into() };
        chat.status = format!("rekey to epoch {epoch} (tgdh) in 3.2 ms, 2 members");
        chat.push(Entry::Message { sender: "bob".into(), text: "hi".into(), mine: false });
        let mut screen = Screen::default();
        type_str(&mut screen, "typing");
        let mut t = Terminal::new(TestBackend::new(80, 14)).unwrap();
        t.draw(|f| screen.draw(f, &chat)).unwrap();
        let text = screen_text(&t);
        let want = [
            "bob: hi",
            " alice",
            " bob",
            " carol (waits for",
            "members (3)",
            "epoch    v7.abcd/0",
            "key f00d",
            "2 members",
            "> typing",
            "#room",
        ];
        for want in want {
            assert!(text.contains(want), "{want:?} missing from\n{text}");
        }
    }

    #[test]
    fn waiting_and_standing_aside_show_no_key() {
        let mut chat = Chat::new("alice", "room", Policy::default());
        chat.key = KeyState::Waiting;
        chat.status = "joining #room: waiting for key ...".into();
        let mut screen = Screen::default();
        let mut t = Terminal::new(TestBackend::new(80, 12)).unwrap();
        t.draw(|f| screen.draw(f, &chat)).unwrap();
        assert!(screen_text(&t).contains("waiting for key"), "{}", screen_text(&t));
        chat.key = KeyState::Aside { by: "bob".into(), reason: "presented no certificate in time".into() };
        t.draw(|f| screen.draw(f, &chat)).unwrap();
        let text = screen_text(&t);
        assert!(text.contains("no key: standing aside") && !text.contains("key f"), "{text}");
    }

    #[test]
    fn cursor_moves_and_history_recalls() {
        let mut s = Screen::default();
        type_str(&mut s, "helo");
        s.on_key(key(KeyCode::Left));
        s.on_key(key(KeyCode::Char('l')));
        assert_eq!(s.input.value(), "hello");
        s.on_key(key(KeyCode::Home));
        s.on_key(key(KeyCode::Char('>')));
        assert_eq!(s.input.value(), ">hello");
        assert_eq!(s.on_key(key(KeyCode::Enter)), Action::Submit(">hello".into()));
        type_str(&mut s, "second");
        assert_eq!(s.on_key(key(KeyCode::Enter)), Action::Submit("second".into()));
        type_str(&mut s, "draft");
        s.on_key(key(KeyCode::Up));
        assert_eq!(s.input.value(), "second");
        s.on_key(key(KeyCode::Up));
        assert_eq!(s.input.value(), ">hello");
        s.on_key(key(KeyCode::Up));
        assert_eq!(s.input.value(), ">hello", "stays at the oldest");
        s.on_key(key(KeyCode::Down));
        s.on_key(key(KeyCode::Down));
        assert_eq!(s.input.value(), "draft", "back to what was being typed");
        assert_eq!(s.on_key(key(KeyCode::Esc)), Action::None, "Esc does not quit");
        assert_eq!(s.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Action::Quit);
    }

    #[test]
    fn page_up_scrolls_back_and_page_down_returns() {
        let mut chat = Chat::new("alice", "room", Policy::default());
        for i in 0..100 {
            chat.push(Entry::Message { sender: "bob".into(), text: format!("line {i}"), mine: false });
        }
        let mut s = Screen::default();
        let mut t = Terminal::new(TestBackend::new(80, 12)).unwrap();
        t.draw(|f| s.draw(f, &chat)).unwrap();
        assert!(screen_text(&t).contains("line 99") && !screen_text(&t).contains("line 90"));
        for _ in 0..3 {
            s.on_key(key(KeyCode::PageUp));
        }
        t.draw(|f| s.draw(f, &chat)).unwrap();
        let text = screen_text(&t);
        assert!(!text.contains("line 99") && text.contains("scrollback"), "{text}");
        for _ in 0..50 {
            s.on_key(key(KeyCode::PageUp));
        }
        t.draw(|f| s.draw(f, &chat)).unwrap();
        assert!(screen_text(&t).contains("line 0"), "{}", screen_text(&t));
        for _ in 0..60 {
            s.on_key(key(KeyCode::PageDown));
        }
        t.draw(|f| s.draw(f, &chat)).unwrap();
        let text = screen_text(&t);
        assert!(text.contains("line 99") && !text.contains("scrollback"), "{text}");
    }
}
