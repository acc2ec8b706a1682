//! The body of an error response: a message for people, then typed details for
//! programs. Each detail is `tag: u16, length: u16, value`, so a reader takes the tags
//! it knows and skips the rest: a node may add details that older clients never see.

use crate::wire::{WireError, WireReader, WireWrite};

/// Tag of [`ErrorDetail::Leader`].
const TAG_LEADER: u16 = 1;
/// Tag of [`ErrorDetail::ExpectedRequest`].
const TAG_EXPECTED_REQUEST: u16 = 2;
/// Tag of [`ErrorDetail::LastRequest`].
const TAG_LAST_REQUEST: u16 = 3;

/// What an error says besides its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorDetail {
    /// `NotLeader`: the member that leads what was asked (a partition, the consumer
    /// groups), as the answering member knows it; `client_addr` is where clients reach it.
    Leader {
        /// Its node id.
        node_id: u8,
        /// Its client address (`host:port`).
        client_addr: String,
    },
    /// `RequestOutOfOrder`: the request number the partition takes next from the
    /// session.
    ExpectedRequest {
        /// That number.
        request: u32,
    },
    /// `DuplicateRequest`: the session's last request the partition applied.
    LastRequest {
        /// Its number.
        request: u32,
    },
}

impl ErrorDetail {
    fn encode(&self, out: &mut Vec<u8>) {
        let mut value = Vec::new();
        let tag = match self {
            Self::Leader {
                node_id,
                client_addr,
            } => {
                value.put_u8_be(*node_id);
                value.put_string(client_addr);
                TAG_LEADER
            }
            Self::ExpectedRequest { request } => {
                value.put_u32_be(*request);
                TAG_EXPECTED_REQUEST
            }
            Self::LastRequest { request } => {
                value.put_u32_be(*request);
                TAG_LAST_REQUEST
            }
        };
        // A detail longer than its length field can say is not sent (none is: each is
        // a few fields of short strings).
        let Ok(len) = u16::try_from(value.len()) else {
            return;
        };
        out.put_u16_be(tag);
        out.put_u16_be(len);
        out.extend_from_slice(&value);
    }

    /// The detail `tag` with `value`, or `None` for a tag this reader does not know.
    fn decode(tag: u16, value: &[u8]) -> Result<Option<Self>, WireError> {
        let mut r = WireReader::new(value);
        let detail = match tag {
            TAG_LEADER => Self::Leader {
                node_id: r.u8("leader_node_id")?,
                client_addr: r.string("leader_client_addr")?.to_owned(),
            },
            TAG_EXPECTED_REQUEST => Self::ExpectedRequest {
                request: r.u32("expected_request")?,
            },
            TAG_LAST_REQUEST => Self::LastRequest {
                request: r.u32("last_request")?,
            },
            _ => return Ok(None),
        };
        r.finish()?;
        Ok(Some(detail))
    }
}

/// An error response's body, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorBody {
    /// What happened, for people.
    pub message: String,
    /// The details this reader knows, in the order sent.
    pub details: Vec<ErrorDetail>,
}

impl ErrorBody {
    /// Appends the body: the message, then each detail.
    pub fn encode(message: &str, details: &[ErrorDetail], out: &mut Vec<u8>) {
        out.put_string(message);
        for detail in details {
            detail.encode(out);
        }
    }

    /// Decodes a body, skipping details of tags this reader does not know.
    ///
    /// # Errors
    /// A [`WireError`]: the message or a detail cut short, or a known detail whose
    /// value does not decode.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let mut r = WireReader::new(body);
        let message = r.string("message")?.to_owned();
        let mut details = Vec::new();
        while r.remaining() > 0 {
            let tag = r.u16("detail_tag")?;
            let len = r.u16("detail_length")?;
            let value = r.take(usize::from(len), "detail_value")?;
            details.extend(ErrorDetail::decode(tag, value)?);
        }
        Ok(Self { message, details })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader() -> ErrorDetail {
        ErrorDetail::Leader {
            node_id: 2,
            client_addr: "127.0.0.1:7072".into(),
        }
    }

    #[test]
    fn a_body_round_trips_and_unknown_details_are_skipped() {
        let mut body = Vec::new();
        let details = [
            leader(),
            ErrorDetail::ExpectedRequest { request: 7 },
            ErrorDetail::LastRequest { request: u32::MAX },
        ];
        ErrorBody::encode("node 1 does not lead it", &details, &mut body);
        let decoded = ErrorBody::decode(&body).unwrap();
        assert_eq!(decoded.message, "node 1 does not lead it");
        assert_eq!(decoded.details, details);
        // A newer node's detail (tag 900) between and after: skipped, the rest read.
        let mut newer = Vec::new();
        newer.put_string("m");
        newer.put_u16_be(900);
        newer.put_u16_be(3);
        newer.extend_from_slice(b"xyz");
        leader().encode(&mut newer);
        newer.put_u16_be(901);
        newer.put_u16_be(0);
        let decoded = ErrorBody::decode(&newer).unwrap();
        assert_eq!(decoded.details, vec![leader()]);
        // A message alone (every node before details) is a body with none.
        let mut plain = Vec::new();
        plain.put_string("just words");
        assert_eq!(ErrorBody::decode(&plain).unwrap().details, vec![]);
    }

    #[test]
    fn a_body_cut_anywhere_or_lying_about_a_length_is_refused() {
        let mut body = Vec::new();
        ErrorBody::encode("m", &[leader()], &mut body);
        // Cuts inside the message or a detail are errors; a cut between them is a
        // shorter, valid body.
        for cut in 0..body.len() {
            let valid = cut == 3;
            assert_eq!(
                ErrorBody::decode(&body[..cut]).is_ok(),
                valid,
                "cut at {cut}"
            );
        }
        let mut lying = Vec::new();
        lying.put_string("m");
        lying.put_u16_be(TAG_LEADER);
        lying.put_u16_be(200);
        lying.extend_from_slice(&[1, 0, 0]);
        assert!(ErrorBody::decode(&lying).is_err());
        // A known tag whose value has bytes left over is refused too.
        let mut long = Vec::new();
        long.put_string("m");
        long.put_u16_be(TAG_LEADER);
        long.put_u16_be(4);
        long.extend_from_slice(&[1, 0, 0, 9]);
        assert!(ErrorBody::decode(&long).is_err());
    }
}
