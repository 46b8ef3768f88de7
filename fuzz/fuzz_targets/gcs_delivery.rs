//! The daemon event decoder of the gcs wire format: any bytes give a value or
//! an error, and whatever decodes re-encodes to the same frame; read by a
//! client that keeps its last views (views as changes), any bytes give a
//! value or an error too, with a last view of group `g` whose id is all
//! zeros for changes to find.
#![no_main]

use bytes::{Bytes, BytesMut};
use conclave_gcs::core::Delivery;
use conclave_gcs::wire::{decode_delivery, decode_delivery_tracked, encode_delivery, ViewMemory};
use conclave_gcs::{Cause, GroupName, MemberId, View, ViewId, ViewMember};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = decode_delivery(Bytes::copy_from_slice(data)) {
        let mut out = BytesMut::new();
        encode_delivery(&d, &mut out);
        assert_eq!(&out[4..], data);
    }
    let mut memory = ViewMemory::default();
    let members = ["a", "b", "c"]
        .iter()
        .map(|n| ViewMember { id: MemberId::new(*n).unwrap(), prev: None })
        .collect();
    let base = View { id: ViewId::new(0, 0), members, cause: Cause::Join };
    let mut whole = BytesMut::new();
    encode_delivery(&Delivery::View { group: GroupName::new("g").unwrap(), view: base }, &mut whole);
    decode_delivery_tracked(whole.freeze().slice(4..), None, &mut memory).unwrap();
    if let Ok(Delivery::View { view, .. }) = decode_delivery_tracked(Bytes::copy_from_slice(data), None, &mut memory) {
        assert!(view.members.len() <= 3 + data.len());
    }
});
