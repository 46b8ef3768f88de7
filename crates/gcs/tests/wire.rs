//! The wire format: every request and delivery round-trips, arbitrary bytes
//! never panic a decoder (and what decodes re-encodes to the same bytes),
//! frames survive any split of the byte stream, and limits are enforced.

use bytes::{BufMut, Bytes, BytesMut};
use conclave_gcs::core::{Delivery, ErrorCode, GroupMode, Service};
use conclave_gcs::wire::{
    decode_delivery, decode_delivery_tracked, decode_delivery_with, decode_request, decode_status_reply,
    encode_delivery, encode_request, encode_status_reply, encode_view_changes, ConnectionStatus, FrameReader,
    GroupStatus, Request, Status, StatusReply, ViewMemory, WireError,
};
use conclave_gcs::{Cause, GroupName, MemberId, View, ViewId, ViewMember};
use proptest::prelude::*;

fn member() -> impl Strategy<Value = MemberId> {
    "[a-z0-9#._-]{1,40}".prop_map(|s| MemberId::new(s).unwrap())
}

fn group() -> impl Strategy<Value = GroupName> {
    "[a-zA-Z0-9@é]{1,30}".prop_map(|s| GroupName::new(s).unwrap())
}

fn payload() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..300).prop_map(Bytes::from)
}

fn service() -> impl Strategy<Value = Service> {
    prop_oneof![Just(Service::Fifo), Just(Service::Agreed)]
}

fn view_id() -> impl Strategy<Value = ViewId> {
    any::<(u64, u64)>().prop_map(|(i, s)| ViewId::new(i, s))
}

fn view() -> impl Strategy<Value = View> {
    let cause = prop_oneof![Just(Cause::Join), Just(Cause::Leave), Just(Cause::Disconnect), Just(Cause::Network)];
    let m = (member(), prop::option::of(view_id())).prop_map(|(id, prev)| ViewMember { id, prev });
    (view_id(), cause, prop::collection::vec(m, 0..8)).prop_map(|(id, cause, members)| View {
        id,
        members: members.into(),
        cause,
    })
}

fn mode() -> impl Strategy<Value = GroupMode> {
    prop_oneof![
        Just(GroupMode::Members),
        Just(GroupMode::Keyed),
        Just(GroupMode::ThreeStep),
        Just(GroupMode::OptimizedEvs)
    ]
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (member(), any::<bool>()).prop_map(|(name, view_changes)| Request::Hello { name, view_changes }),
        (group(), any::<bool>(), mode()).prop_map(|(group, open, mode)| Request::Join { group, open, mode }),
        group().prop_map(|group| Request::Leave { group }),
        (group(), service(), payload()).prop_map(|(group, service, payload)| Request::Multicast {
            group,
            service,
            payload
        }),
        (group(), member(), payload()).prop_map(|(group, to, payload)| Request::Unicast { group, to, payload }),
        Just(Request::Bye),
        Just(Request::Status),
    ]
}

fn named_numbers() -> impl Strategy<Value = Vec<(String, u64)>> {
    prop::collection::vec((".{0,20}", any::<u64>()), 0..6)
}

fn status() -> impl Strategy<Value = Status> {
    let group = (group(), any::<bool>(), mode(), view_id(), prop::collection::vec(member(), 0..5))
        .prop_map(|(name, open, mode, view, members)| GroupStatus { name, open, mode, view, members });
    let conn = (any::<u64>(), prop::option::of(member()), ".{0,40}", any::<(u64, u32, u64, u32)>()).prop_map(
        |(id, name, peer, (age_ms, queued_frames, queued_bytes, groups))| ConnectionStatus {
            id,
            name,
            peer,
            age_ms,
            queued_frames,
            queued_bytes,
            groups,
        },
    );
    (
        any::<(bool, u64, u16)>(),
        ".{0,30}",
        prop::option::of((view_id(), prop::collection::vec(any::<u16>(), 0..5))),
        (named_numbers(), named_numbers()),
        prop::collection::vec(group, 0..4),
        prop::collection::vec(conn, 0..4),
        prop::collection::vec(".{0,60}", 0..4),
    )
        .prop_map(
            |(
                (truncated, uptime_ms, daemon),
                backbone,
                configuration,
                (limits, counters),
                groups,
                connections,
                policy,
            )| {
                Status {
                    truncated,
                    uptime_ms,
                    daemon,
                    backbone,
                    configuration,
                    limits,
                    counters,
                    groups,
                    connections,
                    policy,
                }
            },
        )
}

fn status_reply() -> impl Strategy<Value = StatusReply> {
    prop_oneof![
        status().prop_map(StatusReply::Report),
        (code(), ".{0,80}").prop_map(|(code, text)| StatusReply::Error { code, text }),
    ]
}

fn code() -> impl Strategy<Value = ErrorCode> {
    // Known codes by number; unknown ones stay `Other`.
    any::<u16>().prop_map(ErrorCode::from_u16)
}

fn delivery() -> impl Strategy<Value = Delivery> {
    prop_oneof![
        member().prop_map(|member| Delivery::Welcome { member }),
        (group(), view()).prop_map(|(group, view)| Delivery::View { group, view }),
        group().prop_map(|group| Delivery::ViewChangeBegins { group }),
        group().prop_map(|group| Delivery::Left { group }),
        (group(), member(), service(), view_id(), payload()).prop_map(|(group, sender, service, v, payload)| {
            Delivery::Message { group, sender, service, view: v, payload }
        }),
        (group(), member(), view_id(), payload()).prop_map(|(group, sender, v, payload)| Delivery::Unicast {
            group,
            sender,
            view: v,
            payload
        }),
        (code(), ".{0,80}").prop_map(|(code, text)| Delivery::Error { code, text }),
        (group(), view_id(), any::<[u8; 32]>()).prop_map(|(group, view, key)| Delivery::GroupKey {
            group,
            view,
            key: conclave_gcs::core::ViewKey::new(key)
        }),
    ]
}

/// The one frame in `buf`, without its length prefix.
fn only_frame(buf: BytesMut) -> Bytes {
    let mut buf = buf;
    let mut r = FrameReader::new(1 << 20);
    let f = r.next_frame(&mut buf).unwrap().expect("a whole frame");
    assert!(buf.is_empty());
    f
}

proptest! {
    #[test]
    fn requests_round_trip(req in request()) {
        let mut buf = BytesMut::new();
        encode_request(&req, &mut buf);
        prop_assert_eq!(decode_request(only_frame(buf)).unwrap(), req);
    }

    #[test]
    fn deliveries_round_trip(d in delivery()) {
        let mut buf = BytesMut::new();
        encode_delivery(&d, &mut buf);
        let frame = only_frame(buf);
        // Through a cache of names, twice: the same delivery each time.
        let mut names = conclave_gcs::NameCache::default();
        for _ in 0..2 {
            prop_assert_eq!(&decode_delivery_with(frame.clone(), Some(&mut names)).unwrap(), &d);
        }
        prop_assert_eq!(decode_delivery(frame).unwrap(), d);
    }

    /// A view given as changes to the last one decodes to the view itself,
    /// whatever stayed (in order or not, from the base view or not), left
    /// or came; the memory then holds it.
    #[test]
    fn views_as_changes_decode_to_the_view(
        g in group(),
        base in view(),
        fates in prop::collection::vec(0u8..4, 8),
        added in prop::collection::vec((member(), prop::option::of(view_id()), any::<prop::sample::Index>()), 0..4),
        id in view_id(),
        swap in any::<Option<(prop::sample::Index, prop::sample::Index)>>(),
    ) {
        let mut base = base;
        let mut seen = std::collections::BTreeSet::new();
        base.members = base.members.iter().filter(|m| seen.insert(m.id.clone())).cloned().collect();
        let mut members = Vec::new();
        for (m, fate) in base.members.iter().zip(fates) {
            match fate {
                0 => {}
                1 => members.push(ViewMember { id: m.id.clone(), prev: m.prev }),
                _ => members.push(ViewMember { id: m.id.clone(), prev: Some(base.id) }),
            }
        }
        for (m, prev, at) in added {
            if seen.insert(m.clone()) {
                let at = at.index(members.len() + 1);
                members.insert(at, ViewMember { id: m, prev });
            }
        }
        if let (Some((a, b)), false) = (swap, members.is_empty()) {
            let (a, b) = (a.index(members.len()), b.index(members.len()));
            members.swap(a, b);
        }
        let next = View { id, members: members.into(), cause: Cause::Join };
        let mut memory = ViewMemory::default();
        let mut whole = BytesMut::new();
        encode_delivery(&Delivery::View { group: g.clone(), view: base.clone() }, &mut whole);
        decode_delivery_tracked(only_frame(whole), None, &mut memory).unwrap();
        let mut changes = BytesMut::new();
        encode_view_changes(&g, &next, &base, &mut changes);
        let frame = only_frame(changes);
        let mut names = conclave_gcs::NameCache::default();
        let d = decode_delivery_tracked(frame.clone(), Some(&mut names), &mut memory).unwrap();
        prop_assert_eq!(d, Delivery::View { group: g.clone(), view: next.clone() });
        prop_assert_eq!(memory.view(&g), Some(&next));
        // The same changes again: their base is no longer the last view.
        prop_assert_eq!(
            decode_delivery_tracked(frame, None, &mut memory),
            Err(WireError::NoBaseView { group: g, base: base.id })
        );
    }

    /// Changes with a byte changed or cut short: a view or an error, never a
    /// panic; and after Left, or for another group, no base.
    #[test]
    fn mutated_view_changes_decode_to_a_view_or_an_error(
        g in group(),
        base in view(),
        next in view(),
        at in any::<usize>(),
        x in any::<u8>(),
        cut in any::<usize>(),
    ) {
        let mut changes = BytesMut::new();
        encode_view_changes(&g, &next, &base, &mut changes);
        let f = only_frame(changes);
        let mut v = f.to_vec();
        let i = at % v.len();
        v[i] ^= x | 1;
        let remember = || {
            let mut memory = ViewMemory::default();
            let mut whole = BytesMut::new();
            encode_delivery(&Delivery::View { group: g.clone(), view: base.clone() }, &mut whole);
            decode_delivery_tracked(only_frame(whole), None, &mut memory).unwrap();
            memory
        };
        for bytes in [v, f[..cut % f.len()].to_vec()] {
            if let Ok(Delivery::View { view, .. }) = decode_delivery_tracked(Bytes::from(bytes), None, &mut remember()) {
                prop_assert!(view.members.len() <= base.members.len() + f.len());
            }
        }
        let mut memory = remember();
        let mut left = BytesMut::new();
        encode_delivery(&Delivery::Left { group: g.clone() }, &mut left);
        decode_delivery_tracked(only_frame(left), None, &mut memory).unwrap();
        prop_assert_eq!(memory.view(&g), None);
        let after_left = decode_delivery_tracked(f, None, &mut memory);
        prop_assert!(matches!(after_left, Err(WireError::NoBaseView { .. })), "{:?}", after_left);
    }

    #[test]
    fn status_replies_round_trip(r in status_reply()) {
        let mut buf = BytesMut::new();
        encode_status_reply(&r, &mut buf);
        prop_assert_eq!(decode_status_reply(only_frame(buf)).unwrap(), r);
    }

    /// A status report with one byte changed, or cut short anywhere: a value
    /// or an error, never a panic; what decodes re-encodes to itself.
    #[test]
    fn mutated_status_reports_decode_to_a_value_or_an_error(s in status(), at in any::<usize>(), x in any::<u8>(), cut in any::<usize>()) {
        let mut buf = BytesMut::new();
        encode_status_reply(&StatusReply::Report(s), &mut buf);
        let f = only_frame(buf);
        let mut v = f.to_vec();
        let i = at % v.len();
        v[i] ^= x | 1;
        for bytes in [v, f[..cut % f.len()].to_vec()] {
            if let Ok(r) = decode_status_reply(Bytes::from(bytes.clone())) {
                let mut out = BytesMut::new();
                encode_status_reply(&r, &mut out);
                prop_assert_eq!(&out[4..], &bytes[..], "canonical encoding");
            }
        }
    }

    #[test]
    fn arbitrary_bytes_decode_to_a_value_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let frame = Bytes::from(bytes);
        if let Ok(req) = decode_request(frame.clone()) {
            let mut buf = BytesMut::new();
            encode_request(&req, &mut buf);
            prop_assert_eq!(&buf[4..], &frame[..], "canonical encoding");
        }
        let mut names = conclave_gcs::NameCache::default();
        prop_assert_eq!(decode_delivery_with(frame.clone(), Some(&mut names)), decode_delivery(frame.clone()));
        if let Ok(d) = decode_delivery(frame.clone()) {
            let mut buf = BytesMut::new();
            encode_delivery(&d, &mut buf);
            prop_assert_eq!(&buf[4..], &frame[..], "canonical encoding");
        }
        if let Ok(r) = decode_status_reply(frame.clone()) {
            let mut buf = BytesMut::new();
            encode_status_reply(&r, &mut buf);
            prop_assert_eq!(&buf[4..], &frame[..], "canonical encoding");
        }
    }

    /// Valid frames with one byte changed: still never a panic.
    #[test]
    fn mutated_frames_decode_to_a_value_or_an_error(d in delivery(), req in request(), at in any::<usize>(), x in any::<u8>()) {
        let mut buf = BytesMut::new();
        encode_delivery(&d, &mut buf);
        encode_request(&req, &mut buf);
        let mut r = FrameReader::new(1 << 20);
        let a = r.next_frame(&mut buf).unwrap().unwrap();
        let b = r.next_frame(&mut buf).unwrap().unwrap();
        for f in [a, b] {
            let mut v = f.to_vec();
            let i = at % v.len();
            v[i] ^= x | 1;
            let _ = decode_delivery(Bytes::from(v.clone()));
            let _ = decode_request(Bytes::from(v));
        }
    }

    /// However the byte stream is cut into reads, the same frames come out.
    #[test]
    fn frames_survive_any_split(ds in prop::collection::vec(delivery(), 1..10), cuts in prop::collection::vec(1usize..50, 1..40)) {
        let mut all = BytesMut::new();
        for d in &ds {
            encode_delivery(d, &mut all);
        }
        let mut r = FrameReader::new(1 << 20);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut rest = &all[..];
        let mut i = 0;
        while !rest.is_empty() {
            let n = cuts[i % cuts.len()].min(rest.len());
            buf.put_slice(&rest[..n]);
            rest = &rest[n..];
            i += 1;
            while let Some(f) = r.next_frame(&mut buf).unwrap() {
                got.push(decode_delivery(f).unwrap());
            }
        }
        prop_assert_eq!(got, ds);
    }
}

#[test]
fn an_oversized_frame_is_refused_before_it_is_buffered_then_skipped() {
    let mut r = FrameReader::new(100);
    let mut buf = BytesMut::new();
    buf.put_u32(5000);
    buf.put_slice(&[0xAA; 10]);
    assert_eq!(r.next_frame(&mut buf), Err(WireError::TooLarge { len: 5000, max: 100 }));
    // The rest of the big frame is dropped as it arrives, then reading goes on.
    buf.put_slice(&[0xAA; 4990]);
    encode_request(&Request::Bye, &mut buf);
    let f = r.next_frame(&mut buf).unwrap().unwrap();
    assert_eq!(decode_request(f), Ok(Request::Bye));
    assert!(buf.is_empty());
}

#[test]
fn an_incomplete_frame_waits_for_more_bytes() {
    let mut full = BytesMut::new();
    encode_request(&Request::Leave { group: GroupName::new("g").unwrap() }, &mut full);
    let mut r = FrameReader::new(100);
    for n in 0..full.len() {
        let mut part = BytesMut::from(&full[..n]);
        assert_eq!(r.next_frame(&mut part), Ok(None), "{n} bytes");
    }
}

#[test]
fn malformed_frames_get_typed_errors() {
    let f = |b: &[u8]| decode_request(Bytes::copy_from_slice(b));
    assert_eq!(f(&[]), Err(WireError::Empty));
    assert_eq!(f(&[0x7f]), Err(WireError::UnknownKind(0x7f)));
    assert_eq!(f(&[0x06, 0]), Err(WireError::Trailing(1)));
    assert_eq!(f(&[0x01, 0, 9, 1, b'a']), Err(WireError::UnsupportedVersion(9)));
    assert_eq!(f(&[0x01, 0, 3, 5, b'a']), Err(WireError::Truncated("member name")));
    assert!(matches!(f(&[0x01, 0, 3, 1, b' ']), Err(WireError::Name { what: "member name", .. })));
    assert_eq!(f(&[0x01, 0, 3, 1, 0xff]), Err(WireError::Utf8("member name")));
    assert_eq!(f(&[0x01, 0, 1, 1, b'a']), Err(WireError::UnsupportedVersion(1)), "version 1 had 8-byte view ids");
    assert_eq!(f(&[0x01, 0, 2, 1, b'a']), Err(WireError::UnsupportedVersion(2)), "version 2 had no Hello flags");
    assert_eq!(f(&[0x01, 0, 3, 1, b'a']), Err(WireError::Truncated("hello flags")));
    assert_eq!(f(&[0x01, 0, 3, 1, b'a', 2]), Err(WireError::BadValue { what: "hello flags", value: 2 }));
    assert!(matches!(f(&[0x03, 0]), Err(WireError::Name { what: "group name", .. })));
    assert!(f(&[0x02, 1, b'g', 6]).is_ok(), "the fourth mode, optimized EVS");
    assert_eq!(f(&[0x02, 1, b'g', 8]), Err(WireError::BadValue { what: "group options", value: 8 }));
    assert_eq!(f(&[0x04, 1, b'g', 3]), Err(WireError::BadValue { what: "service", value: 3 }));
    let long_group = [&[0x03, 129][..], &[b'g'; 129]].concat();
    assert!(matches!(f(&long_group), Err(WireError::Name { what: "group name", .. })));
    assert_eq!(WireError::UnsupportedVersion(9).code(), ErrorCode::UnsupportedVersion);
    assert_eq!(WireError::Empty.code(), ErrorCode::Malformed);
}

#[test]
fn a_view_cannot_claim_more_members_than_its_frame_holds() {
    let mut v = vec![0x82, 1, b'g'];
    v.extend_from_slice(&ViewId::new(3, 7).to_bytes());
    v.push(1);
    v.extend_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(decode_delivery(Bytes::from(v)), Err(WireError::Truncated("member name")));
}

#[test]
fn long_error_texts_are_cut_at_a_character_boundary() {
    let text = "é".repeat(40_000);
    let mut buf = BytesMut::new();
    encode_delivery(&Delivery::Error { code: ErrorCode::Malformed, text }, &mut buf);
    let Ok(Delivery::Error { text, .. }) = decode_delivery(only_frame(buf)) else { panic!() };
    assert_eq!(text.len(), 65_534);
}

#[test]
fn a_status_report_cannot_claim_more_than_its_frame_holds() {
    // Empty report up to the group count, which claims 2^32 - 1 groups.
    let mut v = vec![0x89, 0];
    v.extend_from_slice(&[0; 8]); // uptime
    v.extend_from_slice(&[0, 0]); // daemon
    v.extend_from_slice(&[0, 0, 0, 0]); // backbone "", no configuration, no limits, no counters
    v.extend_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(decode_status_reply(Bytes::from(v)), Err(WireError::Truncated("group name")));
    // A Status request carries the version, like Hello.
    assert_eq!(decode_request(Bytes::from_static(&[0x07, 0, 3])), Ok(Request::Status));
    assert_eq!(decode_request(Bytes::from_static(&[0x07, 0, 2])), Err(WireError::UnsupportedVersion(2)));
    assert_eq!(decode_request(Bytes::from_static(&[0x07, 0, 3, 0])), Err(WireError::Trailing(1)));
    // A reply that is neither a report nor an error is refused.
    assert_eq!(decode_status_reply(Bytes::from_static(&[0x84, 1, b'g'])), Err(WireError::UnknownKind(0x84)));
}

#[test]
fn long_status_texts_are_cut_at_a_character_boundary() {
    let status = Status {
        backbone: "é".repeat(200),
        policy: vec!["ü".repeat(40_000)],
        connections: vec![ConnectionStatus {
            id: 1,
            name: None,
            peer: "ß".repeat(300),
            age_ms: 0,
            queued_frames: 0,
            queued_bytes: 0,
            groups: 0,
        }],
        ..Status::default()
    };
    let mut buf = BytesMut::new();
    encode_status_reply(&StatusReply::Report(status), &mut buf);
    let Ok(StatusReply::Report(s)) = decode_status_reply(only_frame(buf)) else { panic!() };
    assert_eq!((s.backbone.len(), s.policy[0].len(), s.connections[0].peer.len()), (254, 65_534, 254));
    assert_eq!(wire_code_name(), "AccessDenied");
}

fn wire_code_name() -> String {
    conclave_gcs::wire::code_name(conclave_gcs::wire::ACCESS_DENIED)
}

proptest! {
    /// Many deliveries read from one buffer (as a client reads them when a
    /// read takes many frames at once, with `make_room` before each read)
    /// decode exactly as each alone, whatever the read sizes.
    #[test]
    fn deliveries_read_in_chunks_decode_as_alone(
        ds in prop::collection::vec(delivery(), 1..40),
        reads in prop::collection::vec(1usize..5000, 1..20),
    ) {
        let mut stream = BytesMut::new();
        for d in &ds {
            encode_delivery(d, &mut stream);
        }
        let mut stream = stream.freeze();
        let mut buf = BytesMut::new();
        let mut r = FrameReader::new(1 << 20);
        let mut got = Vec::new();
        let mut sizes = reads.iter().cycle();
        while got.len() < ds.len() {
            while let Some(f) = r.next_frame(&mut buf).unwrap() {
                got.push(decode_delivery(f).unwrap());
            }
            if stream.is_empty() {
                break;
            }
            conclave_gcs::wire::make_room(&mut buf);
            prop_assert!(buf.capacity() - buf.len() >= conclave_gcs::wire::READ_CHUNK / 4);
            let n = (*sizes.next().unwrap()).min(stream.len()).min(buf.capacity() - buf.len());
            buf.put(stream.split_to(n));
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, ds);
    }
}
