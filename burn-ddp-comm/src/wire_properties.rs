//! Property tests (a fuzzer's inputs, run briefly in CI) over the ring's
//! handshake, the one thing a transport decodes from a stranger: any input
//! gives a value or an error, never a panic, and only the job's token is
//! accepted. The store's wire is fuzzed in burn-ddp-rendezvous.
//! `PROPTEST_CASES=100000` fuzzes longer.

use crate::transport::{Handshake, Rendezvous};
use burn_ddp_rendezvous::job::JobToken;
use burn_ddp_rendezvous::store::MemoryStore;
use proptest::prelude::*;
use std::time::Duration;

proptest! {
    #[test]
    fn handshakes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let store = MemoryStore::new();
        let token = JobToken::new("fuzzed-job").unwrap();
        for token in [None, Some(&token)] {
            let rdzv = rendezvous(&store, 0, 2, token);
            if let Ok(Some((rank, world))) = Handshake::decode(&bytes, &rdzv) {
                // Only a handshake carrying the token can be accepted.
                prop_assert!(token.is_none() || bytes.windows(10).any(|w| w == b"fuzzed-job"));
                let _ = (rank, world);
            }
        }
    }

    #[test]
    fn handshakes_round_trip_and_other_tokens_are_refused(
        rank in 0usize..1024,
        world in 1usize..1024,
        token in "[!-~]{1,64}",
        other in "[!-~]{1,64}",
    ) {
        let store = MemoryStore::new();
        let ours = JobToken::new(token.clone()).unwrap();
        let bytes = Handshake::encode(&rendezvous(&store, rank, world, Some(&ours)));
        let accepted = Handshake::decode(&bytes, &rendezvous(&store, 0, world, Some(&ours)));
        prop_assert_eq!(accepted, Ok(Some((rank, world))));
        let theirs = JobToken::new(other.clone()).unwrap();
        let refused = Handshake::decode(&bytes, &rendezvous(&store, 0, world, Some(&theirs)));
        prop_assert_eq!(refused.is_err(), token != other);
        // Every strict prefix is "more to come" or a refusal, never acceptance.
        for cut in 0..bytes.len() {
            let partial = Handshake::decode(&bytes[..cut], &rendezvous(&store, 0, world, Some(&ours)));
            prop_assert!(!matches!(partial, Ok(Some(_))));
        }
    }
}

fn rendezvous<'a>(
    store: &'a MemoryStore,
    rank: usize,
    world_size: usize,
    token: Option<&'a JobToken>,
) -> Rendezvous<'a> {
    Rendezvous::for_test(rank, world_size, store, token, Duration::from_secs(1))
}
