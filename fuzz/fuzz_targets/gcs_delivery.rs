//! The daemon event decoder of the gcs wire format: any bytes give a value or
//! an error, and whatever decodes re-encodes to the same frame.
#![no_main]

use bytes::{Bytes, BytesMut};
use conclave_gcs::wire::{decode_delivery, encode_delivery};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = decode_delivery(Bytes::copy_from_slice(data)) {
        let mut out = BytesMut::new();
        encode_delivery(&d, &mut out);
        assert_eq!(&out[4..], data);
    }
});
