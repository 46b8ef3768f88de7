//! The daemon–daemon decoder of cluster backbones: any bytes give an
//! operation, a batch of messages or an error; whatever decodes re-encodes to
//! the same message, and a batch's messages put together again give the batch.
#![no_main]

use bytes::Bytes;
use conclave_gcs::backbone::{batch_bytes, decode_op, op_bytes, split_batch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let msg = Bytes::copy_from_slice(data);
    if let Ok(Some(parts)) = split_batch(&msg) {
        assert_eq!(batch_bytes(&parts), msg);
        for part in parts {
            if let Ok(op) = decode_op(part.clone()) {
                assert_eq!(op_bytes(&op), part);
            }
        }
    }
    if let Ok(op) = decode_op(msg) {
        assert_eq!(&op_bytes(&op)[..], data);
    }
});
