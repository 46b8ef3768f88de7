//! A small bounds-checked binary codec for protocol messages.
//!
//! Every read is checked against the remaining input and a caller-supplied
//! limit, so decoders return [`DecodeError`] on any malformed input and never
//! panic or allocate more than the input can justify.

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended early.
    #[error("message truncated while reading {0}")]
    Truncated(&'static str),
    /// A length or count is larger than allowed.
    #[error("{0} too long: {1} > {2}")]
    TooLong(&'static str, usize, usize),
    /// Bytes remained after the message.
    #[error("{0} trailing bytes")]
    Trailing(usize),
    /// A field has a value that is not allowed.
    #[error("bad {0}")]
    Bad(&'static str),
}

/// Reads fields from a byte slice.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads from `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Takes exactly `n` bytes.
    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated(what));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    /// One byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.bytes(1, what)?[0])
    }

    /// Big-endian u16.
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let b = self.bytes(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// Big-endian u32.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Big-endian u64.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let b = self.bytes(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A u8-length-prefixed byte string of at most `max` bytes.
    pub fn short_bytes(&mut self, max: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.u8(what)? as usize;
        if n > max {
            return Err(DecodeError::TooLong(what, n, max));
        }
        self.bytes(n, what)
    }

    /// A u32-length-prefixed byte string of at most `max` bytes.
    pub fn long_bytes(&mut self, max: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(DecodeError::TooLong(what, n, max));
        }
        self.bytes(n, what)
    }

    /// A u16 count of items, each needing at least `min_item` bytes; checked
    /// against `max` and against the bytes left, so a forged count cannot make
    /// the caller allocate.
    pub fn count(&mut self, max: usize, min_item: usize, what: &'static str) -> Result<usize, DecodeError> {
        let n = self.u16(what)? as usize;
        if n > max {
            return Err(DecodeError::TooLong(what, n, max));
        }
        if n.saturating_mul(min_item.max(1)) > self.buf.len() {
            return Err(DecodeError::Truncated(what));
        }
        Ok(n)
    }

    /// Fails if bytes remain.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(self.buf.len()))
        }
    }
}

/// Appends fields to a byte vector (the mirror of [`Reader`]).
#[derive(Default)]
pub struct Writer {
    /// The bytes written so far.
    pub buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// Big-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Big-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Big-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Raw bytes.
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
    /// u8-length-prefixed bytes (callers keep them under 256 bytes).
    pub fn short_bytes(&mut self, b: &[u8]) -> &mut Self {
        debug_assert!(b.len() <= u8::MAX as usize);
        self.u8(b.len() as u8).raw(b)
    }
    /// u32-length-prefixed bytes.
    pub fn long_bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32).raw(b)
    }
    /// A u16 item count.
    pub fn count(&mut self, n: usize) -> &mut Self {
        self.u16(n as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut w = Writer::new();
        w.u8(7).u16(300).u32(70_000).u64(1 << 40).short_bytes(b"abc").long_bytes(b"xyz").count(2);
        let bytes = w.buf.clone();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u8("a").unwrap(), 7);
        assert_eq!(r.u16("b").unwrap(), 300);
        assert_eq!(r.u32("c").unwrap(), 70_000);
        assert_eq!(r.u64("d").unwrap(), 1 << 40);
        assert_eq!(r.short_bytes(3, "e").unwrap(), b"abc");
        assert_eq!(r.long_bytes(3, "f").unwrap(), b"xyz");
        // A count of 2 with nothing behind it is a truncation, not an allocation.
        assert_eq!(r.count(10, 1, "g"), Err(DecodeError::Truncated("g")));
        for cut in 0..bytes.len() - 2 {
            let mut r = Reader::new(&bytes[..cut]);
            let res = (|| -> Result<(), DecodeError> {
                r.u8("a")?;
                r.u16("b")?;
                r.u32("c")?;
                r.u64("d")?;
                r.short_bytes(3, "e")?;
                r.long_bytes(3, "f")?;
                Ok(())
            })();
            assert!(res.is_err(), "cut at {cut}");
        }
        let mut r = Reader::new(&bytes[15..]);
        assert_eq!(r.short_bytes(2, "e"), Err(DecodeError::TooLong("e", 3, 2)));
    }
}
