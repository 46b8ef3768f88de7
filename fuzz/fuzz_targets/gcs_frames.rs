//! The frame reader fed a byte stream in arbitrary pieces: it never panics,
//! never hands out a frame over its limit, and every frame it hands out
//! decodes to a value or an error.
#![no_main]

use bytes::BytesMut;
use conclave_gcs::wire::{decode_request, FrameReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else { return };
    let mut reader = FrameReader::new(64);
    let mut buf = BytesMut::new();
    for piece in stream.chunks(usize::from(step).max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match reader.next_frame(&mut buf) {
                Ok(Some(frame)) => {
                    assert!(frame.len() <= 64);
                    let _ = decode_request(frame);
                }
                Ok(None) => break,
                // Too large: reported once, then skipped; reading goes on.
                Err(_) => {}
            }
        }
    }
});
