//! The gRPC codec of both services: prost's, except that bytes which do not decode as the
//! RPC's message answer INVALID_ARGUMENT with the decoder's reason.
//!
//! tonic-prost maps every decode error to INTERNAL, and docs/api.md says INTERNAL means a bug
//! in the broker. Invalid UTF-8 in a string field, a bad varint, a truncated field or tables
//! nested past prost's recursion limit are the client's bad request, so the one place that
//! decodes requests says so. Set for the generated code by `build.rs` (`codec_path`), so it
//! covers unary calls and every message of a stream alike.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// prost's encoding; decode errors are INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct ProtoCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        ProtoCodec(PhantomData)
    }
}

impl<T, U> Codec for ProtoCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProtoDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder(PhantomData)
    }
}

/// Decodes `U`; bytes that are not a `U` are INVALID_ARGUMENT.
#[derive(Debug)]
pub struct ProtoDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for ProtoDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| {
            Status::invalid_argument(format!("request: does not decode as a message: {e}"))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
