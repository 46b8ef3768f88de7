//! The daemon–daemon encoding of the core's [`Op`]s, as a cluster backbone
//! multicasts them to the daemon group.
//!
//! One message carries one operation: a version byte ([`OP_VERSION`]), a kind
//! byte and the kind's fields, laid out as in the client wire format (big-endian
//! integers, `str8` names). The backbone delivers whole messages, so there is no
//! length prefix. A *batch* ([`batch_bytes`], [`split_batch`]) carries
//! several such messages one after the other, each with its length: a daemon
//! that has several operations waiting sends them as one backbone message,
//! since the backbone's cost is per message (Corosync CPG's token carries so
//! many messages per rotation), and every daemon applies them in the batch's
//! order, at the batch's place in the stream. The format is described byte by byte in `docs/wire.md`
//! (section *Daemon → daemon*).
//!
//! [`decode_op`] rejects every malformed message with an [`OpError`] — it never
//! panics, and never allocates more than the message can back — and the
//! encoding is canonical: bytes that decode re-encode to themselves. A daemon
//! must still check that an operation it decodes was sent by the daemon it
//! names; that is the backbone's business, since only it knows the sender.

use bytes::{BufMut, Bytes, BytesMut};

use crate::core::{AppliedOps, ClientState, ConnId, DaemonId, DaemonState, ErrorCode, Membership, Op, OpId, Service};
use crate::wire::{group_options, Fields, WireError, MAX_ERROR_TEXT};

/// The version of the daemon–daemon encoding this module speaks.
pub const OP_VERSION: u8 = 7;

const CONNECT: u8 = 0x01;
const DISCONNECT: u8 = 0x02;
const JOIN: u8 = 0x03;
const LEAVE: u8 = 0x04;
const MULTICAST: u8 = 0x05;
const UNICAST: u8 = 0x06;
const REJECT: u8 = 0x07;
const DAEMONS: u8 = 0x08;
const STATE: u8 = 0x09;
const NUMBERED: u8 = 0x0a;
const TRANSITIONAL: u8 = 0x0b;
const DAEMON_KA: u8 = 0x0c;
const BATCH: u8 = 0x0d;

/// Why a daemon message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// The message is empty.
    #[error("empty daemon message")]
    Empty,
    /// Another daemon speaks a version this one does not.
    #[error("daemon message version {0} is not supported (this daemon speaks version {OP_VERSION})")]
    UnsupportedVersion(u8),
    /// The fields are malformed.
    #[error("malformed daemon message: {0}")]
    Malformed(#[from] WireError),
}

/// Appends `op` as one daemon message to `out`. An error text longer than
/// [`MAX_ERROR_TEXT`] bytes is cut at a character boundary.
///
/// # Panics
///
/// If a list in the operation is longer than its count field can say (more
/// than 65535 daemons, or 2^32 clients or memberships): no core builds such.
/// If an [`Op::Numbered`] wraps anything but a plain client operation (see
/// [`Op::is_plain_client_op`]): [`Op::numbered`] never makes such.
pub fn encode_op(op: &Op, out: &mut BytesMut) {
    out.put_u8(OP_VERSION);
    put_op(op, out);
}

/// The kind byte and fields of `op`.
fn put_op(op: &Op, out: &mut BytesMut) {
    match op {
        Op::Connect { conn, name } => {
            out.put_u8(CONNECT);
            put_conn(out, *conn);
            put_str8(out, name.as_str());
        }
        Op::Disconnect { conn } => {
            out.put_u8(DISCONNECT);
            put_conn(out, *conn);
        }
        Op::Join { conn, group, open, mode } => {
            out.put_u8(JOIN);
            put_conn(out, *conn);
            put_str8(out, group.as_str());
            out.put_u8(group_options(*open, *mode));
        }
        Op::Leave { conn, group } => {
            out.put_u8(LEAVE);
            put_conn(out, *conn);
            put_str8(out, group.as_str());
        }
        Op::Multicast { conn, group, service, payload } => {
            out.put_u8(MULTICAST);
            put_conn(out, *conn);
            put_str8(out, group.as_str());
            out.put_u8(match service {
                Service::Fifo => 1,
                Service::Agreed => 2,
            });
            out.put_slice(payload);
        }
        Op::Unicast { conn, group, to, payload } => {
            out.put_u8(UNICAST);
            put_conn(out, *conn);
            put_str8(out, group.as_str());
            put_str8(out, to.as_str());
            out.put_slice(payload);
        }
        Op::Reject { conn, code, text } => {
            out.put_u8(REJECT);
            put_conn(out, *conn);
            out.put_u16(code.to_u16());
            let mut end = text.len().min(MAX_ERROR_TEXT);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            out.put_u16(u16::try_from(end).expect("cut to fit"));
            out.put_slice(&text.as_bytes()[..end]);
        }
        Op::Daemons { epoch, members } => {
            out.put_u8(DAEMONS);
            out.put_u64(*epoch);
            out.put_u16(u16::try_from(members.len()).expect("at most 65535 daemons"));
            for d in members {
                out.put_u16(d.0);
            }
        }
        Op::Transitional { members } => {
            out.put_u8(TRANSITIONAL);
            out.put_u16(u16::try_from(members.len()).expect("at most 65535 daemons"));
            for d in members {
                out.put_u16(d.0);
            }
        }
        Op::DaemonKa { from, payload } => {
            out.put_u8(DAEMON_KA);
            out.put_u16(from.0);
            out.put_slice(payload);
        }
        Op::State { epoch, state } => {
            out.put_u8(STATE);
            out.put_u64(*epoch);
            out.put_u16(state.daemon.0);
            out.put_u64(state.next_view);
            out.put_u64(state.incarnation);
            out.put_u64(state.view_incarnation);
            out.put_u64(state.applied.floor);
            out.put_u8(u8::try_from(state.applied.ranges.len()).expect("at most 64 ranges"));
            for &(start, end) in &state.applied.ranges {
                out.put_u64(start);
                out.put_u64(end);
            }
            out.put_u16(u16::try_from(state.cut.len()).expect("at most 65535 daemons"));
            for d in &state.cut {
                out.put_u16(d.0);
            }
            out.put_u32(u32::try_from(state.clients.len()).expect("fewer than 2^32 clients"));
            for c in &state.clients {
                put_conn(out, c.conn);
                put_str8(out, c.name.as_str());
                out.put_u32(u32::try_from(c.groups.len()).expect("fewer than 2^32 memberships"));
                for m in &c.groups {
                    put_str8(out, m.group.as_str());
                    out.put_u8(group_options(m.open, m.mode));
                    out.put_slice(&m.view.to_bytes());
                    out.put_u64(m.since);
                }
            }
        }
        Op::Numbered { id, op } => {
            assert!(op.is_plain_client_op(), "only a client operation is numbered");
            out.put_u8(NUMBERED);
            out.put_u64(id.incarnation);
            out.put_u64(id.seq);
            put_op(op, out);
        }
    }
}

/// `op` as one daemon message.
pub fn op_bytes(op: &Op) -> Bytes {
    let mut out = BytesMut::new();
    encode_op(op, &mut out);
    out.freeze()
}

/// Several daemon messages (each as [`op_bytes`] makes it, none a batch) as
/// one: version, the batch kind, then each message as `u32 length ‖ bytes`.
///
/// # Panics
///
/// If `messages` has fewer than two messages, or one longer than 4 GiB.
pub fn batch_bytes(messages: &[Bytes]) -> Bytes {
    assert!(messages.len() >= 2, "a batch has two messages or more");
    let mut out = BytesMut::with_capacity(2 + messages.iter().map(|m| 4 + m.len()).sum::<usize>());
    out.put_u8(OP_VERSION);
    out.put_u8(BATCH);
    for m in messages {
        out.put_u32(u32::try_from(m.len()).expect("a daemon message is shorter than 4 GiB"));
        out.put_slice(m);
    }
    out.freeze()
}

/// The messages of a batch (slices of `msg`, not copies), or `None` if `msg`
/// is not a batch (a single operation, for [`decode_op`]). A batch must hold
/// two messages or more, with no bytes after the last, and none a batch
/// itself; each message is checked when it is decoded.
pub fn split_batch(msg: &Bytes) -> Result<Option<Vec<Bytes>>, OpError> {
    match msg.first() {
        None => return Err(OpError::Empty),
        Some(&v) if v != OP_VERSION => return Err(OpError::UnsupportedVersion(v)),
        _ => {}
    }
    if msg.get(1) != Some(&BATCH) {
        return Ok(None);
    }
    let bad = |what| OpError::Malformed(WireError::BadValue { what, value: 0 });
    let mut parts = Vec::new();
    let mut at = 2;
    while at < msg.len() {
        let len = msg.get(at..at + 4).ok_or(bad("batch length"))?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let end = at.checked_add(4 + len).filter(|&e| e <= msg.len()).ok_or(bad("batch length"))?;
        let part = msg.slice(at + 4..end);
        if part.get(1) == Some(&BATCH) {
            return Err(bad("batch inside a batch"));
        }
        parts.push(part);
        at = end;
    }
    if parts.len() < 2 {
        return Err(bad("batch of fewer than two messages"));
    }
    Ok(Some(parts))
}

/// Decodes one daemon message. Payloads are slices of `msg`, not copies.
pub fn decode_op(msg: Bytes) -> Result<Op, OpError> {
    let mut f = Fields::new(msg);
    let version = f.u8("version").map_err(|_| OpError::Empty)?;
    if version != OP_VERSION {
        return Err(OpError::UnsupportedVersion(version));
    }
    let op = match f.u8("kind")? {
        NUMBERED => {
            let id = OpId { incarnation: f.u64("incarnation")?, seq: f.u64("operation number")? };
            let kind = f.u8("numbered kind")?;
            if !(CONNECT..=REJECT).contains(&kind) {
                return Err(WireError::BadValue { what: "numbered kind", value: kind.into() }.into());
            }
            Op::Numbered { id, op: Box::new(client_op(kind, &mut f)?) }
        }
        kind @ CONNECT..=REJECT => client_op(kind, &mut f)?,
        DAEMONS => {
            let epoch = f.u64("epoch")?;
            let count = usize::from(f.u16("daemon count")?);
            let mut members = Vec::with_capacity(count.min(f.rest_len() / 2));
            for _ in 0..count {
                members.push(DaemonId(f.u16("daemon")?));
            }
            Op::Daemons { epoch, members }
        }
        DAEMON_KA => Op::DaemonKa { from: DaemonId(f.u16("daemon")?), payload: f.payload() },
        TRANSITIONAL => {
            let count = usize::from(f.u16("daemon count")?);
            let mut members = Vec::with_capacity(count.min(f.rest_len() / 2));
            for _ in 0..count {
                members.push(DaemonId(f.u16("daemon")?));
            }
            Op::Transitional { members }
        }
        STATE => {
            let epoch = f.u64("epoch")?;
            let daemon = DaemonId(f.u16("daemon")?);
            let next_view = f.u64("next view")?;
            let incarnation = f.u64("incarnation")?;
            let view_incarnation = f.u64("view incarnation")?;
            let floor = f.u64("applied floor")?;
            let n = f.u8("applied range count")?;
            let mut ranges = Vec::with_capacity(usize::from(n).min(f.rest_len() / 16));
            for _ in 0..n {
                ranges.push((f.u64("applied range start")?, f.u64("applied range end")?));
            }
            let applied = AppliedOps { floor, ranges };
            if !applied.is_canonical() {
                return Err(WireError::BadValue { what: "applied ranges", value: n.into() }.into());
            }
            let cut_len = usize::from(f.u16("cut length")?);
            let mut cut = Vec::with_capacity(cut_len.min(f.rest_len() / 2));
            for _ in 0..cut_len {
                cut.push(DaemonId(f.u16("cut daemon")?));
            }
            let count = f.u32("client count")? as usize;
            // A client takes at least 16 bytes, a membership at least 19: never
            // trust a count further than the message can back it.
            let mut clients = Vec::with_capacity(count.min(f.rest_len() / 16));
            for _ in 0..count {
                let conn = conn(&mut f)?;
                let name = f.member("member name")?;
                let n = f.u32("membership count")? as usize;
                let mut groups = Vec::with_capacity(n.min(f.rest_len() / 19));
                for _ in 0..n {
                    let group = f.group()?;
                    let (open, mode) = f.group_options()?;
                    groups.push(Membership { group, open, mode, view: f.view_id("view id")?, since: f.u64("since")? });
                }
                clients.push(ClientState { conn, name, groups });
            }
            Op::State {
                epoch,
                state: DaemonState { daemon, next_view, incarnation, view_incarnation, applied, cut, clients },
            }
        }
        k => return Err(WireError::UnknownKind(k).into()),
    };
    Ok(f.finish(op)?)
}

/// The fields of a client operation of `kind` (one of `CONNECT..=REJECT`).
fn client_op(kind: u8, f: &mut Fields) -> Result<Op, WireError> {
    Ok(match kind {
        CONNECT => Op::Connect { conn: conn(f)?, name: f.member("member name")? },
        DISCONNECT => Op::Disconnect { conn: conn(f)? },
        JOIN => {
            let (conn, group) = (conn(f)?, f.group()?);
            let (open, mode) = f.group_options()?;
            Op::Join { conn, group, open, mode }
        }
        LEAVE => Op::Leave { conn: conn(f)?, group: f.group()? },
        MULTICAST => Op::Multicast { conn: conn(f)?, group: f.group()?, service: f.service()?, payload: f.payload() },
        UNICAST => Op::Unicast { conn: conn(f)?, group: f.group()?, to: f.member("recipient")?, payload: f.payload() },
        REJECT => {
            let conn = conn(f)?;
            let code = ErrorCode::from_u16(f.u16("error code")?);
            let len = f.u16("error text")?;
            Op::Reject { conn, code, text: f.text(len.into(), "error text")?.to_owned() }
        }
        k => return Err(WireError::UnknownKind(k)),
    })
}

fn put_conn(out: &mut BytesMut, c: ConnId) {
    out.put_u16(c.daemon.0);
    out.put_u64(c.local);
}

fn put_str8(out: &mut BytesMut, s: &str) {
    // Member and group names are at most 255 bytes by construction.
    out.put_u8(u8::try_from(s.len()).expect("names fit a one-byte length"));
    out.put_slice(s.as_bytes());
}

fn conn(f: &mut Fields) -> Result<ConnId, WireError> {
    Ok(ConnId { daemon: DaemonId(f.u16("daemon")?), local: f.u64("connection")? })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{GroupName, MemberId, ViewId};
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9._-]{1,20}"
    }

    fn mode() -> impl Strategy<Value = crate::core::GroupMode> {
        use crate::core::GroupMode;
        prop_oneof![
            Just(GroupMode::Members),
            Just(GroupMode::Keyed),
            Just(GroupMode::ThreeStep),
            Just(GroupMode::OptimizedEvs)
        ]
    }

    fn conn_s() -> impl Strategy<Value = ConnId> {
        (any::<u16>(), any::<u64>()).prop_map(|(d, l)| ConnId { daemon: DaemonId(d), local: l })
    }

    fn membership() -> impl Strategy<Value = Membership> {
        (name(), any::<bool>(), mode(), any::<(u64, u64)>(), any::<u64>()).prop_map(|(g, open, mode, v, since)| {
            Membership { group: GroupName::new(g).unwrap(), open, mode, view: ViewId::new(v.0, v.1), since }
        })
    }

    #[test]
    fn a_batch_in_a_batch_or_of_one_message_is_refused() {
        let one = op_bytes(&Op::Disconnect { conn: ConnId { daemon: DaemonId(1), local: 2 } });
        let pair = batch_bytes(&[one.clone(), one.clone()]);
        assert!(split_batch(&batch_bytes(&[pair, one.clone()])).is_err());
        let mut single = vec![OP_VERSION, BATCH];
        single.extend_from_slice(&(one.len() as u32).to_be_bytes());
        single.extend_from_slice(&one);
        assert!(split_batch(&Bytes::from(single)).is_err());
        assert!(split_batch(&Bytes::from_static(&[OP_VERSION, BATCH])).is_err(), "an empty batch");
        assert_eq!(split_batch(&Bytes::new()), Err(OpError::Empty));
        assert_eq!(
            split_batch(&Bytes::from_static(&[OP_VERSION - 1, BATCH])),
            Err(OpError::UnsupportedVersion(OP_VERSION - 1))
        );
    }

    /// Every kind of operation, client operations also numbered.
    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            unnumbered_op(),
            (client_op_s(), any::<(u64, u64)>())
                .prop_map(|(op, (incarnation, seq))| op.numbered(OpId { incarnation, seq })),
        ]
    }

    /// A canonical record: a floor, then ranges laid out by gap and length.
    fn applied_ops() -> impl Strategy<Value = AppliedOps> {
        (any::<u32>(), proptest::collection::vec((1u64..1000, 0u64..1000), 0..6)).prop_map(|(floor, steps)| {
            let floor = u64::from(floor);
            let mut last = floor;
            let mut ranges = Vec::new();
            for (gap, len) in steps {
                let start = last + gap + u64::from(!ranges.is_empty());
                ranges.push((start, start + len));
                last = start + len;
            }
            AppliedOps { floor, ranges }
        })
    }

    fn client_op_s() -> impl Strategy<Value = Op> {
        unnumbered_op().prop_filter("a client operation", Op::is_plain_client_op)
    }

    fn unnumbered_op() -> impl Strategy<Value = Op> {
        let member = || name().prop_map(|s| MemberId::new(s).unwrap());
        let group = || name().prop_map(|s| GroupName::new(s).unwrap());
        let payload = || proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from);
        let client = (conn_s(), member(), proptest::collection::vec(membership(), 0..4))
            .prop_map(|(conn, name, groups)| ClientState { conn, name, groups });
        prop_oneof![
            (conn_s(), member()).prop_map(|(conn, name)| Op::Connect { conn, name }),
            conn_s().prop_map(|conn| Op::Disconnect { conn }),
            (conn_s(), group(), any::<bool>(), mode()).prop_map(|(conn, group, open, mode)| Op::Join {
                conn,
                group,
                open,
                mode
            }),
            (conn_s(), group()).prop_map(|(conn, group)| Op::Leave { conn, group }),
            (conn_s(), group(), any::<bool>(), payload()).prop_map(|(conn, group, fifo, payload)| Op::Multicast {
                conn,
                group,
                service: if fifo { Service::Fifo } else { Service::Agreed },
                payload
            }),
            (conn_s(), group(), member(), payload()).prop_map(|(conn, group, to, payload)| Op::Unicast {
                conn,
                group,
                to,
                payload
            }),
            (conn_s(), any::<u16>(), ".{0,40}").prop_map(|(conn, code, text)| Op::Reject {
                conn,
                code: ErrorCode::from_u16(code),
                text
            }),
            (any::<u64>(), proptest::collection::vec(any::<u16>(), 0..8))
                .prop_map(|(epoch, ds)| Op::Daemons { epoch, members: ds.into_iter().map(DaemonId).collect() }),
            proptest::collection::vec(any::<u16>(), 0..8)
                .prop_map(|ds| Op::Transitional { members: ds.into_iter().map(DaemonId).collect() }),
            (any::<u16>(), payload()).prop_map(|(d, payload)| Op::DaemonKa { from: DaemonId(d), payload }),
            (
                any::<u64>(),
                any::<u16>(),
                any::<(u64, u64, u64)>(),
                applied_ops(),
                proptest::collection::vec(any::<u16>(), 0..4),
                proptest::collection::vec(client, 0..4)
            )
                .prop_map(
                    |(epoch, d, (next_view, incarnation, view_incarnation), applied, cut, clients)| Op::State {
                        epoch,
                        state: DaemonState {
                            daemon: DaemonId(d),
                            next_view,
                            incarnation,
                            view_incarnation,
                            applied,
                            cut: cut.into_iter().map(DaemonId).collect(),
                            clients
                        }
                    }
                ),
        ]
    }

    proptest! {
        #[test]
        fn batches_split_into_their_messages_and_bad_ones_are_refused(
            ops in proptest::collection::vec(op(), 2..6),
            cut in any::<usize>(),
        ) {
            let parts: Vec<Bytes> = ops.iter().map(op_bytes).collect();
            let batch = batch_bytes(&parts);
            let back = split_batch(&batch).unwrap().unwrap();
            prop_assert_eq!(&back, &parts);
            for (b, op) in back.into_iter().zip(&ops) {
                prop_assert_eq!(&decode_op(b).unwrap(), op);
            }
            // A single operation is no batch; a batch is no single operation.
            prop_assert_eq!(split_batch(&parts[0]).unwrap(), None);
            prop_assert!(decode_op(batch.clone()).is_err());
            // Cut anywhere past its kind, a batch is refused, unless the cut
            // falls between two messages and leaves two or more.
            let end = 2 + cut % (batch.len() - 2);
            let boundaries: Vec<usize> = parts.iter().scan(2, |at, p| { *at += 4 + p.len(); Some(*at) }).collect();
            let whole = boundaries.iter().position(|&b| b == end).map(|i| i + 1);
            match split_batch(&batch.slice(..end)) {
                Ok(Some(got)) => prop_assert!(whole.is_some_and(|n| n >= 2 && got.len() == n)),
                Ok(None) => prop_assert!(false, "a cut batch read as a single operation"),
                Err(_) => prop_assert!(whole.is_none_or(|n| n < 2)),
            }
        }

        #[test]
        fn every_op_round_trips_canonically(op in op()) {
            let bytes = op_bytes(&op);
            let back = decode_op(bytes.clone()).unwrap();
            prop_assert_eq!(&back, &op);
            prop_assert_eq!(op_bytes(&back), bytes);
        }

        #[test]
        fn garbage_decodes_to_an_error_or_a_canonical_op(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(op) = decode_op(Bytes::from(bytes.clone())) {
                prop_assert_eq!(op_bytes(&op), Bytes::from(bytes));
            }
        }

        #[test]
        fn mutated_messages_decode_to_an_op_or_an_error(op in op(), at in any::<usize>(), byte in any::<u8>()) {
            let mut bytes = op_bytes(&op).to_vec();
            let i = at % bytes.len();
            bytes[i] = byte;
            let _ = decode_op(Bytes::from(bytes));
        }

        #[test]
        fn every_truncation_is_an_error(op in op(), cut in any::<usize>()) {
            let bytes = op_bytes(&op);
            let end = cut % bytes.len();
            // Payloads run to the end of the message, so cutting one short still decodes.
            if let Ok(back) = decode_op(bytes.slice(..end)) {
                let inner = match &back {
                    Op::Numbered { op, .. } => op.as_ref(),
                    op => op,
                };
                prop_assert!(matches!(inner, Op::Multicast { .. } | Op::Unicast { .. } | Op::DaemonKa { .. }), "{back:?}");
            }
        }
    }

    #[test]
    fn versions_and_kinds_are_checked() {
        assert_eq!(decode_op(Bytes::new()), Err(OpError::Empty));
        assert_eq!(decode_op(Bytes::from_static(&[1, DISCONNECT])), Err(OpError::UnsupportedVersion(1)));
        assert_eq!(decode_op(Bytes::from_static(&[2, DISCONNECT])), Err(OpError::UnsupportedVersion(2)));
        assert_eq!(
            decode_op(Bytes::from_static(&[OP_VERSION, 0x7f])),
            Err(OpError::Malformed(WireError::UnknownKind(0x7f)))
        );
        let mut msg = op_bytes(&Op::Disconnect { conn: ConnId { daemon: DaemonId(3), local: 9 } }).to_vec();
        msg.push(0);
        assert_eq!(decode_op(Bytes::from(msg)), Err(OpError::Malformed(WireError::Trailing(1))));
    }

    #[test]
    fn only_a_plain_client_operation_is_numbered() {
        let conn = ConnId { daemon: DaemonId(3), local: 9 };
        let id = OpId { incarnation: 7, seq: 1 };
        let numbered = Op::Disconnect { conn }.numbered(id);
        assert_eq!(numbered.conn(), Some(conn));
        assert_eq!(numbered.clone().numbered(OpId { incarnation: 7, seq: 2 }), numbered, "numbered once only");
        let daemons = Op::Daemons { epoch: 1, members: vec![DaemonId(1)] };
        assert_eq!(daemons.clone().numbered(id), daemons);
        // On the wire, a numbered operation wraps a client kind only.
        let mut msg = op_bytes(&numbered).to_vec();
        let kind_at = 2 + 8 + 8;
        assert_eq!(msg[kind_at], DISCONNECT);
        for bad in [NUMBERED, DAEMONS, STATE, TRANSITIONAL, DAEMON_KA, 0, 0x7f] {
            msg[kind_at] = bad;
            let err = decode_op(Bytes::from(msg.clone())).unwrap_err();
            assert!(
                matches!(err, OpError::Malformed(WireError::BadValue { what: "numbered kind", .. })),
                "kind {bad:#04x}: {err:?}"
            );
        }
    }

    #[test]
    fn applied_ranges_are_refused_unless_canonical() {
        let state = |floor, ranges: &[(u64, u64)]| Op::State {
            epoch: 1,
            state: DaemonState {
                daemon: DaemonId(1),
                next_view: 1,
                incarnation: 1,
                view_incarnation: 1,
                applied: AppliedOps { floor, ranges: ranges.to_vec() },
                cut: Vec::new(),
                clients: Vec::new(),
            },
        };
        let good = state(5, &[(7, 9), (11, 11)]);
        assert_eq!(decode_op(op_bytes(&good)), Ok(good));
        let too_many: Vec<(u64, u64)> = (0..65).map(|i| (10 + 2 * i, 10 + 2 * i)).collect();
        for (floor, ranges) in [
            (5, vec![(5, 9)]),           // touches the floor
            (5, vec![(4, 9)]),           // below it
            (5, vec![(9, 7)]),           // backwards
            (5, vec![(7, 9), (10, 12)]), // touching
            (5, vec![(7, 9), (8, 12)]),  // overlapping
            (5, vec![(11, 12), (7, 9)]), // descending
            (5, vec![(7, u64::MAX), (u64::MAX, u64::MAX)]),
            (5, too_many),
        ] {
            let err = decode_op(op_bytes(&state(floor, &ranges))).unwrap_err();
            assert!(
                matches!(err, OpError::Malformed(WireError::BadValue { what: "applied ranges", .. })),
                "{ranges:?}: {err:?}"
            );
        }
    }

    #[test]
    fn a_huge_count_is_refused_without_allocating_for_it() {
        let mut msg = vec![OP_VERSION, STATE];
        msg.extend_from_slice(&[0; 8 + 2 + 8 + 8 + 8 + 8 + 1 + 2]);
        msg.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(decode_op(Bytes::from(msg)), Err(OpError::Malformed(WireError::Truncated(_)))));
    }
}
