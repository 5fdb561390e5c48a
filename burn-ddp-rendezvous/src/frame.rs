//! Length-prefixed frames and a tiny field codec for the store's wire protocol.
//!
//! A frame is a little-endian `u32` length followed by that many bytes. The
//! reader refuses frames above a maximum so a confused or hostile peer cannot make
//! us allocate gigabytes.

use std::io::{self, Read, Write};

/// Largest frame the store accepts (values are addresses and ids, not tensors).
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// Writes one frame.
pub fn write_frame(stream: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "frame of {} bytes exceeds the {MAX_FRAME_BYTES}-byte limit",
                payload.len()
            ),
        ));
    }
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    stream.write_all(&buf)
}

/// Reads one frame; `Ok(None)` when the peer closed the connection cleanly before it.
pub fn read_frame(stream: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(err) => return Err(err),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("peer sent a frame of {len} bytes, above the {MAX_FRAME_BYTES}-byte limit"),
        ));
    }
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload)?;
    Ok(Some(payload))
}

/// Appends typed fields to a frame payload.
#[derive(Default)]
pub struct FieldWriter {
    buf: Vec<u8>,
}

impl FieldWriter {
    /// Starts a payload with a one-byte tag (a command or a status).
    pub fn new(tag: u8) -> Self {
        Self { buf: vec![tag] }
    }

    /// Appends a length-prefixed byte string.
    pub fn bytes(mut self, value: &[u8]) -> Self {
        self.buf
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(value);
        self
    }

    /// Appends a signed 64-bit integer.
    pub fn i64(mut self, value: i64) -> Self {
        self.buf.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Appends an unsigned 64-bit integer.
    pub fn u64(mut self, value: u64) -> Self {
        self.buf.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// The finished payload.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads typed fields back, failing (not panicking) on truncated input.
pub struct FieldReader<'a> {
    buf: &'a [u8],
}

impl<'a> FieldReader<'a> {
    /// Splits off the leading tag.
    pub fn new(payload: &'a [u8]) -> io::Result<(u8, Self)> {
        match payload.split_first() {
            Some((tag, rest)) => Ok((*tag, Self { buf: rest })),
            None => Err(invalid("empty message")),
        }
    }

    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(invalid("truncated message"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// Reads a length-prefixed byte string.
    pub fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().unwrap()) as usize;
        self.take(len)
    }

    /// Reads a length-prefixed UTF-8 string.
    pub fn string(&mut self) -> io::Result<&'a str> {
        std::str::from_utf8(self.bytes()?).map_err(|_| invalid("key is not UTF-8"))
    }

    /// Reads a signed 64-bit integer.
    pub fn i64(&mut self) -> io::Result<i64> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    /// Reads an unsigned 64-bit integer.
    pub fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_clean_eof() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello").unwrap();
        write_frame(&mut wire, b"").unwrap();
        let mut cursor = io::Cursor::new(wire);
        assert_eq!(read_frame(&mut cursor).unwrap().unwrap(), b"hello");
        assert_eq!(read_frame(&mut cursor).unwrap().unwrap(), b"");
        assert!(read_frame(&mut cursor).unwrap().is_none());
    }

    #[test]
    fn oversized_frame_is_refused_before_allocating() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&((MAX_FRAME_BYTES as u32) + 1).to_le_bytes());
        let err = read_frame(&mut io::Cursor::new(wire)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("limit"), "{err}");
    }

    #[test]
    fn truncated_fields_are_errors() {
        let payload = FieldWriter::new(7).bytes(b"key").i64(-5).finish();
        let (tag, mut reader) = FieldReader::new(&payload).unwrap();
        assert_eq!(tag, 7);
        assert_eq!(reader.string().unwrap(), "key");
        assert_eq!(reader.i64().unwrap(), -5);
        assert!(reader.u64().is_err());
        let (_, mut short) = FieldReader::new(&payload[..5]).unwrap();
        assert!(short.bytes().is_err());
    }
}
