//! [`WatchCodec`]: the `Watch` method's codec. Requests are decoded as
//! prost decodes them; replies arrive encoded already and are copied into
//! the frame as they are.

use bytes::{BufMut, Bytes};
use latchkey_proto::v1;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

/// Encoded `WatchReply`s out, `WatchRequest`s in.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct WatchCodec;

/// Writes an encoded message as it is.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Encoded;

impl Encoder for Encoded {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Codec for WatchCodec {
    type Encode = Bytes;
    type Decode = v1::WatchRequest;
    type Encoder = Encoded;
    type Decoder = ProstDecoder<v1::WatchRequest>;

    fn encoder(&mut self) -> Encoded {
        Encoded
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}
