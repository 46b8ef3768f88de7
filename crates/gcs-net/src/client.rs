//! The client library: connect to a daemon, join and leave groups, send,
//! and receive [`Event`]s.
//!
//! ```no_run
//! # async fn demo() -> Result<(), conclave_gcs_net::ClientError> {
//! use conclave_gcs_net::{Client, Event, Service};
//! let mut c = Client::connect_unix("/run/conclave.sock", "alice").await?;
//! c.join("chat").await?;
//! c.multicast("chat", Service::Agreed, &b"hello"[..]).await?;
//! while let Ok(ev) = c.recv().await {
//!     if let Event::Message { sender, payload, .. } = ev {
//!         println!("{sender}: {payload:?}");
//!     }
//! }
//! # Ok(()) }
//! ```

use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use conclave_gcs::core::{ErrorCode, GroupMode, Service};
use conclave_gcs::view::NameError;
use conclave_gcs::wire::{self, FrameReader, Request, Status, StatusReply, WireError};
use conclave_gcs::{GroupName, MemberId};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs, UnixStream};
use tokio::sync::Mutex;

use crate::tls::{TlsClientOptions, TlsError};

/// What a client receives: views, messages, notices and errors from its
/// daemon (a [`Event::Welcome`] only ever comes first, inside `connect`).
pub use conclave_gcs::core::Delivery as Event;

/// Largest frame a client accepts from its daemon. Views of big groups are
/// the largest frames: at most about 265 bytes per member.
pub const MAX_EVENT_FRAME: usize = 64 << 20;

/// Errors of the client library.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection failed.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The daemon refused the connection (or, for a status request, the request).
    #[error("the daemon refused the connection ({}): {text}", wire::code_name(*code))]
    Refused {
        /// Why.
        code: ErrorCode,
        /// The daemon's explanation.
        text: String,
    },
    /// A member or group name breaks the naming rules.
    #[error("bad name: {0}")]
    Name(#[from] NameError),
    /// A message is larger than the daemon accepts.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The daemon sent something that is not a valid frame.
    #[error("malformed frame from the daemon: {0}")]
    Wire(#[from] WireError),
    /// The daemon answered Hello with something other than Welcome.
    #[error("expected Welcome, got {0:?}")]
    NoWelcome(Box<Event>),
    /// The daemon closed the connection.
    #[error("the daemon closed the connection")]
    Closed,
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Asks the daemon at the Unix socket `path` for its status (see
/// [`Request::Status`]): the daemon answers its own Unix user, root, and the
/// operators its configuration lists, and refuses everyone else
/// ([`ClientError::Refused`] with [`wire::ACCESS_DENIED`]).
pub async fn status_unix(path: impl AsRef<Path>) -> Result<Status, ClientError> {
    let (rd, wr) = UnixStream::connect(path).await?.into_split();
    ask_status(Box::new(rd), Box::new(wr)).await
}

/// Asks the daemon at TCP address `addr` for its status (see [`status_unix`]).
pub async fn status_tcp(addr: impl ToSocketAddrs) -> Result<Status, ClientError> {
    let (rd, wr) = TcpStream::connect(addr).await?.into_split();
    ask_status(Box::new(rd), Box::new(wr)).await
}

/// Asks the daemon at TLS address `addr` for its status (see
/// [`status_unix`]); an operator shows a client certificate in `options`.
pub async fn status_tls(
    addr: impl ToSocketAddrs,
    server_name: &str,
    options: &TlsClientOptions,
) -> Result<Status, ClientError> {
    let stream = TcpStream::connect(addr).await?;
    let (rd, wr) = tokio::io::split(options.connect(stream, server_name).await?);
    ask_status(Box::new(rd), Box::new(wr)).await
}

async fn ask_status(mut reader: Reader, mut writer: Writer) -> Result<Status, ClientError> {
    let mut buf = BytesMut::new();
    wire::encode_request(&Request::Status, &mut buf);
    writer.write_all(&buf).await?;
    writer.flush().await?;
    let mut frames = FrameReader::new(MAX_EVENT_FRAME);
    let mut buf = BytesMut::new();
    let frame = loop {
        if let Some(frame) = frames.next_frame(&mut buf)? {
            break frame;
        }
        if reader.read_buf(&mut buf).await? == 0 {
            return Err(ClientError::Closed);
        }
    };
    match wire::decode_status_reply(frame)? {
        StatusReply::Report(status) => Ok(status),
        StatusReply::Error { code, text } => Err(ClientError::Refused { code, text }),
    }
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;
type Reader = Box<dyn AsyncRead + Send + Sync + Unpin>;

/// A connection to a daemon. Sending takes `&self`; receiving `&mut self`.
/// [`Client::split`] separates the two for use from different tasks.
pub struct Client {
    sender: ClientSender,
    receiver: ClientReceiver,
}

/// The sending half of a [`Client`]; clones share the connection.
#[derive(Clone)]
pub struct ClientSender {
    writer: Arc<Mutex<Writer>>,
    max_payload: usize,
}

/// The receiving half of a [`Client`].
pub struct ClientReceiver {
    reader: Reader,
    buf: BytesMut,
    frames: FrameReader,
    /// The member names read lately, if on ([`ClientReceiver::cache_names`]).
    names: Option<conclave_gcs::NameCache>,
    /// The last view of each group, which the daemon sends the next one as
    /// changes to (the client's Hello asks for that).
    views: wire::ViewMemory,
}

impl Client {
    /// Connects over a Unix socket and introduces itself as `name`.
    pub async fn connect_unix(path: impl AsRef<Path>, name: &str) -> Result<Self, ClientError> {
        let (rd, wr) = UnixStream::connect(path).await?.into_split();
        Self::handshake(Box::new(rd), Box::new(wr), name).await
    }

    /// Connects over TCP and introduces itself as `name`.
    pub async fn connect_tcp(addr: impl ToSocketAddrs, name: &str) -> Result<Self, ClientError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (rd, wr) = stream.into_split();
        Self::handshake(Box::new(rd), Box::new(wr), name).await
    }

    /// Connects over TCP with TLS, checks the daemon's certificate against
    /// `server_name` (a DNS name or IP address it certifies), and introduces
    /// itself as `name`. A daemon that demands client certificates accepts
    /// `name` only if the certificate in `options` certifies it.
    pub async fn connect_tls(
        addr: impl ToSocketAddrs,
        server_name: &str,
        options: &TlsClientOptions,
        name: &str,
    ) -> Result<Self, ClientError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (rd, wr) = tokio::io::split(options.connect(stream, server_name).await?);
        Self::handshake(Box::new(rd), Box::new(wr), name).await
    }

    async fn handshake(reader: Reader, writer: Writer, name: &str) -> Result<Self, ClientError> {
        let name = MemberId::new(name)?;
        let mut c = Client {
            sender: ClientSender { writer: Arc::new(Mutex::new(writer)), max_payload: wire::DEFAULT_MAX_PAYLOAD },
            receiver: ClientReceiver {
                reader,
                buf: BytesMut::new(),
                frames: FrameReader::new(MAX_EVENT_FRAME),
                names: None,
                views: wire::ViewMemory::default(),
            },
        };
        c.sender.send(&Request::Hello { name: name.clone(), view_changes: true }).await?;
        match c.recv().await? {
            Event::Welcome { member } if member == name => Ok(c),
            Event::Error { code, text } => Err(ClientError::Refused { code, text }),
            other => Err(ClientError::NoWelcome(Box::new(other))),
        }
    }

    /// Sets the largest payload this client sends (the daemon's own limit
    /// still applies; the default is [`wire::DEFAULT_MAX_PAYLOAD`]).
    pub fn set_max_payload(&mut self, max: usize) {
        self.sender.max_payload = max;
    }

    /// Joins a closed group, creating it if needed.
    pub async fn join(&self, group: &str) -> Result<(), ClientError> {
        self.sender.join(group).await
    }

    /// Joins a group, creating it as an open group (non-members may send)
    /// if it does not exist.
    pub async fn join_open(&self, group: &str) -> Result<(), ClientError> {
        self.sender.join_open(group).await
    }

    /// Joins a group keyed by its daemons, creating it if it does not exist:
    /// each view comes with its key ([`Event::GroupKey`]).
    pub async fn join_keyed(&self, group: &str) -> Result<(), ClientError> {
        self.sender.join_keyed(group).await
    }

    /// Joins a closed group of mode `mode`, creating it if it does not exist
    /// (see [`GroupMode`]).
    pub async fn join_mode(&self, group: &str, mode: GroupMode) -> Result<(), ClientError> {
        self.sender.join_mode(group, mode).await
    }

    /// Leaves a group; [`Event::Left`] confirms it.
    pub async fn leave(&self, group: &str) -> Result<(), ClientError> {
        self.sender.leave(group).await
    }

    /// Multicasts to a group.
    pub async fn multicast(&self, group: &str, service: Service, payload: impl Into<Bytes>) -> Result<(), ClientError> {
        self.sender.multicast(group, service, payload).await
    }

    /// Sends to one member of a group.
    pub async fn unicast(&self, group: &str, to: &str, payload: impl Into<Bytes>) -> Result<(), ClientError> {
        self.sender.unicast(group, to, payload).await
    }

    /// The next event. Cancel-safe: nothing is lost if the future is dropped.
    pub async fn recv(&mut self) -> Result<Event, ClientError> {
        self.receiver.recv().await
    }

    /// Says goodbye; the daemon sends what is still queued, then closes.
    pub async fn bye(&self) -> Result<(), ClientError> {
        self.sender.bye().await
    }

    /// Separates sending from receiving.
    pub fn split(self) -> (ClientSender, ClientReceiver) {
        (self.sender, self.receiver)
    }
}

impl ClientSender {
    async fn send(&self, req: &Request) -> Result<(), ClientError> {
        let mut buf = BytesMut::new();
        wire::encode_request(req, &mut buf);
        let mut writer = self.writer.lock().await;
        writer.write_all(&buf).await?;
        // TLS holds written bytes back until flushed; plain sockets don't.
        writer.flush().await?;
        Ok(())
    }

    fn check(&self, payload: &Bytes) -> Result<(), ClientError> {
        if payload.len() > self.max_payload {
            return Err(ClientError::TooLarge { len: payload.len(), max: self.max_payload });
        }
        Ok(())
    }

    /// Joins a closed group, creating it if needed.
    pub async fn join(&self, group: &str) -> Result<(), ClientError> {
        self.join_mode(group, GroupMode::Members).await
    }

    /// Joins a group, creating it as an open group if it does not exist.
    pub async fn join_open(&self, group: &str) -> Result<(), ClientError> {
        self.send(&Request::Join { group: GroupName::new(group)?, open: true, mode: GroupMode::Members }).await
    }

    /// Joins a group keyed by its daemons, creating it if it does not exist:
    /// each view comes with its key ([`Event::GroupKey`]).
    pub async fn join_keyed(&self, group: &str) -> Result<(), ClientError> {
        self.join_mode(group, GroupMode::Keyed).await
    }

    /// Joins a closed group of mode `mode`, creating it if it does not exist
    /// (see [`GroupMode`]).
    pub async fn join_mode(&self, group: &str, mode: GroupMode) -> Result<(), ClientError> {
        self.join_with(group, false, mode).await
    }

    /// Joins a group of mode `mode`, creating it, open (non-members may
    /// send) or not, if it does not exist.
    pub async fn join_with(&self, group: &str, open: bool, mode: GroupMode) -> Result<(), ClientError> {
        self.send(&Request::Join { group: GroupName::new(group)?, open, mode }).await
    }

    /// Leaves a group.
    pub async fn leave(&self, group: &str) -> Result<(), ClientError> {
        self.send(&Request::Leave { group: GroupName::new(group)? }).await
    }

    /// Multicasts to a group.
    pub async fn multicast(&self, group: &str, service: Service, payload: impl Into<Bytes>) -> Result<(), ClientError> {
        let payload = payload.into();
        self.check(&payload)?;
        self.send(&Request::Multicast { group: GroupName::new(group)?, service, payload }).await
    }

    /// Sends to one member of a group.
    pub async fn unicast(&self, group: &str, to: &str, payload: impl Into<Bytes>) -> Result<(), ClientError> {
        let payload = payload.into();
        self.check(&payload)?;
        self.send(&Request::Unicast { group: GroupName::new(group)?, to: MemberId::new(to)?, payload }).await
    }

    /// Says goodbye.
    pub async fn bye(&self) -> Result<(), ClientError> {
        self.send(&Request::Bye).await
    }
}

impl ClientReceiver {
    /// Reads member names through a [`conclave_gcs::NameCache`] from now
    /// on: a name read before (every view repeats most of the last one's,
    /// and messages their senders') is a reference count instead of an
    /// allocation and, later, a free. It pays where the names are used
    /// again after decoding — a secure session keeps every view and its
    /// engine and key hold its members — and costs a little where each is
    /// read once and dropped (a cached name is cold in memory when it is
    /// compared; a fresh one is hot): off by default.
    pub fn cache_names(&mut self) {
        self.names.get_or_insert_with(conclave_gcs::NameCache::default);
    }

    /// The next event. Cancel-safe: nothing is lost if the future is dropped.
    pub async fn recv(&mut self) -> Result<Event, ClientError> {
        loop {
            if let Some(frame) = self.frames.next_frame(&mut self.buf)? {
                return Ok(wire::decode_delivery_tracked(frame, self.names.as_mut(), &mut self.views)?);
            }
            wire::make_room(&mut self.buf);
            if self.reader.read_buf(&mut self.buf).await? == 0 {
                return Err(ClientError::Closed);
            }
        }
    }

    /// The next event if it has already arrived (read from the connection
    /// without waiting), or `None`: lets a client that fell behind see what
    /// is queued behind the event it is handling. The end of the
    /// connection is left for [`ClientReceiver::recv`] to report.
    pub fn try_recv(&mut self) -> Result<Option<Event>, ClientError> {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        loop {
            if let Some(frame) = self.frames.next_frame(&mut self.buf)? {
                return Ok(Some(wire::decode_delivery_tracked(frame, self.names.as_mut(), &mut self.views)?));
            }
            // One poll of a read: ready only with bytes already received.
            // Dropping a pending read loses nothing (it has read nothing).
            let mut cx = Context::from_waker(Waker::noop());
            wire::make_room(&mut self.buf);
            let read = std::pin::pin!(self.reader.read_buf(&mut self.buf));
            match read.poll(&mut cx) {
                Poll::Ready(Ok(n)) if n > 0 => continue,
                Poll::Ready(Ok(_)) | Poll::Pending => return Ok(None),
                Poll::Ready(Err(e)) => return Err(e.into()),
            }
        }
    }
}
