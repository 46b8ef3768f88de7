//! The client–daemon wire format: versioned, length-delimited binary frames.
//!
//! Every frame is a 4-byte big-endian length followed by that many bytes: a
//! kind byte and the kind's fields. Clients send [`Request`]s; the daemon
//! sends [`Delivery`]s. The format is described byte by byte in `docs/wire.md`.
//!
//! Decoding is sans-IO: a [`FrameReader`] cuts frames off a buffer as bytes
//! arrive, refusing (and skipping) any frame longer than its limit before it is
//! buffered, and [`decode_request`] / [`decode_delivery`] parse one frame.
//! Decoders reject every malformed input with a [`WireError`] — they never
//! panic — and the encoding is canonical: bytes that decode re-encode to
//! themselves (but for a view given as changes, which decodes to the whole
//! view: [`decode_delivery_tracked`]).

use std::collections::HashMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::core::{Delivery, ErrorCode, GroupMode, Service, ViewKey};
use crate::view::{Cause, GroupName, MemberId, NameCache, NameError, View, ViewId, ViewMember};

/// The wire version this module speaks. A client announces it in `Hello`, the
/// daemon confirms it in `Welcome`.
pub const VERSION: u16 = 3;

/// Default limit on the payload of one message: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// Bytes a message frame needs beyond its payload: the kind, two names, the
/// service and a view id, with room to spare.
pub const FRAME_OVERHEAD: usize = 1024;

/// Longest error text sent; longer texts are cut.
pub const MAX_ERROR_TEXT: usize = u16::MAX as usize;

/// Error code 17, TooManyConnections (fatal): the daemon refuses a new
/// connection because it already serves as many connections as it may, in
/// all or from the client's address (or Unix user); the client may try again
/// later. The daemon sends it instead of Welcome, before or without reading
/// the client's Hello, and closes the connection.
pub const TOO_MANY_CONNECTIONS: ErrorCode = ErrorCode::TooManyConnections;

/// Error code 19, AccessDenied (not fatal): the daemon's configuration does
/// not let this client do what it asked — create, join or send to a group
/// (its group access rules), or read the daemon's status (its operators).
/// The request changes nothing and the connection goes on. (A code the
/// daemon core does not know, so it is [`ErrorCode::Other`]; clients compare
/// with this constant.)
pub const ACCESS_DENIED: ErrorCode = ErrorCode::Other(19);

/// The name of an error code for people: `AccessDenied` for
/// [`ACCESS_DENIED`], the variant's name for the others, `error 77` for a
/// code this version does not know.
pub fn code_name(code: ErrorCode) -> String {
    match code {
        ACCESS_DENIED => "AccessDenied".to_owned(),
        ErrorCode::Other(n) => format!("error {n}"),
        known => format!("{known:?}"),
    }
}

const HELLO: u8 = 0x01;
const JOIN: u8 = 0x02;
const LEAVE: u8 = 0x03;
const MULTICAST: u8 = 0x04;
const UNICAST: u8 = 0x05;
const BYE: u8 = 0x06;
const STATUS: u8 = 0x07;

const WELCOME: u8 = 0x81;
const VIEW: u8 = 0x82;
const VIEW_CHANGE_BEGINS: u8 = 0x83;
const LEFT: u8 = 0x84;
const MESSAGE: u8 = 0x85;
const UNICAST_MESSAGE: u8 = 0x86;
const ERROR: u8 = 0x87;
const GROUP_KEY: u8 = 0x88;
const STATUS_REPORT: u8 = 0x89;
const VIEW_CHANGES: u8 = 0x8a;

/// What a client asks its daemon.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Request {
    /// The first frame of a connection: who the client is (the frame also
    /// carries [`VERSION`]).
    Hello {
        /// The name the client asks for.
        name: MemberId,
        /// The client reads views given as changes to the last view it got
        /// of the group ([`ViewMemory`]): a view of n members then costs
        /// the daemon and the client what changed, not n names. A flags
        /// byte after the name (since version 3).
        view_changes: bool,
    },
    /// Join a group, creating it if needed.
    Join {
        /// Which group.
        group: GroupName,
        /// Whether non-members may send, if this join creates the group.
        open: bool,
        /// How the group's traffic is protected (the integrated
        /// architecture's variants), if this join creates the group; a later
        /// join must say the same.
        mode: GroupMode,
    },
    /// Leave a group.
    Leave {
        /// Which group.
        group: GroupName,
    },
    /// Multicast to a group.
    Multicast {
        /// Destination.
        group: GroupName,
        /// Requested ordering.
        service: Service,
        /// The message.
        payload: Bytes,
    },
    /// Send to one member of a group.
    Unicast {
        /// The group.
        group: GroupName,
        /// Recipient.
        to: MemberId,
        /// The message.
        payload: Bytes,
    },
    /// The client is done; the daemon closes the connection.
    Bye,
    /// A monitor asks for the daemon's status (the frame also carries
    /// [`VERSION`]): sent in place of Hello, on a connection of its own. The
    /// daemon answers with one status report ([`decode_status_reply`]) or an
    /// error ([`ACCESS_DENIED`] if the client is not one of its operators),
    /// then closes the connection.
    Status,
}

/// A daemon's status, as `conclave status` shows it: what a monitor may
/// know of a running daemon (docs/wire.md, *Status*).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Status {
    /// The lists were cut to keep the report within the daemon's limit
    /// (very many groups or connections): counts in `counters` are whole.
    pub truncated: bool,
    /// Milliseconds since the daemon started.
    pub uptime_ms: u64,
    /// This daemon's number in its daemon group (0 when standalone).
    pub daemon: u16,
    /// What orders the daemon's stream, for people: `standalone`, or the
    /// cluster and its CPG group.
    pub backbone: String,
    /// The daemon group's configuration, as this daemon last installed it:
    /// its id and daemons; `None` while a change is being worked through.
    pub configuration: Option<(ViewId, Vec<u16>)>,
    /// The limits in force, by name (at most 255), e.g. `max_connections`.
    pub limits: Vec<(String, u64)>,
    /// Counts, by name (at most 255), e.g. `connections`, `groups`.
    pub counters: Vec<(String, u64)>,
    /// Every group, by name.
    pub groups: Vec<GroupStatus>,
    /// This daemon's client connections.
    pub connections: Vec<ConnectionStatus>,
    /// The access policy in force, one rule per line, for people; empty:
    /// every client may create, join and send to every group.
    pub policy: Vec<String>,
}

/// One group in a [`Status`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GroupStatus {
    /// The group.
    pub name: GroupName,
    /// Non-members may send.
    pub open: bool,
    /// How its traffic is protected.
    pub mode: GroupMode,
    /// Its current view's id.
    pub view: ViewId,
    /// Its current members, oldest first (at every daemon of the group).
    pub members: Vec<MemberId>,
}

/// One client connection in a [`Status`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ConnectionStatus {
    /// The daemon's number for the connection.
    pub id: u64,
    /// The member name it said Hello with; `None` before Hello.
    pub name: Option<MemberId>,
    /// Who is at the other end, for people (at most 255 bytes): transport,
    /// address or Unix user, certificate.
    pub peer: String,
    /// Milliseconds since it was accepted.
    pub age_ms: u64,
    /// Frames queued for it, not yet written to its socket.
    pub queued_frames: u32,
    /// Bytes queued for it, not yet written to its socket.
    pub queued_bytes: u64,
    /// Groups it is a member of.
    pub groups: u32,
}

/// What a daemon answers a [`Request::Status`] with.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StatusReply {
    /// The status.
    Report(Status),
    /// The daemon refused ([`ACCESS_DENIED`]) or could not answer.
    Error {
        /// Why, as a code.
        code: ErrorCode,
        /// Why, in words.
        text: String,
    },
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A frame is longer than the reader's limit.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The frame's announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A frame has no kind byte.
    #[error("empty frame")]
    Empty,
    /// A frame ended inside a field.
    #[error("frame ends inside {0}")]
    Truncated(&'static str),
    /// An unknown kind byte.
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
    /// Bytes after the last field.
    #[error("{0} bytes after the last field")]
    Trailing(usize),
    /// A text field is not UTF-8.
    #[error("{0} is not UTF-8")]
    Utf8(&'static str),
    /// A name breaks the naming rules.
    #[error("bad {what}: {err}")]
    Name {
        /// Which field.
        what: &'static str,
        /// What is wrong with it.
        err: NameError,
    },
    /// A field has a value outside its range.
    #[error("bad {what}: {value}")]
    BadValue {
        /// Which field.
        what: &'static str,
        /// The value found.
        value: u64,
    },
    /// The peer speaks another version.
    #[error("wire version {0} is not supported (this is version {VERSION})")]
    UnsupportedVersion(u16),
    /// A view given as changes to a view the client does not hold as the
    /// last one of its group.
    #[error("a view of {group} given as changes to view {base}, which is not the last view this client got of it")]
    NoBaseView {
        /// The group.
        group: GroupName,
        /// The view the changes are to.
        base: ViewId,
    },
}

impl WireError {
    /// The error code a daemon answers this error with.
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::TooLarge { .. } => ErrorCode::TooLarge,
            WireError::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
            _ => ErrorCode::Malformed,
        }
    }
}

/// Cuts frames off the front of a receive buffer.
#[derive(Debug)]
pub struct FrameReader {
    max: usize,
    skip: usize,
}

impl FrameReader {
    /// A reader that refuses frames longer than `max` bytes (not counting the
    /// length prefix).
    pub fn new(max: usize) -> Self {
        Self { max, skip: 0 }
    }

    /// The next complete frame (kind byte and fields) in `buf`, if one has
    /// fully arrived. A frame over the limit is reported once with
    /// [`WireError::TooLarge`] and its bytes are then dropped as they arrive,
    /// so a caller may go on reading after that error.
    pub fn next_frame(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
        if self.skip > 0 {
            let n = self.skip.min(buf.len());
            buf.advance(n);
            self.skip -= n;
            if self.skip > 0 {
                return Ok(None);
            }
        }
        let Some(prefix) = buf.get(..4) else { return Ok(None) };
        let len = u32::from_be_bytes(prefix.try_into().expect("four bytes")) as usize;
        if len > self.max {
            buf.advance(4);
            self.skip = len;
            return Err(WireError::TooLarge { len, max: self.max });
        }
        if buf.len() < 4 + len {
            buf.reserve(4 + len - buf.len());
            return Ok(None);
        }
        buf.advance(4);
        Ok(Some(buf.split_to(len).freeze()))
    }

    /// Whether the reader is dropping the rest of a frame over the limit.
    pub fn skipping(&self) -> bool {
        self.skip > 0
    }
}

/// Spare room [`make_room`] gives a read buffer before each read.
pub const READ_CHUNK: usize = 16 * 1024;

/// Makes room for one read of up to [`READ_CHUNK`] bytes in `buf`, unless
/// it has at least a quarter of that already. Without it a `BytesMut`
/// whose frames were split off has no spare capacity, and a read into it
/// gets 64 bytes (what `BytesMut` adds when full): two or three system
/// calls per small frame, where one read can take a hundred. The
/// allocation is reused once the frames split off it are dropped.
pub fn make_room(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// Field-by-field reading of one frame.
pub(crate) struct Fields {
    frame: Bytes,
    pos: usize,
}

impl Fields {
    /// Reads `frame` from its first byte.
    pub(crate) fn new(frame: Bytes) -> Self {
        Self { frame, pos: 0 }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], WireError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.frame.len()).ok_or(WireError::Truncated(what))?;
        let s = &self.frame[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.take(2, what)?.try_into().expect("two bytes")))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.take(4, what)?.try_into().expect("four bytes")))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.take(8, what)?.try_into().expect("eight bytes")))
    }

    pub(crate) fn text(&mut self, len: usize, what: &'static str) -> Result<&str, WireError> {
        std::str::from_utf8(self.take(len, what)?).map_err(|_| WireError::Utf8(what))
    }

    fn str8(&mut self, what: &'static str) -> Result<&str, WireError> {
        let len = self.u8(what)?;
        self.text(len.into(), what)
    }

    /// A `u8` count of (`str8` name, `u64` value) pairs.
    fn named_numbers(&mut self, what: &'static str) -> Result<Vec<(String, u64)>, WireError> {
        let count = self.u8(what)?;
        let mut list = Vec::with_capacity(count.into());
        for _ in 0..count {
            let name = self.str8(what)?.to_owned();
            list.push((name, self.u64(what)?));
        }
        Ok(list)
    }

    pub(crate) fn member(&mut self, what: &'static str) -> Result<MemberId, WireError> {
        self.member_in(what, None)
    }

    /// [`Self::member`], through `names` if given.
    pub(crate) fn member_in(
        &mut self,
        what: &'static str,
        names: Option<&mut NameCache>,
    ) -> Result<MemberId, WireError> {
        let name = self.str8(what)?;
        match names {
            Some(names) => names.name(name),
            None => MemberId::from_name(name),
        }
        .map_err(|err| WireError::Name { what, err })
    }

    pub(crate) fn group(&mut self) -> Result<GroupName, WireError> {
        GroupName::new(self.str8("group name")?).map_err(|err| WireError::Name { what: "group name", err })
    }

    /// A [`ViewId`]: incarnation, then counter.
    pub(crate) fn view_id(&mut self, what: &'static str) -> Result<ViewId, WireError> {
        Ok(ViewId::new(self.u64(what)?, self.u64(what)?))
    }

    pub(crate) fn flag(&mut self, what: &'static str) -> Result<bool, WireError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(WireError::BadValue { what, value: v.into() }),
        }
    }

    /// A group's options byte (see [`group_options`]); any other value is
    /// malformed.
    pub(crate) fn group_options(&mut self) -> Result<(bool, GroupMode), WireError> {
        let v = self.u8("group options")?;
        let mode = match (v >> 1) & 0b11 {
            0 => GroupMode::Members,
            1 => GroupMode::Keyed,
            2 => GroupMode::ThreeStep,
            3 => GroupMode::OptimizedEvs,
            _ => return Err(WireError::BadValue { what: "group options", value: v.into() }),
        };
        match v & !0b111 {
            0 => Ok((v & 1 == 1, mode)),
            _ => Err(WireError::BadValue { what: "group options", value: v.into() }),
        }
    }

    fn version(&mut self) -> Result<(), WireError> {
        match self.u16("version")? {
            VERSION => Ok(()),
            v => Err(WireError::UnsupportedVersion(v)),
        }
    }

    pub(crate) fn service(&mut self) -> Result<Service, WireError> {
        match self.u8("service")? {
            1 => Ok(Service::Fifo),
            2 => Ok(Service::Agreed),
            v => Err(WireError::BadValue { what: "service", value: v.into() }),
        }
    }

    fn cause(&mut self) -> Result<Cause, WireError> {
        match self.u8("cause")? {
            1 => Ok(Cause::Join),
            2 => Ok(Cause::Leave),
            3 => Ok(Cause::Disconnect),
            4 => Ok(Cause::Network),
            5 => Ok(Cause::Refresh),
            v => Err(WireError::BadValue { what: "cause", value: v.into() }),
        }
    }

    fn view(&mut self, mut names: Option<&mut NameCache>) -> Result<View, WireError> {
        let id = self.view_id("view id")?;
        let cause = self.cause()?;
        let count = self.u32("member count")? as usize;
        // Each member takes at least three bytes: never trust the count
        // further than the frame can back it.
        let mut members = Vec::with_capacity(count.min(self.rest_len() / 3));
        for _ in 0..count {
            let id = self.member_in("member name", names.as_deref_mut())?;
            let prev = if self.flag("previous view flag")? { Some(self.view_id("previous view")?) } else { None };
            members.push(ViewMember { id, prev });
        }
        Ok(View { id, members: members.into(), cause })
    }

    /// A view given as changes to the last view of its group in `views`
    /// (see [`encode_view_changes`]): kept runs must go forward through
    /// that view without overlapping, so the view has at most as many kept
    /// members as it and as many added ones as the frame spells out.
    fn view_changes(&mut self, mut names: Option<&mut NameCache>, views: &ViewMemory) -> Result<Delivery, WireError> {
        let group = self.group()?;
        let id = self.view_id("view id")?;
        let cause = self.cause()?;
        let base_id = self.view_id("base view")?;
        let base = match views.views.get(&group) {
            Some(base) if base.id == base_id => base,
            _ => return Err(WireError::NoBaseView { group, base: base_id }),
        };
        let count = self.u32("segment count")? as usize;
        // A segment takes at least three bytes; a kept run at most adds
        // what is left of the base view.
        let mut members = Vec::with_capacity(base.members.len() + (self.rest_len() / 3).min(count));
        let mut next = 0;
        for _ in 0..count {
            match self.u8("segment tag")? {
                KEPT => {
                    let start = self.u32("kept run start")? as usize;
                    let len = self.u32("kept run length")? as usize;
                    let end = start.checked_add(len).filter(|&e| len > 0 && start >= next && e <= base.members.len());
                    let Some(end) = end else {
                        return Err(WireError::BadValue { what: "kept run", value: start as u64 });
                    };
                    let prev = Some(base_id);
                    members.extend(base.members[start..end].iter().map(|m| ViewMember { id: m.id.clone(), prev }));
                    next = end;
                }
                ADDED => {
                    let id = self.member_in("member name", names.as_deref_mut())?;
                    let prev =
                        if self.flag("previous view flag")? { Some(self.view_id("previous view")?) } else { None };
                    members.push(ViewMember { id, prev });
                }
                v => return Err(WireError::BadValue { what: "segment tag", value: v.into() }),
            }
        }
        Ok(Delivery::View { group, view: View { id, members: members.into(), cause } })
    }

    pub(crate) fn rest_len(&self) -> usize {
        self.frame.len() - self.pos
    }

    /// The rest of the frame, without copying.
    pub(crate) fn payload(&mut self) -> Bytes {
        let p = self.frame.slice(self.pos..);
        self.pos = self.frame.len();
        p
    }

    pub(crate) fn finish<T>(self, value: T) -> Result<T, WireError> {
        match self.rest_len() {
            0 => Ok(value),
            n => Err(WireError::Trailing(n)),
        }
    }
}

fn fields(frame: Bytes) -> Result<(u8, Fields), WireError> {
    let mut f = Fields { frame, pos: 0 };
    let kind = f.u8("kind").map_err(|_| WireError::Empty)?;
    Ok((kind, f))
}

/// Decodes one client request frame (as returned by [`FrameReader::next_frame`]).
pub fn decode_request(frame: Bytes) -> Result<Request, WireError> {
    let (kind, mut f) = fields(frame)?;
    let req = match kind {
        HELLO => {
            f.version()?;
            let name = f.member("member name")?;
            let view_changes = f.flag("hello flags")?;
            Request::Hello { name, view_changes }
        }
        JOIN => {
            let group = f.group()?;
            let (open, mode) = f.group_options()?;
            Request::Join { group, open, mode }
        }
        LEAVE => Request::Leave { group: f.group()? },
        MULTICAST => Request::Multicast { group: f.group()?, service: f.service()?, payload: f.payload() },
        UNICAST => Request::Unicast { group: f.group()?, to: f.member("recipient")?, payload: f.payload() },
        BYE => Request::Bye,
        STATUS => {
            f.version()?;
            Request::Status
        }
        k => return Err(WireError::UnknownKind(k)),
    };
    f.finish(req)
}

/// Decodes the daemon's answer to [`Request::Status`]: a status report, or
/// an error frame.
pub fn decode_status_reply(frame: Bytes) -> Result<StatusReply, WireError> {
    match frame.first() {
        Some(&STATUS_REPORT) => {}
        Some(&ERROR) => {
            return match decode_delivery(frame)? {
                Delivery::Error { code, text } => Ok(StatusReply::Error { code, text }),
                // Never: an error frame decodes to an error.
                _ => Err(WireError::UnknownKind(ERROR)),
            };
        }
        Some(&kind) => return Err(WireError::UnknownKind(kind)),
        None => return Err(WireError::Empty),
    }
    let (_, mut f) = fields(frame)?;
    let truncated = f.flag("truncated flag")?;
    let uptime_ms = f.u64("uptime")?;
    let daemon = f.u16("daemon")?;
    let backbone = f.str8("backbone")?.to_owned();
    let configuration = if f.flag("configuration flag")? {
        let id = f.view_id("configuration id")?;
        let count = f.u16("daemon count")?;
        let mut daemons = Vec::with_capacity(usize::from(count).min(f.rest_len() / 2));
        for _ in 0..count {
            daemons.push(f.u16("daemon")?);
        }
        Some((id, daemons))
    } else {
        None
    };
    let limits = f.named_numbers("limit")?;
    let counters = f.named_numbers("counter")?;
    let count = f.u32("group count")? as usize;
    // Each group takes at least 1 + 1 + 1 + 16 + 4 bytes.
    let mut groups = Vec::with_capacity(count.min(f.rest_len() / 23));
    for _ in 0..count {
        let name = f.group()?;
        let (open, mode) = f.group_options()?;
        let view = f.view_id("view id")?;
        let n = f.u32("member count")? as usize;
        let mut members = Vec::with_capacity(n.min(f.rest_len() / 2));
        for _ in 0..n {
            members.push(f.member("member name")?);
        }
        groups.push(GroupStatus { name, open, mode, view, members });
    }
    let count = f.u32("connection count")? as usize;
    // Each connection takes at least 8 + 1 + 1 + 8 + 4 + 8 + 4 bytes.
    let mut connections = Vec::with_capacity(count.min(f.rest_len() / 34));
    for _ in 0..count {
        let id = f.u64("connection id")?;
        let name = if f.flag("name flag")? { Some(f.member("member name")?) } else { None };
        let peer = f.str8("peer")?.to_owned();
        connections.push(ConnectionStatus {
            id,
            name,
            peer,
            age_ms: f.u64("connection age")?,
            queued_frames: f.u32("queued frames")?,
            queued_bytes: f.u64("queued bytes")?,
            groups: f.u32("group count")?,
        });
    }
    let count = f.u16("policy rule count")?;
    let mut policy = Vec::with_capacity(usize::from(count).min(f.rest_len() / 2));
    for _ in 0..count {
        let len = f.u16("policy rule")?;
        policy.push(f.text(len.into(), "policy rule")?.to_owned());
    }
    f.finish(StatusReply::Report(Status {
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
    }))
}

/// Appends `status` as one status report frame to `out`. Texts longer than
/// their fields hold (255 bytes for names of limits and counters, the
/// backbone and peers; 65535 for policy rules) are cut at a character
/// boundary, and lists longer than their counts hold are cut (callers keep
/// far below: a daemon cuts its report at a few MiB and sets `truncated`).
pub fn encode_status(status: &Status, out: &mut BytesMut) {
    let mut w = FrameWriter::new(out, STATUS_REPORT);
    w.bytes(&[u8::from(status.truncated)]).bytes(&status.uptime_ms.to_be_bytes()).bytes(&status.daemon.to_be_bytes());
    w.text8(&status.backbone);
    match &status.configuration {
        Some((id, daemons)) => {
            let daemons = &daemons[..daemons.len().min(u16::MAX.into())];
            w.bytes(&[1]).bytes(&id.to_bytes()).bytes(&(daemons.len() as u16).to_be_bytes());
            for d in daemons {
                w.bytes(&d.to_be_bytes());
            }
        }
        None => {
            w.bytes(&[0]);
        }
    }
    for list in [&status.limits, &status.counters] {
        let list = &list[..list.len().min(u8::MAX.into())];
        w.bytes(&[list.len() as u8]);
        for (name, value) in list {
            w.text8(name).bytes(&value.to_be_bytes());
        }
    }
    let groups = &status.groups[..status.groups.len().min(u32::MAX as usize)];
    w.bytes(&(groups.len() as u32).to_be_bytes());
    for g in groups {
        w.str8(g.name.as_str()).bytes(&[group_options(g.open, g.mode)]).bytes(&g.view.to_bytes());
        let members = &g.members[..g.members.len().min(u32::MAX as usize)];
        w.bytes(&(members.len() as u32).to_be_bytes());
        for m in members {
            w.str8(m.as_str());
        }
    }
    let conns = &status.connections[..status.connections.len().min(u32::MAX as usize)];
    w.bytes(&(conns.len() as u32).to_be_bytes());
    for c in conns {
        w.bytes(&c.id.to_be_bytes());
        match &c.name {
            Some(name) => w.bytes(&[1]).str8(name.as_str()),
            None => w.bytes(&[0]),
        };
        w.text8(&c.peer)
            .bytes(&c.age_ms.to_be_bytes())
            .bytes(&c.queued_frames.to_be_bytes())
            .bytes(&c.queued_bytes.to_be_bytes())
            .bytes(&c.groups.to_be_bytes());
    }
    let policy = &status.policy[..status.policy.len().min(u16::MAX.into())];
    w.bytes(&(policy.len() as u16).to_be_bytes());
    for rule in policy {
        let rule = cut(rule, u16::MAX.into());
        w.bytes(&(rule.len() as u16).to_be_bytes()).bytes(rule.as_bytes());
    }
    w.finish();
}

/// Appends a daemon's answer to [`Request::Status`] as one frame to `out`.
pub fn encode_status_reply(reply: &StatusReply, out: &mut BytesMut) {
    match reply {
        StatusReply::Report(status) => encode_status(status, out),
        StatusReply::Error { code, text } => encode_delivery(&Delivery::Error { code: *code, text: text.clone() }, out),
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends at a character
/// boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Decodes one daemon frame (as returned by [`FrameReader::next_frame`]).
pub fn decode_delivery(frame: Bytes) -> Result<Delivery, WireError> {
    decode_delivery_with(frame, None)
}

/// [`decode_delivery`], reading member names through `names` (a client
/// reads the same names view after view: see [`NameCache`]).
pub fn decode_delivery_with(frame: Bytes, names: Option<&mut NameCache>) -> Result<Delivery, WireError> {
    let (kind, mut f) = fields(frame)?;
    let d = match kind {
        WELCOME => {
            f.version()?;
            Delivery::Welcome { member: f.member("member name")? }
        }
        VIEW => Delivery::View { group: f.group()?, view: f.view(names)? },
        VIEW_CHANGE_BEGINS => Delivery::ViewChangeBegins { group: f.group()? },
        LEFT => Delivery::Left { group: f.group()? },
        MESSAGE => Delivery::Message {
            group: f.group()?,
            sender: f.member_in("sender", names)?,
            service: f.service()?,
            view: f.view_id("view id")?,
            payload: f.payload(),
        },
        UNICAST_MESSAGE => Delivery::Unicast {
            group: f.group()?,
            sender: f.member_in("sender", names)?,
            view: f.view_id("view id")?,
            payload: f.payload(),
        },
        ERROR => {
            let code = ErrorCode::from_u16(f.u16("error code")?);
            let len = f.u16("error text")?;
            Delivery::Error { code, text: f.text(len.into(), "error text")?.to_owned() }
        }
        GROUP_KEY => {
            let group = f.group()?;
            let view = f.view_id("view id")?;
            let key = f.take(32, "group key")?.try_into().expect("32 bytes");
            Delivery::GroupKey { group, view, key: ViewKey::new(key) }
        }
        k => return Err(WireError::UnknownKind(k)),
    };
    f.finish(d)
}

/// The last view a client got of each of its groups, which the next view
/// of the group may come as changes to (a client that said Hello with
/// `view_changes`: [`decode_delivery_tracked`]). One view per group the
/// client is in: a group's is dropped when the client leaves it.
#[derive(Default)]
pub struct ViewMemory {
    views: HashMap<GroupName, View>,
}

impl ViewMemory {
    /// The last view held of `group`.
    pub fn view(&self, group: &GroupName) -> Option<&View> {
        self.views.get(group)
    }
}

/// [`decode_delivery_with`] for a client that reads views as changes: a
/// whole view or one given as changes to the last view of its group in
/// `views` comes out as [`Delivery::View`] and becomes the group's last
/// view there; [`Delivery::Left`] drops the group's. Changes to a view that
/// is not the group's last are [`WireError::NoBaseView`].
pub fn decode_delivery_tracked(
    frame: Bytes,
    names: Option<&mut NameCache>,
    views: &mut ViewMemory,
) -> Result<Delivery, WireError> {
    let d = match frame.first() {
        Some(&VIEW_CHANGES) => {
            let (_, mut f) = fields(frame)?;
            let view = f.view_changes(names, views)?;
            f.finish(view)?
        }
        _ => decode_delivery_with(frame, names)?,
    };
    match &d {
        Delivery::View { group, view } => {
            views.views.insert(group.clone(), view.clone());
        }
        Delivery::Left { group } => {
            views.views.remove(group);
        }
        _ => {}
    }
    Ok(d)
}

/// Encodes view `view` of `group` whole, as [`encode_delivery`] encodes
/// [`Delivery::View`] (without a delivery to build first).
pub fn encode_view(group: &GroupName, view: &View, out: &mut BytesMut) {
    FrameWriter::new(out, VIEW).str8(group.as_str()).view(view).finish()
}

/// Segment tags of a view given as changes.
const KEPT: u8 = 0;
const ADDED: u8 = 1;

/// Encodes view `view` of `group` as changes to `base`, the last view of the
/// group its recipients got: runs of `base`'s members that stay, in order,
/// having come from `base` (`prev` is `base`), and every other member
/// written out. O(n) for n members, once per view, whoever receives it.
pub fn encode_view_changes(group: &GroupName, view: &View, base: &View, out: &mut BytesMut) {
    let place: HashMap<&str, usize, foldhash::fast::RandomState> =
        base.members.iter().enumerate().map(|(i, m)| (m.id.as_str(), i)).collect();
    // (start, len) of a kept run, or the index of an added member in `view`.
    let mut segments: Vec<Result<(usize, usize), usize>> = Vec::new();
    let mut next = 0; // kept runs go forward through `base`
    for (i, m) in view.members.iter().enumerate() {
        let kept = (m.prev == Some(base.id)).then(|| place.get(m.id.as_str()).copied()).flatten();
        match kept {
            Some(j) if j >= next => {
                match segments.last_mut() {
                    Some(Ok((start, len))) if *start + *len == j => *len += 1,
                    _ => segments.push(Ok((j, 1))),
                }
                next = j + 1;
            }
            _ => segments.push(Err(i)),
        }
    }
    let mut w = FrameWriter::new(out, VIEW_CHANGES);
    w.str8(group.as_str()).view_head(view).bytes(&base.id.to_bytes());
    let count = u32::try_from(segments.len()).expect("views have fewer than 2^32 members");
    w.bytes(&count.to_be_bytes());
    for seg in segments {
        match seg {
            Ok((start, len)) => {
                w.bytes(&[KEPT]);
                w.bytes(&(start as u32).to_be_bytes()).bytes(&(len as u32).to_be_bytes());
            }
            Err(i) => {
                w.bytes(&[ADDED]);
                w.member(&view.members[i]);
            }
        }
    }
    w.finish();
}

/// Writes one frame: the length prefix is patched in when the fields are done.
struct FrameWriter<'a> {
    out: &'a mut BytesMut,
    start: usize,
}

impl<'a> FrameWriter<'a> {
    fn new(out: &'a mut BytesMut, kind: u8) -> Self {
        let start = out.len();
        out.put_u32(0);
        out.put_u8(kind);
        Self { out, start }
    }

    fn str8(&mut self, s: &str) -> &mut Self {
        // Member and group names are at most 255 bytes by construction.
        let len = u8::try_from(s.len()).expect("names fit a one-byte length");
        self.out.put_u8(len);
        self.out.put_slice(s.as_bytes());
        self
    }

    /// Free text with a one-byte length, cut at a character boundary to fit.
    fn text8(&mut self, s: &str) -> &mut Self {
        let s = cut(s, u8::MAX.into());
        self.out.put_u8(s.len() as u8);
        self.out.put_slice(s.as_bytes());
        self
    }

    fn service(&mut self, s: Service) -> &mut Self {
        self.out.put_u8(match s {
            Service::Fifo => 1,
            Service::Agreed => 2,
        });
        self
    }

    fn view(&mut self, v: &View) -> &mut Self {
        self.view_head(v);
        let count = u32::try_from(v.members.len()).expect("views have fewer than 2^32 members");
        self.out.put_u32(count);
        for m in v.members.iter() {
            self.member(m);
        }
        self
    }

    /// A view member: its name, and the view it came from if any.
    fn member(&mut self, m: &ViewMember) -> &mut Self {
        self.str8(m.id.as_str());
        match m.prev {
            Some(p) => {
                self.out.put_u8(1);
                self.out.put_slice(&p.to_bytes());
            }
            None => self.out.put_u8(0),
        }
        self
    }

    /// A view's id and cause.
    fn view_head(&mut self, v: &View) -> &mut Self {
        self.out.put_slice(&v.id.to_bytes());
        self.out.put_u8(match v.cause {
            Cause::Join => 1,
            Cause::Leave => 2,
            Cause::Disconnect => 3,
            Cause::Network => 4,
            Cause::Refresh => 5,
        });
        self
    }

    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.out.put_slice(b);
        self
    }

    fn finish(&mut self) {
        let len = self.out.len() - self.start - 4;
        let len = u32::try_from(len).expect("frames are shorter than 4 GiB: callers limit payloads");
        self.out[self.start..self.start + 4].copy_from_slice(&len.to_be_bytes());
    }
}

/// The options byte of a group: bit 0 open; bits 1–2 its mode (0 its
/// members' own keys, 1 keyed by its daemons, 2 three-step, 3 optimized EVS).
pub(crate) fn group_options(open: bool, mode: GroupMode) -> u8 {
    let mode = match mode {
        GroupMode::Members => 0,
        GroupMode::Keyed => 1,
        GroupMode::ThreeStep => 2,
        GroupMode::OptimizedEvs => 3,
    };
    u8::from(open) | (mode << 1)
}

/// Appends `req` as one frame to `out`.
pub fn encode_request(req: &Request, out: &mut BytesMut) {
    match req {
        Request::Hello { name, view_changes } => FrameWriter::new(out, HELLO)
            .bytes(&VERSION.to_be_bytes())
            .str8(name.as_str())
            .bytes(&[u8::from(*view_changes)])
            .finish(),
        Request::Join { group, open, mode } => {
            FrameWriter::new(out, JOIN).str8(group.as_str()).bytes(&[group_options(*open, *mode)]).finish()
        }
        Request::Leave { group } => FrameWriter::new(out, LEAVE).str8(group.as_str()).finish(),
        Request::Multicast { group, service, payload } => {
            FrameWriter::new(out, MULTICAST).str8(group.as_str()).service(*service).bytes(payload).finish()
        }
        Request::Unicast { group, to, payload } => {
            FrameWriter::new(out, UNICAST).str8(group.as_str()).str8(to.as_str()).bytes(payload).finish()
        }
        Request::Bye => FrameWriter::new(out, BYE).finish(),
        Request::Status => FrameWriter::new(out, STATUS).bytes(&VERSION.to_be_bytes()).finish(),
    }
}

/// Appends `d` as one frame to `out`. An error text longer than
/// [`MAX_ERROR_TEXT`] bytes is cut at a character boundary.
pub fn encode_delivery(d: &Delivery, out: &mut BytesMut) {
    match d {
        Delivery::Welcome { member } => {
            FrameWriter::new(out, WELCOME).bytes(&VERSION.to_be_bytes()).str8(member.as_str()).finish()
        }
        Delivery::View { group, view } => encode_view(group, view, out),
        Delivery::ViewChangeBegins { group } => FrameWriter::new(out, VIEW_CHANGE_BEGINS).str8(group.as_str()).finish(),
        Delivery::Left { group } => FrameWriter::new(out, LEFT).str8(group.as_str()).finish(),
        Delivery::Message { group, sender, service, view, payload } => FrameWriter::new(out, MESSAGE)
            .str8(group.as_str())
            .str8(sender.as_str())
            .service(*service)
            .bytes(&view.to_bytes())
            .bytes(payload)
            .finish(),
        Delivery::Unicast { group, sender, view, payload } => FrameWriter::new(out, UNICAST_MESSAGE)
            .str8(group.as_str())
            .str8(sender.as_str())
            .bytes(&view.to_bytes())
            .bytes(payload)
            .finish(),
        Delivery::GroupKey { group, view, key } => FrameWriter::new(out, GROUP_KEY)
            .str8(group.as_str())
            .bytes(&view.to_bytes())
            .bytes(key.expose_secret())
            .finish(),
        Delivery::Error { code, text } => {
            let mut end = text.len().min(MAX_ERROR_TEXT);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let len = u16::try_from(end).expect("cut to fit");
            FrameWriter::new(out, ERROR)
                .bytes(&code.to_u16().to_be_bytes())
                .bytes(&len.to_be_bytes())
                .bytes(&text.as_bytes()[..end])
                .finish()
        }
    }
}
