//! `conclave_event_t`: one delivery of the session, with its strings made
//! C strings once, so accessors hand out pointers into the event.

use std::ffi::CString;

use conclave_secure::SecureEvent;

use crate::handle::Delivered;
use crate::status::cstring;

/// What an event is (`conclave_event_kind`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum conclave_event_kind_t {
    /// A new secure view: members (`conclave_event_member_count`,
    /// `conclave_event_member`), epoch, protocol, key fingerprint. Messages
    /// from now on are of this view.
    CONCLAVE_EVENT_VIEW = 1,
    /// A decrypted message: sender and bytes (own messages come back too).
    CONCLAVE_EVENT_MESSAGE = 2,
    /// This member left the group; nothing more comes from it.
    CONCLAVE_EVENT_LEFT = 3,
    /// A message from `sender` was refused (altered, replayed, bad
    /// signature, ...); the session goes on. The text says why.
    CONCLAVE_EVENT_REJECTED = 4,
    /// The group runs another policy than the one this member joined with;
    /// this member was taken out (`CONCLAVE_EVENT_LEFT` follows). `sender`
    /// is the older member whose message showed it.
    CONCLAVE_EVENT_POLICY_MISMATCH = 5,
    /// A member (`sender`) was refused a place in the group: no valid
    /// certificate from the authority. The text says why.
    CONCLAVE_EVENT_REFUSED = 6,
    /// This member was refused in the current view (by `sender`); it holds
    /// no key until the next view.
    CONCLAVE_EVENT_EXCLUDED = 7,
    /// Key confirmation failed; the view is being agreed again. Members
    /// (`conclave_event_member`) are those whose confirmation did not match.
    CONCLAVE_EVENT_KEY_MISMATCH = 8,
    /// The daemon refused a request; the text says what and why.
    CONCLAVE_EVENT_DAEMON_ERROR = 9,
    /// The session ended (the connection to the daemon is gone); the last
    /// event. Later `conclave_recv` calls return `CONCLAVE_ERR_CLOSED`.
    CONCLAVE_EVENT_CLOSED = 10,
    /// Interval rekeying: the members of the view (`conclave_event_member`)
    /// that hold no key yet and wait for the next rekey; sent when that list
    /// changes, empty once everyone is in the key.
    CONCLAVE_EVENT_WAITING = 11,
}

pub use conclave_event_kind_t::*;

/// An event as the C side sees it. Opaque to C.
pub struct Event {
    pub(crate) kind: conclave_event_kind_t,
    pub(crate) group: Option<CString>,
    pub(crate) sender: Option<CString>,
    pub(crate) data: bytes::Bytes,
    pub(crate) members: Vec<CString>,
    pub(crate) epoch: Option<CString>,
    pub(crate) fingerprint: Option<CString>,
    pub(crate) protocol: Option<CString>,
    pub(crate) text: CString,
}

fn names<'a>(ms: impl IntoIterator<Item = &'a conclave_secure::MemberId>) -> String {
    ms.into_iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
}

impl Event {
    fn new(kind: conclave_event_kind_t, text: String) -> Event {
        Event {
            kind,
            group: None,
            sender: None,
            data: bytes::Bytes::new(),
            members: Vec::new(),
            epoch: None,
            fingerprint: None,
            protocol: None,
            text: cstring(&text),
        }
    }

    pub(crate) fn from_delivered(d: Delivered) -> Event {
        let ev = match d {
            Delivered::Event(ev) => ev,
            Delivered::Closed(why) => return Event::new(CONCLAVE_EVENT_CLOSED, format!("the session ended: {why}")),
        };
        let c = |s: &str| Some(cstring(s));
        match ev {
            SecureEvent::View(v) => {
                let text = format!(
                    "secure view of {} at epoch {} ({}, key fingerprint {}, rekeyed in {} ms): {}",
                    v.group,
                    v.epoch,
                    v.protocol,
                    v.fingerprint,
                    v.rekey_time.as_millis(),
                    names(&v.members)
                );
                Event {
                    group: c(v.group.as_str()),
                    members: v.members.iter().map(|m| cstring(m.as_str())).collect(),
                    epoch: c(&v.epoch.to_string()),
                    fingerprint: c(&v.fingerprint),
                    protocol: c(v.protocol.name()),
                    ..Event::new(CONCLAVE_EVENT_VIEW, text)
                }
            }
            SecureEvent::Message { group, sender, epoch, data } => {
                let text = format!("{group}: {} bytes from {sender} at epoch {epoch}", data.len());
                Event {
                    group: c(group.as_str()),
                    sender: c(sender.as_str()),
                    epoch: c(&epoch.to_string()),
                    data,
                    ..Event::new(CONCLAVE_EVENT_MESSAGE, text)
                }
            }
            SecureEvent::Left { group } => {
                Event { group: c(group.as_str()), ..Event::new(CONCLAVE_EVENT_LEFT, format!("left {group}")) }
            }
            SecureEvent::Rejected { group, sender, reason } => {
                let text = format!("{group}: a message from {sender} was rejected: {reason}");
                Event {
                    group: c(group.as_str()),
                    sender: c(sender.as_str()),
                    ..Event::new(CONCLAVE_EVENT_REJECTED, text)
                }
            }
            SecureEvent::PolicyMismatch { group, ours, theirs, from } => {
                let theirs = theirs.map_or_else(|| "another policy".to_owned(), |p| format!("policy {p}"));
                let text = format!(
                    "{group}: the group runs {theirs}, not {ours} (shown by {from}); this member was taken out"
                );
                Event {
                    group: c(group.as_str()),
                    sender: c(from.as_str()),
                    ..Event::new(CONCLAVE_EVENT_POLICY_MISMATCH, text)
                }
            }
            SecureEvent::Refused { group, member, reason } => {
                let text = format!("{group}: {member} was refused: {reason}");
                Event {
                    group: c(group.as_str()),
                    sender: c(member.as_str()),
                    ..Event::new(CONCLAVE_EVENT_REFUSED, text)
                }
            }
            SecureEvent::Excluded { group, by, reason } => {
                let text =
                    format!("{group}: this member was refused by {by} and holds no key until the next view: {reason}");
                Event { group: c(group.as_str()), sender: c(by.as_str()), ..Event::new(CONCLAVE_EVENT_EXCLUDED, text) }
            }
            SecureEvent::KeyMismatch { group, epoch, unconfirmed } => {
                let text = format!(
                    "{group}: key confirmation failed at epoch {epoch} (unconfirmed: {}); the view is agreed again",
                    names(&unconfirmed)
                );
                Event {
                    group: c(group.as_str()),
                    epoch: c(&epoch.to_string()),
                    members: unconfirmed.iter().map(|m| cstring(m.as_str())).collect(),
                    ..Event::new(CONCLAVE_EVENT_KEY_MISMATCH, text)
                }
            }
            SecureEvent::Waiting { group, members } => {
                let text = match members.is_empty() {
                    true => format!("{group}: every member holds the key"),
                    false => format!("{group}: waiting for the next rekey: {}", names(&members)),
                };
                Event {
                    group: c(group.as_str()),
                    members: members.iter().map(|m| cstring(m.as_str())).collect(),
                    ..Event::new(CONCLAVE_EVENT_WAITING, text)
                }
            }
            SecureEvent::DaemonError { code, text } => {
                Event::new(CONCLAVE_EVENT_DAEMON_ERROR, format!("the daemon refused a request ({code:?}): {text}"))
            }
        }
    }
}
