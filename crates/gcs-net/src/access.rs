//! Who may do what on a daemon: group access rules (who may create, join
//! and send to which groups) and the operators who may read its status.
//!
//! This is the integrated architecture's policy "enforced by the
//! administrator's server configuration": the daemon, not the members,
//! decides who takes part in a group. A rule names clients by what the
//! daemon knows of them for certain:
//!
//! * `uid:1000` — a client on the Unix socket run by that Unix user (the
//!   socket's peer credentials);
//! * `alice`, `ops-*` (or `name:alice`) — a client whose member name the
//!   daemon has bound to an identity: the name its TLS client certificate
//!   certifies, or a name its Unix user may take under the daemon's
//!   `[unix_names]`. On a daemon that certifies no names, names are first
//!   come, first served, so a name rule matches no one;
//! * `*` — any client at all.
//!
//! In patterns, `*` stands for any run of characters.

use std::fmt;
use std::str::FromStr;

use conclave_gcs::{GroupName, MemberId};

use crate::daemon::matches_pattern;

/// One entry of a rule's list: whom it lets in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Who {
    /// Any client (`*`).
    Anyone,
    /// A client whose bound member name matches the pattern.
    Name(String),
    /// A Unix-socket client of this Unix user.
    Uid(u32),
}

impl FromStr for Who {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "*" {
            return Ok(Who::Anyone);
        }
        if let Some(uid) = s.strip_prefix("uid:") {
            return uid.parse().map(Who::Uid).map_err(|_| {
                format!("{s:?}: after uid: comes a Unix user id, a number such as 1000 (`id -u` shows yours)")
            });
        }
        let pattern = s.strip_prefix("name:").unwrap_or(s);
        // A pattern must be a valid member name once its stars are filled in.
        MemberId::new(pattern.replace('*', "x")).map_err(|e| {
            format!(
                "{s:?} is not a member name or pattern ({e}); write a name such as alice, a pattern such as ops-*, \
                 uid:1000 for a Unix user, or * for anyone"
            )
        })?;
        Ok(Who::Name(pattern.to_owned()))
    }
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who::Anyone => f.write_str("*"),
            Who::Name(p) => f.write_str(p),
            Who::Uid(uid) => write!(f, "uid:{uid}"),
        }
    }
}

/// What the daemon knows for certain of a client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Principal {
    /// Its Unix user, on the Unix socket.
    pub uid: Option<u32>,
    /// Its member name, if the daemon has bound it to an identity
    /// (certificate, or `[unix_names]`).
    pub name: Option<MemberId>,
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.name, self.uid) {
            (Some(name), Some(uid)) => write!(f, "{name} (Unix user {uid})"),
            (Some(name), None) => write!(f, "certified name {name}"),
            (None, Some(uid)) => write!(f, "Unix user {uid}"),
            (None, None) => f.write_str("a client the daemon knows no identity of"),
        }
    }
}

impl Who {
    /// Whether this entry lets `p` in.
    pub fn matches(&self, p: &Principal) -> bool {
        match self {
            Who::Anyone => true,
            Who::Name(pattern) => p.name.as_ref().is_some_and(|n| matches_pattern(pattern, n.as_str())),
            Who::Uid(uid) => p.uid == Some(*uid),
        }
    }
}

/// What a client asks to do to a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Join a group that does not exist, creating it.
    Create,
    /// Join a group that exists.
    Join,
    /// Multicast or unicast to a group.
    Send,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Create => "create",
            Action::Join => "join",
            Action::Send => "send to",
        })
    }
}

/// One group access rule: for the groups its pattern matches, who may
/// create, join and send. An empty list lets no one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupRule {
    /// Group name or pattern (`*` for any run of characters).
    pub groups: String,
    /// Who may create such a group (join it when it does not exist).
    pub create: Vec<Who>,
    /// Who may join such a group when it exists.
    pub join: Vec<Who>,
    /// Who may multicast and unicast to such a group.
    pub send: Vec<Who>,
}

impl GroupRule {
    /// A rule for the groups `groups` matches, checking the pattern.
    pub fn new(groups: &str, create: Vec<Who>, join: Vec<Who>, send: Vec<Who>) -> Result<Self, String> {
        GroupName::new(groups.replace('*', "x")).map_err(|e| {
            format!(
                "{groups:?} is not a group name or pattern ({e}); write a name such as chat or a pattern such as ops-*"
            )
        })?;
        Ok(Self { groups: groups.to_owned(), create, join, send })
    }

    fn list(&self, action: Action) -> &[Who] {
        match action {
            Action::Create => &self.create,
            Action::Join => &self.join,
            Action::Send => &self.send,
        }
    }
}

impl fmt::Display for GroupRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |l: &[Who]| {
            if l.is_empty() {
                "no one".to_owned()
            } else {
                l.iter().map(Who::to_string).collect::<Vec<_>>().join(", ")
            }
        };
        write!(
            f,
            "groups {}: create: {}; join: {}; send: {}",
            self.groups,
            list(&self.create),
            list(&self.join),
            list(&self.send)
        )
    }
}

/// The group access rules of a daemon. The first rule whose pattern
/// matches a group decides for it; a group no rule matches is closed to
/// everyone (no one may create, join or send to it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessPolicy {
    /// The rules, in order.
    pub rules: Vec<GroupRule>,
}

impl AccessPolicy {
    /// The rule that decides for `group`.
    fn rule(&self, group: &GroupName) -> Option<(usize, &GroupRule)> {
        self.rules.iter().enumerate().find(|(_, r)| matches_pattern(&r.groups, group.as_str()))
    }

    /// Whether `p` may do `action` to `group`.
    pub fn allows(&self, p: &Principal, action: Action, group: &GroupName) -> bool {
        self.rule(group).is_some_and(|(_, r)| r.list(action).iter().any(|w| w.matches(p)))
    }

    /// Whether `p` may do `action` to `group`; if not, why, in words for
    /// the client. A refusal to join or create says which of the two the
    /// client may do only if it may do one: a client that may do neither
    /// learns nothing of whether the group exists.
    pub fn check(&self, p: &Principal, action: Action, group: &GroupName) -> Result<(), String> {
        if self.allows(p, action, group) {
            return Ok(());
        }
        let which = match self.rule(group) {
            Some((i, r)) => format!("rule {} of its access rules (groups {})", i + 1, r.groups),
            None => "its access rules, which name no such group".to_owned(),
        };
        let what = match action {
            Action::Create if self.allows(p, Action::Join, group) => {
                format!("you may join group {group} when it exists, but not create it (it has no members now)")
            }
            Action::Join if self.allows(p, Action::Create, group) => {
                format!("you may create group {group}, but not join it now that it exists")
            }
            Action::Create | Action::Join => format!("you may not join group {group}"),
            Action::Send => format!("you may not send to group {group}"),
        };
        Err(format!("{what}: this daemon's configuration ({which}) does not let {p}; ask the daemon's administrator"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(s: &[&str]) -> Vec<Who> {
        s.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn g(s: &str) -> GroupName {
        GroupName::new(s).unwrap()
    }

    fn named(n: &str) -> Principal {
        Principal { uid: None, name: Some(MemberId::new(n).unwrap()) }
    }

    fn uid(u: u32) -> Principal {
        Principal { uid: Some(u), name: None }
    }

    #[test]
    fn entries_parse_and_print_back() {
        for s in ["*", "alice", "ops-*", "uid:1000"] {
            assert_eq!(s.parse::<Who>().unwrap().to_string(), s);
        }
        assert_eq!("name:alice".parse::<Who>().unwrap(), Who::Name("alice".into()));
        for (bad, says) in [
            ("uid:me", "Unix user id"),
            ("uid:", "Unix user id"),
            ("a b", "not a member name"),
            ("", "not a member name"),
        ] {
            let e = bad.parse::<Who>().unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        assert!(GroupRule::new("a b", vec![], vec![], vec![]).unwrap_err().contains("not a group name"));
    }

    #[test]
    fn the_first_matching_rule_decides_and_unmatched_groups_are_closed() {
        let policy = AccessPolicy {
            rules: vec![
                GroupRule::new("ops-*", who(&["alice"]), who(&["alice", "uid:1000"]), who(&["alice"])).unwrap(),
                GroupRule::new("chat", who(&["*"]), who(&["*"]), who(&["bot-*"])).unwrap(),
            ],
        };
        assert!(policy.allows(&named("alice"), Action::Create, &g("ops-1")));
        assert!(!policy.allows(&named("bob"), Action::Create, &g("ops-1")));
        assert!(policy.allows(&uid(1000), Action::Join, &g("ops-1")));
        assert!(!policy.allows(&uid(1000), Action::Create, &g("ops-1")));
        assert!(!policy.allows(&uid(1001), Action::Join, &g("ops-1")));
        assert!(!policy.allows(&uid(1000), Action::Send, &g("ops-1")));
        // `*` lets anyone in, even a client the daemon knows nothing of.
        assert!(policy.allows(&Principal::default(), Action::Join, &g("chat")));
        assert!(policy.allows(&named("bot-7"), Action::Send, &g("chat")));
        assert!(!policy.allows(&named("alice"), Action::Send, &g("chat")));
        // No rule for it: closed.
        assert!(!policy.allows(&named("alice"), Action::Join, &g("other")));
        // A name rule needs a bound name: a uid alone does not match it.
        assert!(!policy.allows(&uid(0), Action::Create, &g("ops-1")));
    }

    #[test]
    fn refusals_say_what_may_be_done_only_to_those_who_may_do_something() {
        let policy =
            AccessPolicy { rules: vec![GroupRule::new("ops", who(&[]), who(&["uid:1000"]), who(&[])).unwrap()] };
        let e = policy.check(&uid(1000), Action::Create, &g("ops")).unwrap_err();
        assert!(e.contains("may join group ops when it exists, but not create it"), "{e}");
        // A stranger gets the same words whether the group exists or not.
        let create = policy.check(&uid(7), Action::Create, &g("ops")).unwrap_err();
        let join = policy.check(&uid(7), Action::Join, &g("ops")).unwrap_err();
        assert_eq!(create, join);
        assert!(join.contains("you may not join group ops") && join.contains("Unix user 7"), "{join}");
    }
}
