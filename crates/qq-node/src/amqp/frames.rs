//! AMQP 0-9-1 frames on a byte stream. `amq-protocol` parses every frame and generates every
//! frame but a body frame (written here, [`body_frame`], to spare a copy of each delivered
//! body); this file bounds what is buffered and names what went wrong.
//!
//! Bounds: a frame's declared size is read from its 7-byte header and checked against the
//! negotiated `frame_max` before its payload is buffered, so a peer can make the reader hold
//! at most one frame of `frame_max` bytes (plus one read's worth). A frame that does not parse
//! is a connection error with RabbitMQ's code: 501 FRAME_ERROR for bad framing (unknown frame
//! type, missing frame-end octet, oversized frame), 540 NOT_IMPLEMENTED for a class or method
//! AMQP 0-9-1 does not have, 501 too for a known method whose arguments do not decode (as
//! RabbitMQ), 502 SYNTAX_ERROR for a method frame too short to name its method.
//!
//! One argument the codec parses but does not keep is read here from the payload: basic.qos's
//! `prefetch_size`. A non-zero one is RabbitMQ's 540 `prefetch_size!=0 (N)`; the frame comes
//! back with that refusal ([`ReadError::Refused`]) for its channel to answer in turn (an
//! unopened channel is still 504, a closing one still ignores it).

use amq_protocol::frame::{AMQPContentHeader, AMQPFrame, WriteContext, gen_frame, parse_frame};
use amq_protocol::protocol::constants::{
    FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
};
use amq_protocol::protocol::{AMQPClass, basic};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::codes::{AmqpError, ConnError, FRAME_ERROR, NOT_IMPLEMENTED, SYNTAX_ERROR};

/// Type, channel and size octets before a frame's payload.
const HEADER_LEN: usize = 7;
/// Header plus the frame-end octet.
pub const FRAME_OVERHEAD: usize = HEADER_LEN + 1;

/// Why no frame was read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the socket (or it failed).
    Closed,
    /// A frame that is not AMQP 0-9-1: close the connection with this.
    Bad(ConnError),
    /// A well-formed method refused for an argument the codec does not keep: its channel
    /// answers the frame with this error instead of running it.
    Refused(AMQPFrame, AmqpError),
}

impl From<std::io::Error> for ReadError {
    fn from(_: std::io::Error) -> Self {
        ReadError::Closed
    }
}

/// Reads frames of at most `frame_max` bytes from `io`. The buffer gives up a frame's bytes
/// in O(1) (`BytesMut::advance`) rather than moving what follows to the front: a pipelining
/// peer fills it with many frames at once.
pub struct FrameReader<R> {
    io: R,
    buf: BytesMut,
    frame_max: u32,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(io: R, frame_max: u32) -> Self {
        FrameReader {
            io,
            buf: BytesMut::with_capacity(8192),
            frame_max,
        }
    }

    /// The bound once connection.tune-ok settled it.
    pub fn set_frame_max(&mut self, frame_max: u32) {
        self.frame_max = frame_max;
    }

    /// The 8-octet protocol header a connection starts with (`None`: the peer closed first).
    pub async fn protocol_header(&mut self) -> Option<[u8; 8]> {
        while self.buf.len() < 8 {
            if self.fill().await.ok()? == 0 {
                return None;
            }
        }
        let mut header = [0u8; 8];
        header.copy_from_slice(&self.buf[..8]);
        self.buf.advance(8);
        Some(header)
    }

    /// The next frame if the buffer already holds it whole: no wait, no timer, no read.
    pub fn buffered(&mut self) -> Result<Option<AMQPFrame>, ReadError> {
        take_frame(&mut self.buf, self.frame_max)
    }

    /// The next frame.
    pub async fn next(&mut self) -> Result<AMQPFrame, ReadError> {
        loop {
            if let Some(frame) = take_frame(&mut self.buf, self.frame_max)? {
                return Ok(frame);
            }
            if self.fill().await? == 0 {
                return Err(ReadError::Closed);
            }
        }
    }

    async fn fill(&mut self) -> std::io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(8192);
        }
        self.io.read_buf(&mut self.buf).await
    }
}

/// One whole frame off the front of `buf`, if it holds one; `Err` when what it holds cannot
/// be a valid frame within `frame_max`.
pub fn take_frame(buf: &mut BytesMut, frame_max: u32) -> Result<Option<AMQPFrame>, ReadError> {
    let bad = |code, text: String| Err(ReadError::Bad(ConnError::new(code, text)));
    let Some(&kind) = buf.first() else {
        return Ok(None);
    };
    if ![FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT].contains(&kind) {
        return bad(FRAME_ERROR, format!("unknown frame type {kind}"));
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]) as u64;
    if size + FRAME_OVERHEAD as u64 > frame_max as u64 {
        return bad(
            FRAME_ERROR,
            format!(
                "frame of {} bytes is larger than frame_max {frame_max}",
                size + FRAME_OVERHEAD as u64
            ),
        );
    }
    let total = size as usize + FRAME_OVERHEAD;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    if buf[total - 1] != FRAME_END {
        return bad(
            FRAME_ERROR,
            format!(
                "frame end octet is {}, expected {FRAME_END}",
                buf[total - 1]
            ),
        );
    }
    let parsed = match parse_frame(&buf[..total]) {
        Ok((rest, frame)) if rest.is_empty() => match refusal(&frame, &buf[HEADER_LEN..]) {
            Some(e) => Err(ReadError::Refused(frame, e)),
            None => Ok(frame),
        },
        _ => Err(ReadError::Bad(undecodable(
            kind,
            &buf[HEADER_LEN..total - 1],
        ))),
    };
    buf.advance(total);
    parsed.map(Some)
}

/// RabbitMQ's refusal of a parsed method for an argument the codec dropped: basic.qos with a
/// non-zero `prefetch_size` (its first argument, after the class and method ids) is 540
/// (rabbit_channel: `prefetch_size!=0 (N)`).
fn refusal(frame: &AMQPFrame, payload: &[u8]) -> Option<AmqpError> {
    let AMQPFrame::Method(_, AMQPClass::Basic(basic::AMQPMethod::Qos(_))) = frame else {
        return None;
    };
    let size = u32::from_be_bytes(payload.get(4..8)?.try_into().ok()?);
    (size != 0).then(|| AmqpError::new(NOT_IMPLEMENTED, format!("prefetch_size!=0 ({size})")))
}

/// What to answer for a well-framed payload that does not decode.
fn undecodable(kind: u8, payload: &[u8]) -> ConnError {
    if kind != FRAME_METHOD || payload.len() < 4 {
        return ConnError::new(
            if kind == FRAME_METHOD {
                SYNTAX_ERROR
            } else {
                FRAME_ERROR
            },
            format!("malformed frame of type {kind}"),
        );
    }
    let class = u16::from_be_bytes([payload[0], payload[1]]);
    let method = u16::from_be_bytes([payload[2], payload[3]]);
    if known_method(class, method) {
        // RabbitMQ answers a method whose arguments are cut short with a frame error.
        ConnError::new(
            FRAME_ERROR,
            format!("method {class}.{method}: arguments do not decode"),
        )
    } else {
        ConnError::new(
            NOT_IMPLEMENTED,
            format!("unknown class or method {class}.{method}"),
        )
    }
}

/// Whether `class.method` is a method of AMQP 0-9-1 (with RabbitMQ's extensions).
fn known_method(class: u16, method: u16) -> bool {
    let methods: &[u16] = match class {
        10 => &[10, 11, 20, 21, 30, 31, 40, 41, 50, 51, 60, 61, 70, 71],
        20 => &[10, 11, 20, 21, 40, 41],
        30 => &[10, 11],
        40 => &[10, 11, 20, 21, 30, 31, 40, 51],
        50 => &[10, 11, 20, 21, 30, 31, 40, 41, 50, 51],
        60 => &[
            10, 11, 20, 21, 30, 31, 40, 50, 60, 70, 71, 72, 80, 90, 100, 110, 111, 120,
        ],
        85 => &[10, 11],
        90 => &[10, 11, 20, 21, 30, 31],
        _ => &[],
    };
    methods.contains(&method)
}

/// A delivery's or a return's frames: the method, the content header, the body in frames of
/// at most frame_max.
pub fn content_frames(
    channel: u16,
    method: AMQPClass,
    properties: basic::AMQPProperties,
    body: &[u8],
    frame_max: u32,
) -> Vec<u8> {
    let chunk = (frame_max as usize).saturating_sub(FRAME_OVERHEAD).max(1);
    // The body, its frames' overhead, and room for the method and the content header.
    let frames = body.len().div_ceil(chunk);
    let mut out = Vec::with_capacity(body.len() + frames * FRAME_OVERHEAD + 256);
    encode(&AMQPFrame::Method(channel, method), &mut out);
    let header = AMQPContentHeader {
        class_id: 60,
        body_size: body.len() as u64,
        properties,
    };
    encode(&AMQPFrame::Header(channel, header), &mut out);
    for part in body.chunks(chunk) {
        body_frame(channel, part, &mut out);
    }
    out
}

/// Appends a body frame of `part`. Written here rather than by the codec, which takes the
/// part as an owned `Vec`: that would be one more copy of every delivered body. The layout is
/// the codec's (`a_body_frame_is_the_codecs` checks it).
fn body_frame(channel: u16, part: &[u8], out: &mut Vec<u8>) {
    out.push(FRAME_BODY);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&(part.len() as u32).to_be_bytes());
    out.extend_from_slice(part);
    out.push(FRAME_END);
}

/// Appends `frame`'s bytes to `out`.
pub fn encode(frame: &AMQPFrame, out: &mut Vec<u8>) {
    let buf = std::mem::take(out);
    match gen_frame(frame)(WriteContext::from(buf)) {
        Ok(ctx) => *out = ctx.into_inner().0,
        // Writing into a Vec cannot run out of room; a frame we built that does not encode
        // is a bug, and the bytes of that frame are dropped rather than sent half-made.
        Err(e) => tracing::error!("amqp: frame does not encode: {e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::protocol::{AMQPClass, queue};
    use proptest::prelude::*;

    fn declare_frame() -> Vec<u8> {
        let frame = AMQPFrame::Method(
            1,
            AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
                queue: "q".into(),
                passive: false,
                durable: true,
                exclusive: false,
                auto_delete: false,
                nowait: false,
                arguments: Default::default(),
            })),
        );
        let mut out = Vec::new();
        encode(&frame, &mut out);
        out
    }

    fn code_of(r: Result<Option<AMQPFrame>, ReadError>) -> Option<u16> {
        match r {
            Err(ReadError::Bad(e)) => Some(e.code),
            _ => None,
        }
    }

    #[test]
    fn a_whole_frame_parses_and_a_partial_one_waits() {
        let bytes = declare_frame();
        let mut buf = BytesMut::from(&bytes[..bytes.len() - 1]);
        assert!(matches!(take_frame(&mut buf, 131_072), Ok(None)));
        buf.extend_from_slice(&bytes[bytes.len() - 1..]);
        assert!(matches!(
            take_frame(&mut buf, 131_072),
            Ok(Some(AMQPFrame::Method(1, _)))
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn a_body_frame_is_the_codecs() {
        for part in [&b""[..], b"x", &[7u8; 300]] {
            let mut ours = Vec::new();
            body_frame(513, part, &mut ours);
            let mut codec = Vec::new();
            encode(&AMQPFrame::Body(513, part.to_vec()), &mut codec);
            assert_eq!(ours, codec);
        }
        // Split at frame_max: each frame whole, and the parts join to the body.
        let body: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let method = AMQPClass::Basic(basic::AMQPMethod::Deliver(basic::Deliver {
            consumer_tag: "c".into(),
            delivery_tag: 1,
            redelivered: false,
            exchange: "".into(),
            routing_key: "q".into(),
        }));
        let bytes = content_frames(2, method, Default::default(), &body, 300);
        let mut buf = BytesMut::from(&bytes[..]);
        let mut joined = Vec::new();
        while let Some(frame) = take_frame(&mut buf, 300).unwrap() {
            if let AMQPFrame::Body(2, part) = frame {
                assert!(part.len() + FRAME_OVERHEAD <= 300);
                joined.extend(part);
            }
        }
        assert_eq!(joined, body);
    }

    #[test]
    fn bad_framing_gets_rabbitmqs_codes() {
        let bytes = declare_frame();
        // Oversized: declared before the payload arrives.
        let mut buf = BytesMut::from(&bytes[..HEADER_LEN]);
        assert_eq!(code_of(take_frame(&mut buf, 16)), Some(FRAME_ERROR));
        let mut buf = BytesMut::from(&bytes[..]);
        *buf.last_mut().unwrap() = 0;
        assert_eq!(code_of(take_frame(&mut buf, 131_072)), Some(FRAME_ERROR));
        let mut buf = BytesMut::from(&bytes[..]);
        buf[0] = 9;
        assert_eq!(code_of(take_frame(&mut buf, 131_072)), Some(FRAME_ERROR));
        // Class 50 method 99 does not exist.
        let mut buf = BytesMut::from(&bytes[..]);
        buf[HEADER_LEN + 3] = 99;
        assert_eq!(
            code_of(take_frame(&mut buf, 131_072)),
            Some(NOT_IMPLEMENTED)
        );
        // queue.declare cut short inside its arguments (sizes adjusted): frame error.
        let mut buf = BytesMut::from(&bytes[..]);
        let payload = bytes.len() - FRAME_OVERHEAD;
        buf.truncate(HEADER_LEN + 6);
        buf.extend_from_slice(&[FRAME_END]);
        buf[3..7].copy_from_slice(&6u32.to_be_bytes());
        assert!(payload > 6);
        assert_eq!(code_of(take_frame(&mut buf, 131_072)), Some(FRAME_ERROR));
    }

    #[test]
    fn qos_with_a_prefetch_size_is_refused_with_540() {
        let qos = AMQPFrame::Method(
            3,
            AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
                prefetch_count: 10,
                global: false,
            })),
        );
        let mut bytes = Vec::new();
        encode(&qos, &mut bytes);
        let mut buf = BytesMut::from(&bytes[..]);
        assert!(matches!(
            take_frame(&mut buf, 131_072),
            Ok(Some(AMQPFrame::Method(3, _)))
        ));
        // prefetch_size: the four octets after the class and method ids.
        let mut buf = BytesMut::from(&bytes[..]);
        buf[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&1000u32.to_be_bytes());
        match take_frame(&mut buf, 131_072) {
            Err(ReadError::Refused(AMQPFrame::Method(3, _), e)) => {
                assert_eq!(e.code, NOT_IMPLEMENTED);
                assert_eq!(e.reply_text(), "NOT_IMPLEMENTED - prefetch_size!=0 (1000)");
            }
            other => panic!("{other:?}"),
        }
        assert!(buf.is_empty());
    }

    proptest! {
        /// Whatever the bytes, the reader answers a frame, "need more", or a connection error;
        /// it never panics and never holds more than one frame's worth past frame_max.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut buf = BytesMut::from(&bytes[..]);
            for _ in 0..64 {
                match take_frame(&mut buf, 4096) {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
        }

        /// A valid frame with bytes flipped: parsed, refused with a code, or waiting; never a
        /// panic.
        #[test]
        fn mutated_frames_never_panic(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let mut buf = BytesMut::from(&declare_frame()[..]);
            for (at, byte) in flips {
                let i = at.index(buf.len());
                buf[i] = byte;
            }
            let r = take_frame(&mut buf, 131_072);
            if let Err(ReadError::Bad(e)) = &r {
                prop_assert!([FRAME_ERROR, SYNTAX_ERROR, NOT_IMPLEMENTED].contains(&e.code));
            }
        }
    }
}
