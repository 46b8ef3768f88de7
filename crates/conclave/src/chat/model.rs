//! The chat model: what a Chatter shows, and how the session's events and the
//! user's lines change it. Shared by the terminal screen (`ui`) and the web
//! page (`web`), which only render it; no I/O here but the session calls.

use std::time::SystemTime;

use conclave_secure::{Epoch, Policy, SecureEvent, SecureViewInfo, Session};

/// Most entries kept.
pub const MAX_ENTRIES: usize = 2000;

/// What one entry of the message pane is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A decrypted message.
    Message { sender: String, text: String, mine: bool },
    /// A rekey: the status line of a new secure view, with its duration.
    Rekey(String),
    /// Joins, leaves, command output.
    System(String),
    /// Refusals, rejected messages and errors.
    Warning(String),
}

/// An entry with its sequence number (for the page to add only new ones) and time.
#[derive(Clone, Debug)]
pub struct Stamped {
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub entry: Entry,
}

/// Whether this member holds the group's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// Not a member of the group.
    NotJoined,
    /// Joined (or rekeying after a failed confirmation), no key yet.
    Waiting,
    /// The current secure view's key.
    Keyed { epoch: Epoch, fingerprint: String },
    /// Refused in the current view: no key until the next one.
    Aside { by: String, reason: String },
}

impl KeyState {
    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            KeyState::NotJoined => "not joined".into(),
            KeyState::Waiting => "waiting for key ...".into(),
            KeyState::Keyed { fingerprint, .. } => format!("key {fingerprint}"),
            KeyState::Aside { by, reason } => format!("no key: standing aside ({by} refused you: you {reason})"),
        }
    }
}

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Go,
    Quit,
}

/// The chat's state. See the module doc.
#[derive(Debug)]
pub struct Chat {
    pub me: String,
    pub group: String,
    pub policy: Policy,
    /// The protocol of the current key (the policy's until a view says otherwise).
    pub protocol: String,
    pub joined: bool,
    pub connected: bool,
    pub members: Vec<String>,
    /// Interval rekeying: members of the view that wait for the next rekey
    /// (the session's [`SecureEvent::Waiting`]); shown beside the members.
    pub waiting: Vec<String>,
    pub key: KeyState,
    pub status: String,
    pub entries: Vec<Stamped>,
    next_seq: u64,
}

impl Chat {
    pub fn new(me: &str, group: &str, policy: Policy) -> Self {
        Chat {
            me: me.into(),
            group: group.into(),
            policy,
            protocol: policy.to_string(),
            joined: false,
            connected: true,
            members: Vec::new(),
            waiting: Vec::new(),
            key: KeyState::NotJoined,
            status: format!("joining #{group} ..."),
            entries: Vec::new(),
            next_seq: 1,
        }
    }

    /// Who to list, in order: the members of the key, then those of the view
    /// that wait for the next rekey (`true`).
    pub fn roster(&self) -> Vec<(&str, bool)> {
        let keyed = self.members.iter().map(|m| (m.as_str(), false));
        let waiting = self.waiting.iter().filter(|w| !self.members.contains(w)).map(|m| (m.as_str(), true));
        keyed.chain(waiting).collect()
    }

    /// The current epoch, if this member holds a key.
    pub fn epoch(&self) -> Option<Epoch> {
        match &self.key {
            KeyState::Keyed { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }

    pub fn push(&mut self, entry: Entry) {
        let time_ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.entries.push(Stamped { seq: self.next_seq, time_ms, entry });
        self.next_seq += 1;
        if self.entries.len() > MAX_ENTRIES {
            self.entries.drain(..self.entries.len() - MAX_ENTRIES);
        }
    }

    pub fn system(&mut self, text: impl Into<String>) {
        self.push(Entry::System(text.into()));
    }

    pub fn warning(&mut self, text: impl Into<String>) {
        self.push(Entry::Warning(text.into()));
    }

    /// Joins the group (at start and on `/join`).
    pub fn join(&mut self, session: &mut Session) {
        match session.join(&self.group, self.policy) {
            Ok(()) => {
                self.joined = true;
                self.key = KeyState::Waiting;
                self.status = match self.policy.interval {
                    None => format!("joining #{}: waiting for key ...", self.group),
                    // SEAL: a joiner waits for the leader's next rekey.
                    Some(i) => format!(
                        "joining #{}: waiting for the next rekey (interval rekeying: at most {:?} after the join) ...",
                        self.group, i.period
                    ),
                };
                self.system(format!("joining #{} as {} ({}) ...", self.group, self.me, self.protocol));
            }
            Err(e) => self.warning(format!("cannot join: {e}")),
        }
    }

    /// The session ended (the daemon connection is gone).
    pub fn disconnected(&mut self, error: impl std::fmt::Display) {
        self.connected = false;
        self.joined = false;
        self.key = KeyState::NotJoined;
        self.warning(format!("session ended: {error}"));
        self.status = "disconnected from the daemon; /quit to exit".into();
    }

    /// A line the user typed: a command or a message.
    pub fn submit(&mut self, session: &mut Session, line: &str) -> Flow {
        let line = line.trim();
        let group = self.group.clone();
        match line {
            "" => {}
            "/quit" => {
                if self.joined {
                    let _ = session.leave(&group);
                }
                return Flow::Quit;
            }
            "/who" => {
                let epoch = self.epoch().map_or("none".to_owned(), |e| e.to_string());
                let who = if self.members.is_empty() { "nobody".to_owned() } else { self.members.join(", ") };
                let msg = format!("members of #{group} (epoch {epoch}, {}): {who}", self.protocol);
                self.system(msg);
            }
            "/leave" => match session.leave(&group) {
                Ok(()) => self.system(format!("leaving #{group} ...")),
                Err(e) => self.warning(e.to_string()),
            },
            "/join" => self.join(session),
            cmd if cmd.starts_with('/') => self.warning(format!("unknown command {cmd} (/who, /leave, /join, /quit)")),
            text => {
                if let Err(e) = session.send(&group, text.as_bytes()) {
                    self.warning(format!("not sent: {e}"));
                }
            }
        }
        Flow::Go
    }

    /// What the session delivered.
    pub fn on_event(&mut self, ev: SecureEvent) {
        match ev {
            SecureEvent::View(v) => self.on_view(v),
            SecureEvent::Message { sender, data, .. } => {
                let mine = sender.as_str() == self.me;
                let text = String::from_utf8_lossy(&data).replace(|c: char| c.is_control(), " ");
                self.push(Entry::Message { sender: sender.as_str().to_owned(), text, mine });
            }
            SecureEvent::Rejected { sender, reason, .. } => {
                self.warning(format!("rejected a message from {sender}: {reason}"))
            }
            SecureEvent::PolicyMismatch { theirs, from, .. } => {
                let theirs = theirs.map_or("another policy".to_owned(), |p| p.to_string().replace(":0s", ""));
                let msg = format!("#{} runs {theirs} (told by {from}), not {}; left it", self.group, self.protocol);
                self.warning(msg);
            }
            SecureEvent::Refused { member, reason, .. } => self.warning(format!("refused {member}: {reason}")),
            SecureEvent::Excluded { by, reason, .. } => {
                // Standing aside: no key, so show none.
                self.key = KeyState::Aside { by: by.as_str().to_owned(), reason: reason.to_string() };
                self.status = format!("standing aside in #{}: no key until the next view", self.group);
                self.warning(format!("{by} refused you: you {reason}; you get no key in this view"))
            }
            SecureEvent::KeyMismatch { epoch, unconfirmed, .. } => {
                let who: Vec<&str> = unconfirmed.iter().map(|m| m.as_str()).collect();
                self.key = KeyState::Waiting;
                self.status = format!("rekeying #{}: waiting for key ...", self.group);
                self.warning(format!(
                    "key confirmation failed in epoch {epoch}: {} did not confirm your key; rekeying (nothing was sent under it)",
                    who.join(", ")
                ))
            }
            SecureEvent::Waiting { members, .. } => {
                let waiting: Vec<String> = members.iter().map(|m| m.as_str().to_owned()).collect();
                let new: Vec<String> =
                    waiting.iter().filter(|m| **m != self.me && !self.waiting.contains(m)).cloned().collect();
                for m in new {
                    self.system(format!("{m} is in the view, waiting for the next rekey"));
                }
                self.waiting = waiting;
            }
            SecureEvent::Left { group } => {
                self.joined = false;
                self.members.clear();
                self.waiting.clear();
                self.key = KeyState::NotJoined;
                self.system(format!("you left #{group}; /join to come back, /quit to exit"));
                self.status = format!("not in #{group}");
            }
            SecureEvent::DaemonError { code, text } => self.warning(format!("daemon: {code:?}: {text}")),
        }
    }

    fn on_view(&mut self, v: SecureViewInfo) {
        let members: Vec<String> = v.members.iter().map(|m| m.as_str().to_owned()).collect();
        let joined: Vec<String> = members.iter().filter(|m| !self.members.contains(m)).cloned().collect();
        let left: Vec<String> = self.members.iter().filter(|m| !members.contains(m)).cloned().collect();
        joined.iter().for_each(|m| self.system(format!("{m} joined")));
        left.iter().for_each(|m| self.system(format!("{m} left")));
        let ms = v.rekey_time.as_secs_f64() * 1000.0;
        self.status =
            format!("rekey to epoch {} ({}) in {ms:.1} ms, {} members", v.epoch, v.protocol.name(), members.len());
        self.push(Entry::Rekey(self.status.clone()));
        self.members = members;
        if self.policy.interval.is_none() {
            self.protocol = v.protocol.name().to_owned();
        }
        self.key = KeyState::Keyed { epoch: v.epoch, fingerprint: v.fingerprint };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_numbered_and_bounded() {
        let mut chat = Chat::new("alice", "room", Policy::default());
        for i in 0..MAX_ENTRIES + 5 {
            chat.system(format!("line {i}"));
        }
        assert_eq!(chat.entries.len(), MAX_ENTRIES);
        assert_eq!(chat.entries[0].seq, 6);
        assert_eq!(chat.entries.last().unwrap().seq, MAX_ENTRIES as u64 + 5);
    }

    #[test]
    fn members_waiting_for_the_next_rekey_are_listed_and_flagged_until_the_rekey() {
        let g = || conclave_secure::GroupName::new("room").unwrap();
        let id = |n: &str| conclave_secure::MemberId::new(n).unwrap();
        let mut chat = Chat::new("alice", "room", "queue-batch:15s".parse().unwrap());
        let epoch = Epoch::new(conclave_secure::ViewId::new(1 << 48, 3), 0);
        let view = |members: &[&str]| {
            SecureEvent::View(SecureViewInfo {
                group: g(),
                members: members.iter().map(|m| id(m)).collect(),
                epoch,
                protocol: conclave_secure::ProtocolId::Tgdh,
                fingerprint: "ab".into(),
                rekey_time: std::time::Duration::ZERO,
            })
        };
        chat.on_event(view(&["alice", "bob"]));
        assert_eq!(chat.roster(), [("alice", false), ("bob", false)]);
        chat.on_event(SecureEvent::Waiting { group: g(), members: vec![id("carol")] });
        assert_eq!(chat.roster(), [("alice", false), ("bob", false), ("carol", true)]);
        assert!(chat
            .entries
            .iter()
            .any(|e| matches!(&e.entry, Entry::System(t) if t.contains("carol is in the view, waiting"))));
        chat.on_event(view(&["alice", "bob", "carol"]));
        chat.on_event(SecureEvent::Waiting { group: g(), members: vec![] });
        assert_eq!(chat.roster(), [("alice", false), ("bob", false), ("carol", false)]);
    }

    #[test]
    fn exclusion_drops_the_key_and_says_why() {
        let mut chat = Chat::new("mallory", "room", Policy::default());
        let epoch = Epoch::new(conclave_secure::ViewId::new(1 << 48, 3), 0);
        chat.key = KeyState::Keyed { epoch, fingerprint: "abcd".into() };
        chat.on_event(SecureEvent::Excluded {
            group: conclave_secure::GroupName::new("room").unwrap(),
            by: conclave_secure::MemberId::new("alice").unwrap(),
            reason: conclave_secure::Refusal::NoCertificate,
        });
        assert_eq!(chat.epoch(), None);
        assert!(chat.key.describe().contains("standing aside"), "{}", chat.key.describe());
        assert!(matches!(&chat.entries[0].entry, Entry::Warning(w) if w.contains("alice refused you")));
    }
}
