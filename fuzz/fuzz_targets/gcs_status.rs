//! The decoder of the daemon's answer to a status request (a status report
//! or an error frame): any bytes give a value or an error, and whatever
//! decodes re-encodes to the same frame.
#![no_main]

use bytes::{Bytes, BytesMut};
use conclave_gcs::wire::{decode_status_reply, encode_status_reply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reply) = decode_status_reply(Bytes::copy_from_slice(data)) {
        let mut out = BytesMut::new();
        encode_status_reply(&reply, &mut out);
        assert_eq!(&out[4..], data);
    }
});
