//! The daemon core's semantics, one test per promise of `conclave_gcs::core`,
//! then random streams checked against the virtual synchrony invariants, then
//! the daemon-group exchange of cluster backbones.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use conclave_gcs::core::{ConnId, Core, DaemonId, Delivery, ErrorCode, GroupMode, Limits, Op, Output, Service};
use conclave_gcs::{Cause, GroupName, MemberId, View, ViewId};
use proptest::prelude::*;

fn conn(d: u16, n: u64) -> ConnId {
    ConnId { daemon: DaemonId(d), local: n }
}

fn g(s: &str) -> GroupName {
    GroupName::new(s).unwrap()
}

fn m(s: &str) -> MemberId {
    MemberId::new(s).unwrap()
}

/// Daemons of one component, fed one stream as a backbone would: what a core
/// submits is ordered after the operation being processed.
/// Daemon `d`'s incarnation in these tests (any fixed value per daemon).
fn inc(d: u16) -> u64 {
    0xC0DE_0000 + u64::from(d)
}

struct Component {
    cores: Vec<Core>,
    log: Vec<(ConnId, Delivery)>,
}

impl Component {
    fn new(daemons: &[u16]) -> Self {
        Self::with(daemons.iter().map(|&d| Core::new(DaemonId(d), Limits::default(), inc(d))).collect())
    }

    fn with(cores: Vec<Core>) -> Self {
        Self { cores, log: Vec::new() }
    }

    fn feed(&mut self, op: Op) {
        let mut stream = VecDeque::from([op]);
        while let Some(op) = stream.pop_front() {
            for core in &mut self.cores {
                let mut out = Vec::new();
                core.handle(op.clone(), &mut out);
                for o in out {
                    match o {
                        Output::Deliver { to, delivery } => {
                            for c in to {
                                assert_eq!(c.daemon, core.me(), "a core delivers only to its own clients");
                                self.log.push((c, delivery.clone()));
                            }
                        }
                        Output::Submit(op) => stream.push_back(op),
                    }
                }
            }
        }
    }

    fn take(&mut self, c: ConnId) -> Vec<Delivery> {
        let (mine, rest) = std::mem::take(&mut self.log).into_iter().partition(|(to, _)| *to == c);
        self.log = rest;
        mine.into_iter().map(|(_, d)| d).collect()
    }

    fn connect(&mut self, c: ConnId, name: &str) {
        self.feed(Op::Connect { conn: c, name: m(name) });
        assert_eq!(self.take(c), [Delivery::Welcome { member: m(name) }]);
    }

    fn join(&mut self, c: ConnId, group: &str) {
        self.feed(Op::Join { conn: c, group: g(group), open: false, mode: GroupMode::Members });
    }

    fn send(&mut self, c: ConnId, group: &str, text: &str) {
        self.feed(Op::Multicast {
            conn: c,
            group: g(group),
            service: Service::Agreed,
            payload: Bytes::copy_from_slice(text.as_bytes()),
        });
    }
}

fn views(ds: &[Delivery]) -> Vec<View> {
    ds.iter()
        .filter_map(|d| match d {
            Delivery::View { view, .. } => Some(view.clone()),
            _ => None,
        })
        .collect()
}

fn names(v: &View) -> Vec<&str> {
    v.ids().map(|i| i.as_str()).collect()
}

fn error_code(ds: &[Delivery]) -> Option<ErrorCode> {
    ds.iter().find_map(|d| match d {
        Delivery::Error { code, .. } => Some(*code),
        _ => None,
    })
}

fn one() -> Component {
    Component::new(&[0])
}

/// One daemon whose clients `conn(0, i)`, named `names[i]`, joined group "g"
/// in that order; their deliveries so far are consumed. Returns the last view's id.
fn group_g(names: &[&str]) -> (Component, ViewId) {
    let mut c = one();
    for (i, n) in names.iter().enumerate() {
        c.connect(conn(0, i as u64), n);
        c.join(conn(0, i as u64), "g");
    }
    let mut last = None;
    for i in 0..names.len() {
        last = views(&c.take(conn(0, i as u64))).pop().map(|v| v.id);
    }
    (c, last.expect("a view"))
}

#[test]
fn names_are_unique_among_connected_clients() {
    let mut c = one();
    c.connect(conn(0, 1), "alice");
    c.feed(Op::Connect { conn: conn(0, 2), name: m("alice") });
    let code = error_code(&c.take(conn(0, 2))).unwrap();
    assert_eq!(code, ErrorCode::NameTaken);
    assert!(code.is_fatal());
    // Once alice is gone, the name is free again.
    c.feed(Op::Disconnect { conn: conn(0, 1) });
    c.connect(conn(0, 3), "alice");
}

#[test]
fn requests_before_hello_are_refused() {
    let mut c = one();
    c.join(conn(0, 1), "g");
    assert_eq!(error_code(&c.take(conn(0, 1))), Some(ErrorCode::NotConnected));
    c.connect(conn(0, 1), "a");
    c.feed(Op::Connect { conn: conn(0, 1), name: m("b") });
    assert_eq!(error_code(&c.take(conn(0, 1))), Some(ErrorCode::AlreadyConnected));
}

#[test]
fn a_restarted_daemon_never_repeats_a_view_id() {
    // The same client stream in two lifetimes of daemon 0: the counters
    // start over, the incarnations differ, so no id of the first lifetime
    // (which members sign over) comes back in the second.
    let lifetime = |incarnation| {
        let mut c = Component::with(vec![Core::new(DaemonId(0), Limits::default(), incarnation)]);
        for (i, n) in ["alice", "bob"].iter().enumerate() {
            c.connect(conn(0, i as u64), n);
            c.join(conn(0, i as u64), "g");
        }
        views(&c.take(conn(0, 0))).into_iter().map(|v| v.id).collect::<Vec<_>>()
    };
    let (first, second) = (lifetime(7), lifetime(8));
    assert_eq!(first.iter().map(|v| v.seq).collect::<Vec<_>>(), second.iter().map(|v| v.seq).collect::<Vec<_>>());
    assert!(first.iter().all(|v| !second.contains(v)), "{first:?} and {second:?} share an id");
}

#[test]
fn views_list_members_oldest_first_with_their_previous_view() {
    let mut c = one();
    for (i, n) in ["carol", "alice", "bob"].iter().enumerate() {
        c.connect(conn(0, i as u64), n);
        c.join(conn(0, i as u64), "g");
    }
    let carol = views(&c.take(conn(0, 0)));
    let alice = views(&c.take(conn(0, 1)));
    let bob = views(&c.take(conn(0, 2)));
    assert_eq!(
        carol.iter().map(|v| v.id).collect::<Vec<_>>(),
        [ViewId::new(inc(0), 1), ViewId::new(inc(0), 2), ViewId::new(inc(0), 3)]
    );
    assert_eq!(names(&carol[2]), ["carol", "alice", "bob"], "join order, not name order");
    assert_eq!(carol[2].cause, Cause::Join);
    // Everyone in a view gets the same view.
    assert_eq!(alice.last(), carol.last());
    assert_eq!(bob, carol[2..]);
    // prev: the member's previous view of the group, None for the newcomer.
    let prev: Vec<_> = carol[2].members.iter().map(|m| m.prev).collect();
    assert_eq!(prev, [Some(ViewId::new(inc(0), 2)), Some(ViewId::new(inc(0), 2)), None]);
    assert_eq!(carol[1].member(&m("carol")).unwrap().prev, Some(ViewId::new(inc(0), 1)));
}

#[test]
fn view_ids_are_unique_across_groups() {
    let mut c = one();
    c.connect(conn(0, 1), "a");
    c.join(conn(0, 1), "g");
    c.join(conn(0, 1), "h");
    c.feed(Op::Leave { conn: conn(0, 1), group: g("g") });
    c.join(conn(0, 1), "g");
    let ids: Vec<_> = views(&c.take(conn(0, 1))).iter().map(|v| v.id.seq).collect();
    assert_eq!(ids, [1, 2, 3], "g, h, g again: one counter for all groups");
}

#[test]
fn leaving_tells_the_leaver_and_shows_the_others_a_new_view() {
    let (mut c, full) = group_g(&["a", "b", "c"]);
    c.feed(Op::Leave { conn: conn(0, 1), group: g("g") });
    assert_eq!(c.take(conn(0, 1)), [Delivery::Left { group: g("g") }]);
    let v = views(&c.take(conn(0, 0)));
    assert_eq!(names(&v[0]), ["a", "c"]);
    assert_eq!(v[0].cause, Cause::Leave);
    assert_eq!(v[0].members.iter().map(|m| m.prev).collect::<Vec<_>>(), [Some(full); 2]);
    assert_eq!(views(&c.take(conn(0, 2))), v);
    // After Left, the group's traffic no longer reaches the leaver.
    c.send(conn(0, 0), "g", "after");
    assert!(c.take(conn(0, 1)).is_empty());
    // Leaving again: not a member; a group nobody is in: unknown.
    c.feed(Op::Leave { conn: conn(0, 1), group: g("g") });
    assert_eq!(error_code(&c.take(conn(0, 1))), Some(ErrorCode::NotMember));
    c.feed(Op::Leave { conn: conn(0, 1), group: g("nowhere") });
    assert_eq!(error_code(&c.take(conn(0, 1))), Some(ErrorCode::UnknownGroup));
}

#[test]
fn an_empty_group_ceases_to_exist_and_its_options_with_it() {
    let mut c = one();
    c.connect(conn(0, 1), "a");
    c.connect(conn(0, 2), "b");
    c.feed(Op::Join { conn: conn(0, 1), group: g("g"), open: true, mode: GroupMode::Members });
    c.feed(Op::Leave { conn: conn(0, 1), group: g("g") });
    assert!(c.cores[0].groups().next().is_none());
    c.send(conn(0, 2), "g", "anyone?");
    assert_eq!(error_code(&c.take(conn(0, 2))), Some(ErrorCode::UnknownGroup));
    // Recreated closed: a non-member may no longer send.
    c.join(conn(0, 1), "g");
    c.send(conn(0, 2), "g", "anyone?");
    assert_eq!(error_code(&c.take(conn(0, 2))), Some(ErrorCode::NotMember));
}

#[test]
fn a_disconnect_removes_the_client_from_every_group() {
    let mut c = one();
    c.connect(conn(0, 1), "a");
    c.connect(conn(0, 2), "b");
    for grp in ["g", "h"] {
        c.join(conn(0, 1), grp);
        c.join(conn(0, 2), grp);
    }
    c.take(conn(0, 1));
    c.take(conn(0, 2));
    c.feed(Op::Disconnect { conn: conn(0, 2) });
    assert!(c.take(conn(0, 2)).is_empty(), "nothing goes to a closed connection");
    let v = views(&c.take(conn(0, 1)));
    assert_eq!(v.len(), 2);
    assert!(v.iter().all(|v| v.cause == Cause::Disconnect && names(v) == ["a"]));
    // A second disconnect (e.g. the shell's and the reader's) changes nothing.
    c.feed(Op::Disconnect { conn: conn(0, 2) });
    assert!(c.take(conn(0, 1)).is_empty());
}

#[test]
fn multicasts_reach_every_member_including_the_sender_in_stream_order() {
    let (mut c, v) = group_g(&["a", "b", "c"]);
    c.send(conn(0, 1), "g", "1");
    c.feed(Op::Multicast {
        conn: conn(0, 0),
        group: g("g"),
        service: Service::Fifo,
        payload: Bytes::from_static(b"2"),
    });
    c.send(conn(0, 1), "g", "3");
    let expect = |sender: &str, service, text: &'static str| Delivery::Message {
        group: g("g"),
        sender: m(sender),
        service,
        view: v,
        payload: Bytes::from_static(text.as_bytes()),
    };
    let want = [expect("b", Service::Agreed, "1"), expect("a", Service::Fifo, "2"), expect("b", Service::Agreed, "3")];
    for i in 0..3 {
        assert_eq!(c.take(conn(0, i)), want, "member {i}");
    }
}

#[test]
fn closed_groups_refuse_non_members_and_open_groups_accept_them() {
    let mut c = one();
    c.connect(conn(0, 1), "member");
    c.connect(conn(0, 2), "outsider");
    c.join(conn(0, 1), "closed");
    c.feed(Op::Join { conn: conn(0, 1), group: g("open"), open: true, mode: GroupMode::Members });
    c.take(conn(0, 1));
    c.send(conn(0, 2), "closed", "x");
    assert_eq!(error_code(&c.take(conn(0, 2))), Some(ErrorCode::NotMember));
    assert!(c.take(conn(0, 1)).is_empty());
    c.send(conn(0, 2), "open", "y");
    assert!(c.take(conn(0, 2)).is_empty(), "a non-member does not get its own multicast");
    let got = c.take(conn(0, 1));
    assert!(matches!(&got[..], [Delivery::Message { sender, .. }] if sender.as_str() == "outsider"));
    c.feed(Op::Unicast { conn: conn(0, 2), group: g("open"), to: m("member"), payload: Bytes::new() });
    assert!(matches!(&c.take(conn(0, 1))[..], [Delivery::Unicast { .. }]));
    // A later join cannot change the option.
    c.feed(Op::Join { conn: conn(0, 2), group: g("closed"), open: true, mode: GroupMode::Members });
    c.feed(Op::Leave { conn: conn(0, 2), group: g("closed") });
    c.take(conn(0, 2));
    c.send(conn(0, 2), "closed", "x");
    assert_eq!(error_code(&c.take(conn(0, 2))), Some(ErrorCode::NotMember));
}

/// A group is keyed by its daemons or not as its creator chose: a join that
/// asks otherwise is refused and changes nothing, and the choice survives a
/// state exchange.
#[test]
fn a_keyed_group_stays_keyed_and_refuses_joins_that_ask_otherwise() {
    let mut pair = Component::new(&[1, 2]);
    pair.connect(conn(1, 1), "a");
    pair.feed(Op::Join { conn: conn(1, 1), group: g("k"), open: false, mode: GroupMode::Keyed });
    assert_eq!(error_code(&pair.take(conn(1, 1))), Some(ErrorCode::ModeMismatch), "no machine gives keys here");
    for core in &mut pair.cores {
        core.key_groups();
    }
    pair.feed(daemons(1, &[1, 2]));
    pair.connect(conn(2, 1), "b");
    pair.feed(Op::Join { conn: conn(1, 1), group: g("k"), open: false, mode: GroupMode::Keyed });
    pair.feed(Op::Join { conn: conn(2, 1), group: g("k"), open: false, mode: GroupMode::Members });
    assert_eq!(error_code(&pair.take(conn(2, 1))), Some(ErrorCode::ModeMismatch));
    assert!(pair.cores.iter().all(|c| c.keyed(&g("k")) && c.view(&g("k")).unwrap().members.len() == 1));
    pair.feed(Op::Join { conn: conn(2, 1), group: g("k"), open: false, mode: GroupMode::Keyed });
    assert_eq!(names(&views(&pair.take(conn(2, 1)))[0]), ["a", "b"]);
    // The other way round: a plain group refuses a keyed join.
    pair.feed(Op::Join { conn: conn(1, 1), group: g("plain"), open: false, mode: GroupMode::Members });
    pair.feed(Op::Join { conn: conn(2, 1), group: g("plain"), open: false, mode: GroupMode::Keyed });
    assert_eq!(error_code(&pair.take(conn(2, 1))), Some(ErrorCode::ModeMismatch));
    // Through an exchange, every core still knows which group is keyed.
    pair.feed(daemons(2, &[1, 2]));
    assert!(pair.cores.iter().all(|c| c.keyed(&g("k")) && !c.keyed(&g("plain"))));
}

/// A three-step group (sealed between the daemons, no group key) can be
/// created only where the daemons seal their backbone; its mode holds
/// against joins that ask for another, and through an exchange.
#[test]
fn a_three_step_group_needs_a_sealing_daemon_and_keeps_its_mode() {
    let mut pair = Component::new(&[1, 2]);
    pair.connect(conn(1, 1), "a");
    let three_step = |c: ConnId| Op::Join { conn: c, group: g("t"), open: false, mode: GroupMode::ThreeStep };
    pair.feed(three_step(conn(1, 1)));
    assert_eq!(error_code(&pair.take(conn(1, 1))), Some(ErrorCode::ModeMismatch), "nothing seals the backbone");
    for core in &mut pair.cores {
        core.seal_groups();
    }
    pair.feed(daemons(1, &[1, 2]));
    pair.connect(conn(2, 1), "b");
    pair.feed(three_step(conn(1, 1)));
    assert_eq!(views(&pair.take(conn(1, 1))).len(), 1);
    for mode in [GroupMode::Members, GroupMode::Keyed] {
        pair.feed(Op::Join { conn: conn(2, 1), group: g("t"), open: false, mode });
        let got = pair.take(conn(2, 1));
        assert_eq!(error_code(&got), Some(ErrorCode::ModeMismatch), "{mode:?}: {got:?}");
    }
    pair.feed(three_step(conn(2, 1)));
    assert_eq!(names(&views(&pair.take(conn(2, 1)))[0]), ["a", "b"]);
    pair.feed(daemons(2, &[1, 2]));
    assert!(pair.cores.iter().all(|c| c.mode(&g("t")) == Some(GroupMode::ThreeStep) && !c.keyed(&g("t"))));
    assert_eq!(pair.cores[0].view(&g("t")).unwrap().members.len(), 2);
}

/// An Optimized EVS group is keyed by its daemons like an Integrated VS
/// one, and every daemon records each of its views, also the daemon with no
/// member in it: that daemon must hold the key of a view its next joiner's
/// messages may be sealed under.
#[test]
fn optimized_evs_groups_are_keyed_and_every_daemon_records_their_views() {
    let mut pair = Component::new(&[1, 2]);
    pair.connect(conn(1, 1), "a");
    let evs = |c: ConnId| Op::Join { conn: c, group: g("e"), open: false, mode: GroupMode::OptimizedEvs };
    pair.feed(evs(conn(1, 1)));
    assert_eq!(error_code(&pair.take(conn(1, 1))), Some(ErrorCode::ModeMismatch), "no daemon keys groups");
    for core in &mut pair.cores {
        core.key_groups();
    }
    pair.feed(daemons(1, &[1, 2]));
    for core in &mut pair.cores {
        core.take_evs_views();
    }
    pair.connect(conn(2, 1), "b");
    pair.feed(evs(conn(1, 1)));
    let first = views(&pair.take(conn(1, 1)))[0].id;
    pair.feed(Op::Join { conn: conn(2, 1), group: g("e"), open: false, mode: GroupMode::Keyed });
    assert_eq!(error_code(&pair.take(conn(2, 1))), Some(ErrorCode::ModeMismatch));
    pair.feed(evs(conn(2, 1)));
    let second = views(&pair.take(conn(2, 1)))[0].id;
    for core in &mut pair.cores {
        assert!(core.keyed(&g("e")) && core.mode(&g("e")) == Some(GroupMode::OptimizedEvs));
        let recorded: Vec<ViewId> = core
            .take_evs_views()
            .into_iter()
            .map(|(group, v)| {
                assert_eq!(group, g("e"));
                v
            })
            .collect();
        assert_eq!(recorded, [first, second], "daemon {:?}", core.me());
        assert!(core.take_evs_views().is_empty(), "taken once");
    }
}

/// Joins that a standalone daemon ordered together give each group one
/// view with all of its joiners (in order, after its members), not one per
/// joiner; every refusal is as if each had been handled alone, and the
/// groups end as they would have.
#[test]
fn joins_ordered_together_give_each_group_one_view() {
    let join = |c: ConnId, group: &str, mode: GroupMode| Op::Join { conn: c, group: g(group), open: false, mode };
    let (mut c, before) = group_g(&["old"]);
    for (i, n) in ["a", "b", "d", "e"].iter().enumerate() {
        c.connect(conn(0, 10 + i as u64), n);
    }
    let (a, b, d, e) = (conn(0, 10), conn(0, 11), conn(0, 12), conn(0, 13));
    let script = || {
        vec![
            join(a, "g", GroupMode::Members),
            join(b, "h", GroupMode::Members),
            join(e, "g", GroupMode::Members),
            join(d, "h", GroupMode::ThreeStep), // another mode than h's creator's
            join(a, "g", GroupMode::Members),   // a's second: after its view, refused
        ]
    };
    let ops = script();
    let mut out = Vec::new();
    c.cores[0].handle_joins(ops, &mut out);
    for o in out {
        if let Output::Deliver { to, delivery } = o {
            for t in to {
                c.log.push((t, delivery.clone()));
            }
        }
    }
    let g_views = views(&c.take(conn(0, 0)));
    assert_eq!(g_views.len(), 1, "one view of g for two joiners");
    assert_eq!(names(&g_views[0]), ["old", "a", "e"]);
    let prevs: Vec<_> = g_views[0].members.iter().map(|m| m.prev).collect();
    assert_eq!(prevs, [Some(before), None, None]);
    let got_a = c.take(a);
    assert!(matches!(
        got_a.as_slice(),
        [Delivery::View { .. }, Delivery::Error { code: ErrorCode::AlreadyMember, .. }]
    ));
    assert_eq!(views(&got_a), g_views, "a sees g's one view, then its refusal");
    assert_eq!(views(&c.take(b)).len(), 1, "b: one view of h");
    assert_eq!(error_code(&c.take(d)), Some(ErrorCode::ModeMismatch));
    assert_eq!(names(c.cores[0].view(&g("h")).unwrap()), ["b"]);

    // The same joins one by one end with the same groups.
    let (mut one_by_one, _) = group_g(&["old"]);
    for (i, n) in ["a", "b", "d", "e"].iter().enumerate() {
        one_by_one.connect(conn(0, 10 + i as u64), n);
    }
    for op in script() {
        one_by_one.feed(op);
    }
    for group in ["g", "h"] {
        let (x, y) = (c.cores[0].view(&g(group)).unwrap(), one_by_one.cores[0].view(&g(group)).unwrap());
        assert_eq!(names(x), names(y), "{group}");
    }
}

#[test]
fn unicasts_reach_only_their_recipient() {
    let (mut c, v) = group_g(&["a", "b", "c"]);
    c.feed(Op::Unicast { conn: conn(0, 0), group: g("g"), to: m("c"), payload: Bytes::from_static(b"psst") });
    assert!(c.take(conn(0, 0)).is_empty());
    assert!(c.take(conn(0, 1)).is_empty());
    let want = Delivery::Unicast { group: g("g"), sender: m("a"), view: v, payload: Bytes::from_static(b"psst") };
    assert_eq!(c.take(conn(0, 2)), [want]);
    c.feed(Op::Unicast { conn: conn(0, 0), group: g("g"), to: m("zed"), payload: Bytes::new() });
    assert_eq!(error_code(&c.take(conn(0, 0))), Some(ErrorCode::UnknownRecipient));
}

#[test]
fn a_client_may_join_only_so_many_groups_and_each_once() {
    let mut c = Component::with(vec![Core::new(DaemonId(0), Limits { max_groups_per_client: 2 }, inc(0))]);
    c.connect(conn(0, 1), "a");
    c.join(conn(0, 1), "g1");
    c.join(conn(0, 1), "g1");
    assert_eq!(error_code(&c.take(conn(0, 1))), Some(ErrorCode::AlreadyMember));
    c.join(conn(0, 1), "g2");
    c.join(conn(0, 1), "g3");
    assert_eq!(error_code(&c.take(conn(0, 1))), Some(ErrorCode::TooManyGroups));
    c.feed(Op::Leave { conn: conn(0, 1), group: g("g1") });
    c.join(conn(0, 1), "g3");
    assert_eq!(error_code(&c.take(conn(0, 1))), None);
}

#[test]
fn operations_from_daemons_outside_the_daemon_group_are_dropped() {
    let mut c = one();
    c.feed(Op::Connect { conn: conn(7, 1), name: m("stranger") });
    assert!(c.log.is_empty());
    assert!(c.cores[0].member(conn(7, 1)).is_none());
}

// ---------------------------------------------------------------------------
// Random streams.

/// What one client saw of one group: views and the messages between them.
#[derive(Default, Debug)]
struct Timeline {
    /// (view, messages delivered in it, in order)
    views: Vec<(View, Vec<(MemberId, Bytes)>)>,
}

#[derive(Clone, Debug)]
enum Act {
    Join(u8, u8),
    Leave(u8, u8),
    Send(u8, u8),
    Unicast(u8, u8, u8),
    Reconnect(u8),
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        3 => (0..6u8, 0..3u8).prop_map(|(c, g)| Act::Join(c, g)),
        2 => (0..6u8, 0..3u8).prop_map(|(c, g)| Act::Leave(c, g)),
        6 => (0..6u8, 0..3u8).prop_map(|(c, g)| Act::Send(c, g)),
        1 => (0..6u8, 0..3u8, 0..6u8).prop_map(|(c, g, t)| Act::Unicast(c, g, t)),
        1 => (0..6u8).prop_map(Act::Reconnect),
    ]
}

/// Turns actions into a stream; clients reconnect on a fresh connection.
fn stream(acts: &[Act]) -> Vec<Op> {
    let mut conns: Vec<u64> = (0..6).collect();
    let mut next = 6;
    let mut ops: Vec<Op> = (0..6).map(|i| Op::Connect { conn: conn(0, i), name: m(&format!("c{i}")) }).collect();
    for (n, a) in acts.iter().enumerate() {
        let group = |i: u8| g(&format!("g{i}"));
        let op = match *a {
            Act::Join(c, gi) => {
                Op::Join { conn: conn(0, conns[c as usize]), group: group(gi), open: false, mode: GroupMode::Members }
            }
            Act::Leave(c, gi) => Op::Leave { conn: conn(0, conns[c as usize]), group: group(gi) },
            Act::Send(c, gi) => Op::Multicast {
                conn: conn(0, conns[c as usize]),
                group: group(gi),
                service: Service::Agreed,
                payload: Bytes::from(n.to_string()),
            },
            Act::Unicast(c, gi, t) => Op::Unicast {
                conn: conn(0, conns[c as usize]),
                group: group(gi),
                to: m(&format!("c{t}")),
                payload: Bytes::from(format!("u{n}")),
            },
            Act::Reconnect(c) => {
                let old = conns[c as usize];
                conns[c as usize] = next;
                ops.push(Op::Disconnect { conn: conn(0, old) });
                next += 1;
                Op::Connect { conn: conn(0, next - 1), name: m(&format!("c{c}")) }
            }
        };
        ops.push(op);
    }
    ops
}

fn timelines(log: &[(ConnId, Delivery)]) -> BTreeMap<(ConnId, GroupName), Timeline> {
    let mut t: BTreeMap<(ConnId, GroupName), Timeline> = BTreeMap::new();
    for (c, d) in log {
        match d {
            Delivery::View { group, view } => {
                t.entry((*c, group.clone())).or_default().views.push((view.clone(), Vec::new()));
            }
            Delivery::Message { group, sender, view, payload, .. } => {
                let tl = t.get_mut(&(*c, group.clone())).expect("a message only after a view");
                let (cur, msgs) = tl.views.last_mut().expect("a message only after a view");
                assert_eq!(cur.id, *view, "a message is delivered in the view it was sent in");
                msgs.push((sender.clone(), payload.clone()));
            }
            Delivery::Unicast { group, view, .. } => {
                let tl = t.get(&(*c, group.clone())).expect("a unicast only to a member");
                assert_eq!(tl.views.last().unwrap().0.id, *view);
            }
            _ => {}
        }
    }
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Every client gets the same views as its fellow members; members that
    /// go from one view to the next together delivered the same messages in
    /// the first; a core fed the same stream again does the same.
    #[test]
    fn random_streams_keep_virtual_synchrony(acts in prop::collection::vec(act(), 1..120)) {
        let ops = stream(&acts);
        let mut a = one();
        for op in ops.clone() {
            a.feed(op);
        }
        let mut b = one();
        for op in ops {
            b.feed(op);
        }
        prop_assert_eq!(&a.log, &b.log, "same stream, same deliveries");

        // Each member's record of each view it was in, with the id of its next view.
        struct Stay<'a> {
            view: &'a View,
            msgs: &'a [(MemberId, Bytes)],
            next: Option<ViewId>,
        }
        let t = timelines(&a.log);
        let mut seen: BTreeMap<ViewId, Vec<Stay>> = BTreeMap::new();
        for tl in t.values() {
            for (i, (view, msgs)) in tl.views.iter().enumerate() {
                let next = tl.views.get(i + 1).map(|(n, _)| n.id);
                seen.entry(view.id).or_default().push(Stay { view, msgs, next });
            }
            // Views of one group arrive in increasing id order.
            prop_assert!(tl.views.windows(2).all(|w| w[0].0.id < w[1].0.id));
        }
        for (id, stays) in &seen {
            let v = stays[0].view;
            prop_assert_eq!(stays.len(), v.members.len(), "every member of {} got it", id);
            for a in stays {
                prop_assert_eq!(a.view, v);
                // Same next view => same messages in this one.
                for b in stays {
                    if a.next.is_some() && a.next == b.next {
                        prop_assert_eq!(a.msgs, b.msgs);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The daemon group (cluster backbones).

fn daemons(epoch: u64, ds: &[u16]) -> Op {
    Op::Daemons { epoch, members: ds.iter().map(|&d| DaemonId(d)).collect() }
}

/// Two daemons, each alone in its own component with its own clients in a
/// group "g", merge: both compute the same views, announce the change first,
/// and hold operations ordered during the exchange.
#[test]
fn a_merge_gives_every_daemon_the_same_views() {
    let mut left = Component::new(&[1]);
    let mut right = Component::new(&[2]);
    left.connect(conn(1, 1), "a");
    left.join(conn(1, 1), "g");
    right.connect(conn(2, 1), "b");
    right.join(conn(2, 1), "g");
    right.connect(conn(2, 2), "c");
    right.join(conn(2, 2), "g");
    let v_left = views(&left.take(conn(1, 1))).pop().unwrap();
    let v_right = views(&right.take(conn(2, 1))).pop().unwrap();
    right.take(conn(2, 2));

    let mut merged = Component::with(left.cores.into_iter().chain(right.cores).collect());
    // The exchange: states are submitted by both cores and ordered after this.
    merged.feed(daemons(10, &[1, 2]));
    // The cores are through the exchange already; test holding explicitly below.
    let a = merged.take(conn(1, 1));
    let b = merged.take(conn(2, 1));
    let c = merged.take(conn(2, 2));
    for ds in [&a, &b, &c] {
        assert_eq!(ds[0], Delivery::ViewChangeBegins { group: g("g") });
        assert_eq!(ds.len(), 2);
    }
    let v = views(&a).pop().unwrap();
    assert_eq!(views(&b), std::slice::from_ref(&v));
    assert_eq!(views(&c), std::slice::from_ref(&v));
    assert_eq!(v.cause, Cause::Network);
    assert_eq!(v.id.seq >> 48, 1, "tagged with the lowest daemon");
    assert!(
        ![inc(1), inc(2), v_left.id.incarnation, v_right.id.incarnation].contains(&v.id.incarnation),
        "the merged configuration's ids are its own"
    );
    assert_eq!(names(&v), ["a", "b", "c"], "ordered by the view each joined in, oldest first");
    let prev: Vec<_> = v.members.iter().map(|m| m.prev).collect();
    assert_eq!(prev, [Some(v_left.id), Some(v_right.id), Some(v_right.id)]);
    assert_ne!(v_left.id, v_right.id, "views of concurrent components differ");
    let cores = &merged.cores;
    assert_eq!(cores[0].view(&g("g")), cores[1].view(&g("g")));
}

#[test]
fn operations_during_an_exchange_are_held_then_applied_in_order() {
    let mut core = Core::new(DaemonId(1), Limits::default(), inc(1));
    let mut out = Vec::new();
    core.handle(Op::Connect { conn: conn(1, 1), name: m("a") }, &mut out);
    core.handle(Op::Join { conn: conn(1, 1), group: g("g"), open: false, mode: GroupMode::Members }, &mut out);
    out.clear();
    core.handle(daemons(5, &[1, 2]), &mut out);
    let Some(Output::Submit(Op::State { epoch: 5, state: mine })) = out.pop() else { panic!("must send its state") };
    assert_eq!(mine.clients.len(), 1);
    out.clear();
    // A message and a join are ordered before the other daemon's state.
    core.handle(
        Op::Multicast { conn: conn(1, 1), group: g("g"), service: Service::Agreed, payload: Bytes::new() },
        &mut out,
    );
    core.handle(Op::Connect { conn: conn(2, 9), name: m("z") }, &mut out);
    assert!(out.is_empty() && core.exchanging());
    // A state for an older epoch is ignored; then ours and the other's complete it.
    let other = conclave_gcs::core::DaemonState {
        daemon: DaemonId(2),
        next_view: 40,
        incarnation: inc(2),
        view_incarnation: inc(2),
        applied: Default::default(),
        cut: vec![DaemonId(1), DaemonId(2)],
        clients: Vec::new(),
    };
    core.handle(Op::State { epoch: 4, state: other.clone() }, &mut out);
    core.handle(Op::State { epoch: 5, state: mine }, &mut out);
    assert!(core.exchanging());
    core.handle(Op::State { epoch: 5, state: other }, &mut out);
    assert!(!core.exchanging());
    let kinds: Vec<_> = out
        .iter()
        .map(|o| match o {
            Output::Deliver { delivery: Delivery::View { view, .. }, .. } => format!("view {}", view.id.seq & 0xffff),
            Output::Deliver { delivery: Delivery::Message { view, .. }, .. } => format!("msg {}", view.seq & 0xffff),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["view 40", "msg 40"], "the network view, then the held message in it");
    assert_eq!(core.member(conn(2, 9)), Some(&m("z")), "the held connect was applied");
}

#[test]
fn a_departed_daemon_takes_its_clients_with_it() {
    let mut c = Component::new(&[1, 2]);
    c.feed(daemons(1, &[1, 2]));
    c.connect(conn(1, 1), "a");
    c.connect(conn(2, 1), "b");
    c.join(conn(1, 1), "g");
    c.join(conn(2, 1), "g");
    c.take(conn(1, 1));
    // Daemon 2 is cut off; daemon 1's side carries on.
    let mut left = Component::with(vec![c.cores.remove(0)]);
    left.feed(daemons(2, &[1]));
    let got = left.take(conn(1, 1));
    assert_eq!(got[0], Delivery::ViewChangeBegins { group: g("g") });
    let v = views(&got).pop().unwrap();
    assert_eq!((names(&v), v.cause), (vec!["a"], Cause::Network));
    assert!(left.cores[0].member(conn(2, 1)).is_none());
    // The name is free again on this side.
    left.connect(conn(1, 2), "b");
}

#[test]
fn a_name_claimed_on_both_sides_of_a_merge_stays_with_the_lower_daemon() {
    let mut left = Component::new(&[1]);
    let mut right = Component::new(&[2]);
    left.connect(conn(1, 1), "same");
    right.connect(conn(2, 1), "same");
    let mut merged = Component::with(left.cores.into_iter().chain(right.cores).collect());
    merged.feed(daemons(3, &[1, 2]));
    assert!(merged.take(conn(1, 1)).is_empty());
    assert_eq!(error_code(&merged.take(conn(2, 1))), Some(ErrorCode::NameTaken));
    for core in &merged.cores {
        assert_eq!(core.member(conn(1, 1)), Some(&m("same")));
        assert_eq!(core.member(conn(2, 1)), None);
    }
}

/// The states a core submits for a change, taken out of its outputs.
fn submitted_states(out: &[Output]) -> Vec<conclave_gcs::core::DaemonState> {
    out.iter()
        .filter_map(|o| match o {
            Output::Submit(Op::State { state, .. }) => Some(state.clone()),
            _ => None,
        })
        .collect()
}

/// Daemons 1 and 2 in one configuration, with client `a` of daemon 1 and
/// `b` of daemon 2 in group `g`.
fn a_and_b_in_g() -> Component {
    let mut pair = Component::new(&[1, 2]);
    pair.feed(daemons(1, &[1, 2]));
    pair.connect(conn(1, 1), "a");
    pair.join(conn(1, 1), "g");
    pair.connect(conn(2, 1), "b");
    pair.join(conn(2, 1), "g");
    pair
}

/// Daemons 1 and 2 are in one configuration with `a` (of 1) and `b` (of 2)
/// in `g`, and `c` of daemon 1 connected; it stops, and each goes on alone.
/// Returns the two sides and `b`'s two multicasts.
fn split_after_b_sends() -> (Component, Component, [Op; 2]) {
    let mut pair = a_and_b_in_g();
    pair.connect(conn(1, 2), "c");
    pair.take(conn(1, 1));
    pair.take(conn(2, 1));
    let send = |text: &str| Op::Multicast {
        conn: conn(2, 1),
        group: g("g"),
        service: Service::Agreed,
        payload: Bytes::copy_from_slice(text.as_bytes()),
    };
    let mut cores = pair.cores.into_iter();
    let left = Component::with(vec![cores.next().unwrap()]);
    let right = Component::with(vec![cores.next().unwrap()]);
    (left, right, [send("b1"), send("b2")])
}

fn texts(ds: &[Delivery]) -> Vec<String> {
    ds.iter()
        .filter_map(|d| match d {
            Delivery::Message { payload, .. } => Some(String::from_utf8_lossy(payload).into_owned()),
            _ => None,
        })
        .collect()
}

/// The configuration of daemons 1 and 2 stops with `b`'s two multicasts and
/// `c`'s join ordered. Daemon 2 got everything; daemon 1, alone in its
/// transitional set, lost the first multicast with daemon 2 (extended
/// virtual synchrony lets its rest have that hole). Both install the join's
/// view of `a`, `b`, `c` — and `a` delivered one of `b`'s messages in the
/// old view, `b` two. Were the two views one id, `a` and `b` would have
/// moved through the same view change with different messages (virtual
/// synchrony; `conclave sim --protocols gdh --seed 58100` found it). Each
/// set's views have ids of their own.
#[test]
fn transitional_sets_give_the_views_they_install_ids_of_their_own() {
    let (mut left, mut right, [b1, b2]) = split_after_b_sends();
    let join_c = Op::Join { conn: conn(1, 2), group: g("g"), open: false, mode: GroupMode::Members };
    right.feed(b1);
    right.feed(b2.clone());
    right.feed(Op::Transitional { members: vec![DaemonId(2)] });
    right.feed(join_c.clone());
    left.feed(Op::Transitional { members: vec![DaemonId(1)] });
    left.feed(b2);
    left.feed(join_c);
    let a = left.take(conn(1, 1));
    let b = right.take(conn(2, 1));
    assert_eq!((texts(&a), texts(&b)), (vec!["b2".to_string()], vec!["b1".to_string(), "b2".to_string()]));
    let (va, vb) = (views(&a).pop().unwrap(), views(&b).pop().unwrap());
    assert_eq!((names(&va), names(&vb)), (vec!["a", "b", "c"], vec!["a", "b", "c"]));
    assert_ne!(va.id, vb.id, "the two sets' views of the join are different views");
}

/// Daemon 2 applied a join in the regular configuration that daemon 1 never
/// got before the configuration stopped. Daemon 1 then rebuilds alone, from a
/// counter the join never moved: its network view must not take the id
/// daemon 2 gave the join's view.
#[test]
fn a_side_that_stopped_short_rebuilds_with_ids_the_other_side_never_used() {
    let (mut left, mut right, _) = split_after_b_sends();
    right.connect(conn(2, 2), "d");
    right.join(conn(2, 2), "g");
    let vb = views(&right.take(conn(2, 1))).pop().unwrap();
    left.feed(Op::Transitional { members: vec![DaemonId(1)] });
    left.feed(daemons(2, &[1]));
    let va = views(&left.take(conn(1, 1))).pop().unwrap();
    assert_eq!((names(&va), names(&vb)), (vec!["a"], vec!["a", "b", "d"]));
    assert_ne!(va.id, vb.id);
}

/// Daemons 1 and 2 exchange states (a change of their configuration) while
/// `c` of daemon 1 and then `d` of daemon 2 ask to join; both joins are held
/// until the states are in. The configuration stops before daemon 2 got
/// `c`'s join: daemon 1 completed the exchange in the regular
/// configuration and installed `c`'s view, then `d`'s; daemon 2, alone in its
/// transitional set, completes it in its own rest, with the hole. Its view of
/// `d`'s join follows other views than daemon 1's of the same counter, so it
/// must not take that id (`conclave sim --protocols gdh --seed 9183 --members
/// 5 --steps 40 --daemons 3` found two members' views, [m2] and [m4], under
/// one id). The exchange's network views, made by both from the same states,
/// are one view.
#[test]
fn an_exchange_completed_in_a_transitional_set_gives_the_held_operations_the_sets_ids() {
    let mut pair = a_and_b_in_g();
    pair.connect(conn(1, 2), "c");
    pair.connect(conn(2, 2), "d");
    pair.log.clear();
    let mut cores = pair.cores.into_iter();
    let (mut left, mut right) = (cores.next().unwrap(), cores.next().unwrap());
    let mut states = Vec::new();
    for core in [&mut left, &mut right] {
        let mut out = Vec::new();
        core.handle(daemons(2, &[1, 2]), &mut out);
        states.extend(submitted_states(&out));
    }
    let [s1, s2]: [_; 2] = states.try_into().expect("one state each");
    let join = |c| Op::Join { conn: c, group: g("g"), open: false, mode: GroupMode::Members };
    let state = |s| Op::State { epoch: 2, state: s };
    // The stream: 1's state, c's join, d's join, 2's state.
    let feed = |core: &mut Core, ops: Vec<Op>| {
        let mut got = Vec::new();
        for op in ops {
            let mut out = Vec::new();
            core.handle(op, &mut out);
            got.extend(out.into_iter().filter_map(|o| match o {
                Output::Deliver { delivery: Delivery::View { view, .. }, .. } => Some(view),
                _ => None,
            }));
        }
        got
    };
    let mut on_left = feed(&mut left, vec![state(s1.clone()), join(conn(1, 2)), join(conn(2, 2)), state(s2.clone())]);
    on_left.extend(feed(&mut left, vec![Op::Transitional { members: vec![DaemonId(1)] }]));
    let on_right =
        feed(&mut right, vec![state(s1), Op::Transitional { members: vec![DaemonId(2)] }, join(conn(2, 2)), state(s2)]);
    let listed = |vs: &[View]| vs.iter().map(|v| names(v).join(",")).collect::<Vec<_>>();
    assert_eq!(listed(&on_left), ["a,b", "a,b,c", "a,b,c,d"], "daemon 1 delivers to a and c");
    assert_eq!(listed(&on_right), ["a,b", "a,b,d"], "daemon 2 delivers to b and d, without c's join");
    assert_eq!(on_left[0], on_right[0], "the network view is one view, from the same states");
    for v in &on_left[1..] {
        assert_ne!(v.id, on_right[1].id, "daemon 2's view of d's join is not one of daemon 1's");
    }
}

/// Daemons 1 and 2 are exchanging (their states still in flight) and hold a
/// multicast and a join when daemon 3 merges in. Daemon 3 never saw the held
/// operations, so they are submitted again and applied everywhere after the
/// merged exchange; the in-flight states answer the merge, and no core sends a
/// second state while its first is in flight.
#[test]
fn a_merge_during_an_exchange_reorders_the_held_operations_for_everyone() {
    let pair = a_and_b_in_g();
    let mut solo = Component::new(&[3]);
    solo.connect(conn(3, 1), "z");
    solo.join(conn(3, 1), "g");
    let mut cores: Vec<Core> = pair.cores.into_iter().chain(solo.cores).collect();

    // A change of the pair (same daemons) whose states do not come back before the merge.
    let mut in_flight = Vec::new();
    for core in &mut cores[..2] {
        let mut out = Vec::new();
        core.handle(daemons(2, &[1, 2]), &mut out);
        in_flight.extend(submitted_states(&out));
    }
    assert_eq!(in_flight.len(), 2);
    let held = [
        Op::Multicast { conn: conn(1, 1), group: g("g"), service: Service::Agreed, payload: Bytes::from("held") },
        Op::Connect { conn: conn(2, 2), name: m("c") },
        Op::Join { conn: conn(2, 2), group: g("g"), open: false, mode: GroupMode::Members },
    ];
    for core in &mut cores[..2] {
        for op in &held {
            let mut out = Vec::new();
            core.handle(op.clone(), &mut out);
            assert!(out.is_empty(), "held during the exchange");
        }
    }

    // The merge. Stream order after it: what the cores submit, then the states in flight.
    let mut merged = Component::with(cores);
    merged.log.clear();
    let mut submitted = Vec::new();
    for core in &mut merged.cores {
        let mut out = Vec::new();
        core.handle(daemons(3, &[1, 2, 3]), &mut out);
        for o in out {
            if let Output::Submit(op) = o {
                submitted.push(op);
            }
        }
    }
    let states = submitted.iter().filter(|op| matches!(op, Op::State { .. })).count();
    assert_eq!(states, 1, "only daemon 3 sends a state: the others have theirs in flight");
    assert_eq!(submitted.len(), 4, "the three held operations come again");
    for op in submitted {
        merged.feed(op);
    }
    for state in in_flight {
        merged.feed(Op::State { epoch: 3, state });
    }
    assert!(merged.cores.iter().all(|c| !c.exchanging()));
    let v = merged.cores[0].view(&g("g")).cloned().unwrap();
    for core in &merged.cores {
        assert_eq!(core.view(&g("g")), Some(&v), "every daemon computes the same view");
    }
    let mut members = names(&v);
    assert_eq!(members.pop(), Some("c"), "the held join comes after the merge");
    members.sort();
    assert_eq!(members, ["a", "b", "z"]);
    let held_msgs = |c| {
        merged
            .log
            .iter()
            .filter(|(to, d)| *to == c && matches!(d, Delivery::Message { payload, .. } if payload == "held"))
            .count()
    };
    assert_eq!(held_msgs(conn(3, 1)), 1, "the merged-in member gets the held message once");
    assert_eq!(held_msgs(conn(2, 1)), 1);
}

#[test]
fn a_core_sends_its_state_again_once_the_last_one_came_back() {
    let mut core = Core::new(DaemonId(1), Limits::default(), inc(1));
    let mut out = Vec::new();
    core.handle(daemons(1, &[1, 2]), &mut out);
    let mine = submitted_states(&out).pop().expect("a state");
    out.clear();
    core.handle(daemons(2, &[1, 2]), &mut out);
    assert!(submitted_states(&out).is_empty(), "the first state is still in flight");
    core.handle(Op::State { epoch: 2, state: mine }, &mut out);
    out.clear();
    core.handle(daemons(3, &[1, 2, 3]), &mut out);
    assert_eq!(submitted_states(&out).len(), 1);
}

/// An operation submitted again (after an interrupted exchange) keeps its
/// identity; a core that applied it skips the copy. A restarted origin
/// numbers from 0 again under its new incarnation.
#[test]
fn a_numbered_operation_is_applied_once_however_often_it_is_ordered() {
    use conclave_gcs::core::OpId;
    let mut one = Component::new(&[1]);
    one.connect(conn(1, 1), "a");
    one.join(conn(1, 1), "g");
    let send = |seq, text: &'static str| {
        let op =
            Op::Multicast { conn: conn(1, 1), group: g("g"), service: Service::Agreed, payload: Bytes::from(text) };
        op.numbered(OpId { incarnation: inc(1), seq })
    };
    one.take(conn(1, 1));
    for op in [send(0, "x"), send(1, "y"), send(0, "x"), send(1, "y"), send(2, "z")] {
        one.feed(op);
    }
    let got: Vec<_> = one
        .take(conn(1, 1))
        .into_iter()
        .filter_map(|d| match d {
            Delivery::Message { payload, .. } => Some(payload),
            _ => None,
        })
        .collect();
    assert_eq!(got, ["x", "y", "z"]);
    let restarted =
        Op::Multicast { conn: conn(1, 1), group: g("g"), service: Service::Agreed, payload: Bytes::from("w") }
            .numbered(OpId { incarnation: inc(1) + 1, seq: 0 });
    one.feed(restarted);
    assert_eq!(one.take(conn(1, 1)).len(), 1, "a new incarnation's number 0 is another operation");
}

/// Seed 34699 of `conclave sim`, reduced. Daemon 2's client operations are
/// ordered during an exchange that daemon 1 completes (applying them) and
/// daemon 2, their origin, does not: its transitional set missed daemon 1's
/// state. Daemon 2's state leaves them out, so after the next merge the
/// rebuilt groups do not have their effects, and daemon 2 submits them
/// again. Every core must apply the connect and the join again (or daemon 1
/// would end with a view without `z`, and the daemons disagree), while the
/// multicast, whose effect is a delivery, reaches `a` only once.
#[test]
fn operations_applied_in_an_exchange_their_origin_missed_are_applied_again() {
    use conclave_gcs::core::OpId;
    let mut pair = a_and_b_in_g();
    pair.log.clear();
    let mut cores = pair.cores;
    let id = |seq| OpId { incarnation: inc(2), seq };
    let held = [
        Op::Multicast { conn: conn(2, 1), group: g("g"), service: Service::Agreed, payload: Bytes::from("m") }
            .numbered(id(0)),
        Op::Connect { conn: conn(2, 2), name: m("z") }.numbered(id(1)),
        Op::Join { conn: conn(2, 2), group: g("g"), open: false, mode: GroupMode::Members }.numbered(id(2)),
    ];

    // Configuration 2: both send their states; the held operations are
    // ordered before them. Daemon 1 gets both states, daemon 2 only its own.
    let mut states = Vec::new();
    for core in &mut cores {
        let mut out = Vec::new();
        core.handle(daemons(2, &[1, 2]), &mut out);
        states.extend(submitted_states(&out));
    }
    let mut log = Vec::new();
    for op in &held {
        for core in &mut cores {
            core.handle(op.clone(), &mut log);
        }
    }
    for state in &states {
        cores[0].handle(Op::State { epoch: 2, state: state.clone() }, &mut log);
    }
    cores[1].handle(Op::State { epoch: 2, state: states[1].clone() }, &mut log);
    assert!(!cores[0].exchanging() && cores[1].exchanging());
    assert_eq!(names(cores[0].view(&g("g")).unwrap()), ["a", "b", "z"], "daemon 1 applied them");
    let delivered_m = |log: &[Output]| {
        log.iter()
            .filter(|o| {
                matches!(o, Output::Deliver { to, delivery: Delivery::Message { payload, .. } }
                if to.contains(&conn(1, 1)) && payload == "m")
            })
            .count()
    };
    assert_eq!(delivered_m(&log), 1);

    // Each alone (their states for it stay in flight), then together again.
    let mut in_flight = Vec::new();
    for (core, epoch) in cores.iter_mut().zip([3, 4]) {
        let mut out = Vec::new();
        core.handle(daemons(epoch, &[core.me().0]), &mut out);
        in_flight.extend(submitted_states(&out));
    }
    let mut merged = Component::with(cores);
    let mut submitted = Vec::new();
    for core in &mut merged.cores {
        let mut out = Vec::new();
        core.handle(daemons(5, &[1, 2]), &mut out);
        submitted.extend(out.into_iter().filter_map(|o| match o {
            Output::Submit(op) => Some(op),
            Output::Deliver { .. } => None,
        }));
    }
    assert_eq!(submitted.len(), 3, "daemon 2 submits its held operations again");
    for op in submitted {
        merged.feed(op);
    }
    for state in in_flight {
        merged.feed(Op::State { epoch: 5, state });
    }
    assert!(merged.cores.iter().all(|c| !c.exchanging()));
    let v = merged.cores[1].view(&g("g")).cloned().unwrap();
    assert_eq!(names(&v), ["a", "b", "z"]);
    assert_eq!(merged.cores[0].view(&g("g")), Some(&v), "the daemons agree");
    assert_eq!(merged.cores[0].member(conn(2, 2)), Some(&m("z")));
    let again: Vec<Output> =
        merged.take(conn(1, 1)).into_iter().map(|d| Output::Deliver { to: vec![conn(1, 1)], delivery: d }).collect();
    assert_eq!(delivered_m(&again), 0, "a got m once, before");
    let at_b = merged.take(conn(2, 1));
    let m_at_b = at_b.iter().filter(|d| matches!(d, Delivery::Message { payload, .. } if payload == "m")).count();
    assert_eq!(m_at_b, 1, "b, at the origin, gets m once, now");
}

/// Two configurations in a row with the same daemons, and nothing installed
/// between them, exchange states that differ in nothing but the one each
/// daemon's ids came from; they must still get different ids, or whatever
/// runs per configuration (the daemons' key agreement) mixes the two.
#[test]
fn consecutive_configurations_with_the_same_daemons_have_different_ids() {
    let mut pair = Component::new(&[1, 2]);
    pair.feed(daemons(1, &[1, 2]));
    let first = pair.cores[0].configuration().expect("installed").0;
    assert_eq!(pair.cores[1].configuration().expect("installed").0, first);
    pair.feed(daemons(2, &[1, 2]));
    let second = pair.cores[0].configuration().expect("installed").0;
    assert_eq!(pair.cores[1].configuration().expect("installed").0, second);
    assert_ne!(first, second);
}
