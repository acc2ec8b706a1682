//! Arbitrary bytes as a stream of client frames: framing, header split and body decode
//! must return errors, never panic; what decodes must re-encode to the same frame.
#![no_main]

use braid_proto::client::{
    frame_length, split_request, split_response, Command, Request, Response, REQUEST_HEADER_BYTES,
    RESPONSE_HEADER_BYTES,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some(total)) = frame_length(rest, REQUEST_HEADER_BYTES, 1 << 20) {
        let frame = &rest[..total];
        if let Ok((header, body)) = split_request(frame) {
            if let Some(command) = Command::from_u16(header.command) {
                if let Ok(request) = Request::decode(command, body) {
                    let mut again = Vec::new();
                    request.encode(header.request_id, &mut again);
                    assert_eq!(again, frame, "a decoded request re-encodes to its frame");
                }
            }
        }
        rest = &rest[total..];
    }
    if let Ok(Some(total)) = frame_length(data, RESPONSE_HEADER_BYTES, 1 << 20) {
        if let Ok((header, body)) = split_response(&data[..total]) {
            if let Some(command) = Command::from_u16(header.command) {
                let _ = Response::decode(command, body);
            }
        }
    }
});
