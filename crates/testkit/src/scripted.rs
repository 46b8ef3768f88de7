//! A secure session driven by commands, for scripts (`conclave demo`, the
//! daemon engine of `bench events`): the session runs in a task of its own,
//! takes [`Cmd`]s from a channel and reports every event, stamped with when
//! it came, on a channel shared by all members of the script. Failures are
//! reported too, so a script stops with the reason instead of waiting for
//! views that will never come.

use std::time::Instant;

use conclave_secure::{Meter, Policy, SecureEvent, Session};
use tokio::sync::mpsc;

/// What a script asks a member to do in its group.
pub enum Cmd {
    /// Join under this policy.
    Join(Policy),
    /// Send a text message.
    Send(String),
    /// Leave.
    Leave,
}

/// An event of one member.
pub struct Report<T> {
    /// Which member (the script's own label).
    pub who: T,
    /// What happened: an event, or why the member failed (a command its
    /// session refused, or the end of its session).
    pub event: Result<SecureEvent, String>,
    /// When the member's session delivered it.
    pub at: Instant,
    /// With a secure view: what the member's key agreement engine has
    /// spent in the group since it joined ([`Session::meter`]), read when
    /// the view came.
    pub meter: Option<Meter>,
}

/// Runs `session` in group `group` until the command channel closes, the
/// report channel closes or the session ends. A command the session refuses
/// is reported as an error and the member goes on; the end of the session
/// is reported as an error and the member stops.
pub fn spawn<T: Clone + std::fmt::Display + Send + 'static>(
    mut session: Session,
    group: String,
    who: T,
    out: mpsc::UnboundedSender<Report<T>>,
) -> mpsc::UnboundedSender<Cmd> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                cmd = rx.recv() => {
                    let r = match cmd {
                        None => return,
                        Some(Cmd::Join(p)) => session.join(&group, p),
                        Some(Cmd::Send(text)) => session.send(&group, text.as_bytes()),
                        Some(Cmd::Leave) => session.leave(&group),
                    };
                    if let Err(e) = r {
                        if out.send(Report { who: who.clone(), event: Err(e.to_string()), at: Instant::now(), meter: None }).is_err() {
                            return;
                        }
                    }
                }
                ev = session.recv() => {
                    let at = Instant::now();
                    let ended = ev.is_err();
                    let meter = matches!(ev, Ok(SecureEvent::View(_))).then(|| session.meter(&group)).flatten();
                    let event = ev.map_err(|e| format!("session ended: {e}"));
                    if out.send(Report { who: who.clone(), event, at, meter }).is_err() || ended {
                        return;
                    }
                }
            }
        }
    });
    tx
}
