//! The secure layer's payload decoders, through `parse_payload` (the pure
//! parsing steps a session runs on every payload it receives: the tag, a
//! data message's header and its opening under fixed public keys, the
//! certificate message and the certificate, the timeout and refusal notices,
//! the policy codes and the key agreement envelope): any bytes give a value
//! or an error, and a decoded data header is exactly the bytes after the tag.
#![no_main]

use conclave_secure::payload::{parse_payload, ParsedPayload};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ParsedPayload::Data { header, .. }) = parse_payload(data) {
        let mut enc = Vec::new();
        header.encode(&mut enc);
        assert!(data[1..].starts_with(&enc));
    }
});
