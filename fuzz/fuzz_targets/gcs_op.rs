//! The daemon–daemon decoder of cluster backbones: any bytes give an
//! operation or an error, and whatever decodes re-encodes to the same message.
#![no_main]

use bytes::Bytes;
use conclave_gcs::backbone::{decode_op, op_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(op) = decode_op(Bytes::copy_from_slice(data)) {
        assert_eq!(&op_bytes(&op)[..], data);
    }
});
