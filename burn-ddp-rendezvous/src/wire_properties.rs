//! Property tests (a fuzzer's inputs, run briefly in CI) over everything
//! the store decodes from the network: frames and fields, the c10d client's
//! replies, and the store server itself. Any input must give a value or an
//! error: never a panic, a hang, an allocation beyond the limits, or a store
//! that stops serving. `PROPTEST_CASES=100000` fuzzes longer.

use crate::frame::{read_frame, write_frame, FieldReader, FieldWriter, MAX_FRAME_BYTES};
use crate::store::{c10d::read_reply, Store, StoreServer, TcpStoreClient};
use proptest::prelude::*;
use std::io::Write;
use std::time::Duration;

/// Bytes that look like frames sometimes: a plausible length, then noise.
fn wire_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        (0u32..64, proptest::collection::vec(any::<u8>(), 0..64)).prop_map(|(len, rest)| {
            let mut bytes = len.to_le_bytes().to_vec();
            bytes.extend(rest);
            bytes
        }),
        (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..16)).prop_map(|(len, rest)| {
            let mut bytes = len.to_le_bytes().to_vec();
            bytes.extend(rest);
            bytes
        }),
    ]
}
proptest! {
    #[test]
    fn frames_and_fields_decode_or_fail_cleanly(bytes in wire_bytes()) {
        let mut cursor = std::io::Cursor::new(&bytes);
        while let Ok(Some(frame)) = read_frame(&mut cursor) {
            prop_assert!(frame.len() <= MAX_FRAME_BYTES);
            if let Ok((_, mut fields)) = FieldReader::new(&frame) {
                // Every field kind, in turn, on whatever follows.
                let _ = fields.string();
                let _ = fields.bytes();
                let _ = fields.u64();
                let _ = fields.i64();
            }
        }
    }

    #[test]
    fn frames_round_trip(payload in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut wire = Vec::new();
        write_frame(&mut wire, &payload).unwrap();
        let back = read_frame(&mut std::io::Cursor::new(wire)).unwrap().unwrap();
        prop_assert_eq!(back, payload);
    }

    #[test]
    fn c10d_replies_decode_or_fail_cleanly(
        bytes in wire_bytes(),
        fixed in proptest::option::of(0usize..32),
    ) {
        if let Ok(reply) = read_reply(&mut std::io::Cursor::new(&bytes), fixed) {
            prop_assert!(reply.len() <= bytes.len());
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Garbage on one connection (with or without a hello first) leaves the
    /// store serving its members.
    #[test]
    fn the_store_survives_garbage(
        chunks in proptest::collection::vec(wire_bytes(), 1..6),
        hello_first in any::<bool>(),
    ) {
        let server = StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let member = TcpStoreClient::connect(
            "127.0.0.1",
            server.addr().port(),
            Some(0),
            Duration::from_secs(5),
        )
        .unwrap();
        let mut stranger = std::net::TcpStream::connect(server.addr()).unwrap();
        if hello_first {
            let hello = FieldWriter::new(6).bytes(b"").i64(-1).finish();
            write_frame(&mut stranger, &hello).unwrap();
        }
        for chunk in &chunks {
            let _ = stranger.write_all(chunk);
        }
        member.set("k", b"v").unwrap();
        prop_assert_eq!(member.get("k", Duration::from_secs(1)).unwrap(), b"v".to_vec());
        prop_assert_eq!(member.add("n", 2).unwrap(), 2);
    }
}
