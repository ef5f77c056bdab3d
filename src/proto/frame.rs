//! Kafka framing: the i32 length prefix, request and response headers.
//!
//! A request frame is `len: i32 | RequestHeader | body`; a response frame is
//! `len: i32 | ResponseHeader | body`. The response header begins with the correlation id in
//! every version, so the IO layer can route a frame by [`correlation_id`] before anyone knows
//! how to decode the rest. See <https://kafka.apache.org/protocol#protocol_common>.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

use crate::error::ProtocolViolation;
use crate::proto::guard;

/// Size of the length prefix.
pub(crate) const LENGTH_PREFIX: usize = 4;

/// Checks a frame's length prefix against the configured maximum, before anything is allocated.
pub(crate) fn check_length(prefix: i32, max: usize) -> Result<usize, ProtocolViolation> {
    let Ok(len) = usize::try_from(prefix) else {
        return Err(ProtocolViolation::NegativeLength(prefix));
    };
    if len > max {
        return Err(ProtocolViolation::FrameTooLarge {
            claimed: prefix,
            max,
        });
    }
    Ok(len)
}

/// The correlation id at the start of a response frame (length prefix already removed).
pub(crate) fn correlation_id(frame: &[u8]) -> Result<i32, ProtocolViolation> {
    match frame.first_chunk::<4>() {
        Some(b) => Ok(i32::from_be_bytes(*b)),
        None => Err(ProtocolViolation::ShortFrame(frame.len())),
    }
}

/// Appends one whole request frame (length prefix included) to `buf`.
pub(crate) fn encode_request<R: Request>(
    buf: &mut BytesMut,
    request: &R,
    version: i16,
    correlation_id: i32,
    client_id: &StrBytes,
) -> anyhow::Result<()> {
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(client_id.clone()));
    let header_version = R::header_version(version);
    let size = header.compute_size(header_version)? + request.compute_size(version)?;
    let prefix = i32::try_from(size)?;
    buf.reserve(LENGTH_PREFIX + size);
    buf.put_i32(prefix);
    let start = buf.len();
    header.encode(buf, header_version)?;
    request.encode(buf, version)?;
    anyhow::ensure!(
        buf.len() - start == size,
        "encoded size {} differs from computed size {size}",
        buf.len() - start
    );
    Ok(())
}

/// Why a response frame did not decode.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// The structural check refused the body before it was decoded (see [`guard`]).
    Violation(ProtocolViolation),
    /// kafka-protocol's decoder refused it.
    Decode(anyhow::Error),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Violation(v) => write!(f, "{v}"),
            Self::Decode(e) => write!(f, "{e:#}"),
        }
    }
}

/// Decodes a response frame (length prefix removed) for request type `R` at `version`.
///
/// The body is checked by [`guard::check_response`] first, so kafka-protocol never sees an
/// array count or length that cannot fit in the frame. Trailing bytes after the body are
/// tolerated, as the Java client does: a newer broker may append fields an older decoder does
/// not know.
pub(crate) fn decode_response<R: Request>(
    mut frame: Bytes,
    version: i16,
) -> Result<R::Response, DecodeError> {
    let header_version = <R::Response as HeaderVersion>::header_version(version);
    let total = frame.len();
    let _header =
        ResponseHeader::decode(&mut frame, header_version).map_err(DecodeError::Decode)?;
    let offset = total - frame.len();
    decode_body::<R::Response>(api_key::<R>(), frame, version, offset)
}

/// Checks and decodes a response body of `api` at `version`; `offset` is where the body starts
/// in its frame (for error messages).
pub(crate) fn decode_body<T: Decodable>(
    api: ApiKey,
    mut body: Bytes,
    version: i16,
    offset: usize,
) -> Result<T, DecodeError> {
    guard::check_response(api, version, &body, offset).map_err(DecodeError::Violation)?;
    T::decode(&mut body, version).map_err(DecodeError::Decode)
}

/// The ApiVersions v0 body of a KIP-511 fallback answer (see
/// [`peek_error_code_after_v0_header`]), checked and decoded.
pub(crate) fn decode_api_versions_fallback(
    frame: &Bytes,
) -> Result<ApiVersionsResponse, DecodeError> {
    let body = frame.slice(frame.len().min(4)..);
    decode_body(ApiKey::ApiVersions, body, 0, 4)
}

/// The API of a request type (every `Request` type's key is a known API).
pub(crate) fn api_key<R: Request>() -> ApiKey {
    ApiKey::try_from(R::KEY).unwrap_or(ApiKey::ApiVersions)
}

/// The error code at the start of a response body, after a v0 response header: used to detect
/// the ApiVersions fallback (KIP-511), where the broker answers in v0 whatever was asked.
pub(crate) fn peek_error_code_after_v0_header(frame: &Bytes) -> Option<i16> {
    let mut b = frame.get(4..6)?;
    Some(b.get_i16())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest, RequestHeader};

    #[test]
    fn length_checks() {
        assert_eq!(check_length(10, 100), Ok(10));
        assert_eq!(check_length(100, 100), Ok(100));
        assert_eq!(
            check_length(101, 100),
            Err(ProtocolViolation::FrameTooLarge {
                claimed: 101,
                max: 100
            })
        );
        assert_eq!(
            check_length(-1, 100),
            Err(ProtocolViolation::NegativeLength(-1))
        );
        assert!(check_length(i32::MAX, 100 << 20).is_err());
    }

    #[test]
    fn correlation_id_of_short_frames() {
        assert_eq!(
            correlation_id(&[0, 0, 1]),
            Err(ProtocolViolation::ShortFrame(3))
        );
        assert_eq!(correlation_id(&[0, 0, 1, 2, 9]), Ok(258));
    }

    #[test]
    fn request_frame_round_trips() {
        let client = StrBytes::from_static_str("t");
        for (version, req) in [
            (4, ApiVersionsRequest::default()),
            (0, ApiVersionsRequest::default()),
        ] {
            let mut buf = BytesMut::new();
            encode_request(&mut buf, &req, version, 77, &client).unwrap();
            let mut frame = buf.freeze();
            let len = frame.get_i32() as usize;
            assert_eq!(len, frame.len());
            let hv = ApiVersionsRequest::header_version(version);
            let header = RequestHeader::decode(&mut frame, hv).unwrap();
            assert_eq!(header.correlation_id, 77);
            assert_eq!(header.request_api_version, version);
            assert_eq!(header.client_id.as_deref(), Some("t"));
        }
        let mut buf = BytesMut::new();
        encode_request(&mut buf, &MetadataRequest::default(), 12, 1, &client).unwrap();
        assert!(buf.len() > 8);
    }
}
