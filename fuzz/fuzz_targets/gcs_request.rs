//! The client request decoder of the gcs wire format: any bytes give a value
//! or an error, and whatever decodes re-encodes to the same frame.
#![no_main]

use bytes::{Bytes, BytesMut};
use conclave_gcs::wire::{decode_request, encode_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = decode_request(Bytes::copy_from_slice(data)) {
        let mut out = BytesMut::new();
        encode_request(&req, &mut out);
        assert_eq!(&out[4..], data);
    }
});
