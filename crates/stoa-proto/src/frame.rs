//! The frame codec. Pure functions over byte slices; the network crate does the I/O.
//!
//! ```text
//!  0      2     3     4          12          16           20     24
//!  | magic | ver | kind | id (u64) | head_len  | payload_len | crc32c |
//!  then head_len bytes of bincode head, then payload_len bytes of payload
//! ```
//! All integers are little-endian. The CRC32C covers the first 20 header bytes, the head
//! and the payload.

use crate::PROTOCOL_VERSION;
use bincode::Options;
use bytes::{BufMut, BytesMut};
use serde::{de::DeserializeOwned, Serialize};

/// The two bytes every frame starts with: "ST".
const MAGIC: [u8; 2] = *b"ST";
/// Bytes of the fixed frame header.
pub const FRAME_HEADER_LEN: usize = 24;
/// Largest encoded message head we accept.
pub const HEAD_LEN_MAX: u32 = 16 * 1024 * 1024;
/// Largest bulk payload we accept: a whole chunk of the largest chunk size and some slack.
pub const PAYLOAD_LEN_MAX: u32 = 65 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request = 0,
    Reply = 1,
}

/// The parsed fixed header of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub id: u64,
    pub head_len: u32,
    pub payload_len: u32,
    crc: u32,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not a Stoa frame (bad magic {0:02x?}); is this port a Stoa server?")]
    BadMagic([u8; 2]),
    #[error("peer speaks protocol version {0}, this build speaks {PROTOCOL_VERSION}")]
    BadVersion(u8),
    #[error("bad frame kind {0}")]
    BadKind(u8),
    #[error("frame too large: head {head_len} bytes, payload {payload_len} bytes")]
    TooLarge { head_len: u32, payload_len: u32 },
    #[error("frame checksum mismatch")]
    Checksum,
    #[error("cannot decode message: {0}")]
    Decode(String),
    #[error("cannot encode message: {0}")]
    Encode(String),
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new().with_limit(u64::from(HEAD_LEN_MAX))
}

/// Encodes a whole frame except the payload, which the caller sends after it unchanged.
/// The CRC covers `payload` too, so it must be the bytes that follow.
pub fn encode_frame<T: Serialize>(
    kind: FrameKind,
    id: u64,
    head: &T,
    payload: &[u8],
) -> Result<BytesMut, FrameError> {
    let head = codec().serialize(head).map_err(|e| FrameError::Encode(e.to_string()))?;
    let head_len = u32::try_from(head.len()).unwrap_or(u32::MAX);
    let payload_len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    if head_len > HEAD_LEN_MAX || payload_len > PAYLOAD_LEN_MAX {
        return Err(FrameError::TooLarge { head_len, payload_len });
    }
    let mut buf = BytesMut::with_capacity(FRAME_HEADER_LEN + head.len());
    buf.put_slice(&MAGIC);
    buf.put_u8(PROTOCOL_VERSION);
    buf.put_u8(kind as u8);
    buf.put_u64_le(id);
    buf.put_u32_le(head_len);
    buf.put_u32_le(payload_len);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&buf[..20]), &head);
    let crc = crc32c::crc32c_append(crc, payload);
    buf.put_u32_le(crc);
    buf.put_slice(&head);
    Ok(buf)
}

impl FrameHeader {
    /// Parses and checks the fixed header; the CRC is checked later by [`decode_head`],
    /// once head and payload have arrived.
    pub fn parse(raw: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, FrameError> {
        if raw[0..2] != MAGIC {
            return Err(FrameError::BadMagic([raw[0], raw[1]]));
        }
        if raw[2] != PROTOCOL_VERSION {
            return Err(FrameError::BadVersion(raw[2]));
        }
        let kind = match raw[3] {
            0 => FrameKind::Request,
            1 => FrameKind::Reply,
            k => return Err(FrameError::BadKind(k)),
        };
        let le32 = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&raw[4..12]);
        let header = FrameHeader {
            kind,
            id: u64::from_le_bytes(id),
            head_len: le32(12),
            payload_len: le32(16),
            crc: le32(20),
        };
        if header.head_len > HEAD_LEN_MAX || header.payload_len > PAYLOAD_LEN_MAX {
            return Err(FrameError::TooLarge {
                head_len: header.head_len,
                payload_len: header.payload_len,
            });
        }
        Ok(header)
    }
}

/// Checks the frame's CRC over `raw_header`, `head` and `payload`, then decodes the head.
pub fn decode_head<T: DeserializeOwned>(
    header: &FrameHeader,
    raw_header: &[u8; FRAME_HEADER_LEN],
    head: &[u8],
    payload: &[u8],
) -> Result<T, FrameError> {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&raw_header[..20]), head);
    if crc32c::crc32c_append(crc, payload) != header.crc {
        return Err(FrameError::Checksum);
    }
    codec().deserialize(head).map_err(|e| FrameError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChunkOp, ChunkRequest, MetaOp, MetaRequest, Request};
    use stoa_types::{ChainId, ChunkId, InodeId, RequestId, SessionId, WriteId};

    fn split(frame: &[u8]) -> ([u8; FRAME_HEADER_LEN], &[u8]) {
        let mut raw = [0u8; FRAME_HEADER_LEN];
        raw.copy_from_slice(&frame[..FRAME_HEADER_LEN]);
        (raw, &frame[FRAME_HEADER_LEN..])
    }

    #[test]
    fn a_frame_round_trips() {
        let req = Request::Chunk(ChunkRequest {
            chain: ChainId(2),
            chain_version: 9,
            op: ChunkOp::Write {
                chunk: ChunkId { ino: InodeId(5), index: 1 },
                offset: 4096,
                version: None,
                id: Some(WriteId { session: SessionId(3), seq: 12 }),
                durable: true,
            },
            deadline_ms: 1_790_000_000_000,
        });
        let payload = vec![7u8; 10_000];
        let frame = encode_frame(FrameKind::Request, 77, &req, &payload).unwrap();
        let (raw, head) = split(&frame);
        let header = FrameHeader::parse(&raw).unwrap();
        assert_eq!(header.id, 77);
        assert_eq!(header.kind, FrameKind::Request);
        assert_eq!(header.payload_len, 10_000);
        let back: Request = decode_head(&header, &raw, head, &payload).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn corruption_is_detected() {
        let req = Request::Meta(MetaRequest {
            session: SessionId(1),
            req_id: RequestId(2),
            op: MetaOp::GetAttr { ino: InodeId(1) },
        });
        let frame = encode_frame(FrameKind::Request, 1, &req, b"data").unwrap();
        let (raw, head) = split(&frame);
        let header = FrameHeader::parse(&raw).unwrap();
        let err = decode_head::<Request>(&header, &raw, head, b"dato").unwrap_err();
        assert_eq!(err, FrameError::Checksum);

        let mut bad = raw;
        bad[0] = b'H';
        assert!(matches!(FrameHeader::parse(&bad), Err(FrameError::BadMagic(_))));
        let mut bad = raw;
        bad[2] = PROTOCOL_VERSION + 1;
        assert_eq!(FrameHeader::parse(&bad), Err(FrameError::BadVersion(PROTOCOL_VERSION + 1)));
        let mut bad = raw;
        bad[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(FrameHeader::parse(&bad), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn hostile_heads_are_refused_not_crashed_on() {
        // A header claiming a huge vector inside a small head must fail cleanly.
        let garbage = [0xffu8; 64];
        let frame = encode_frame(FrameKind::Request, 1, &(), &[]).unwrap();
        let (raw, _) = split(&frame);
        let mut header = FrameHeader::parse(&raw).unwrap();
        header.head_len = garbage.len() as u32;
        // Recompute nothing: the CRC check fails first, which is the point of it.
        assert!(decode_head::<Request>(&header, &raw, &garbage, &[]).is_err());
        // And with a matching CRC the decoder still refuses it.
        assert!(codec().deserialize::<Request>(&garbage).is_err());
    }
}
