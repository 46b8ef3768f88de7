//! The signed envelope decoder: any bytes give a value or an error, and
//! whatever decodes re-encodes to the same bytes.
#![no_main]

use conclave_gka::message::Envelope;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = Envelope::decode(data) {
        assert_eq!(env.encode(), data);
    }
});
