//! Transports move host buffers between the ranks of a group.
//!
//! The process group owns one transport and validates arguments before calling
//! it; a transport only moves and combines bytes. TCP is the portable default;
//! device transports (NCCL) work on device memory and plug in beside it.

/// Implements [`Transport`] for a type with generic `all_reduce_typed`,
/// `reduce_scatter_typed`, `all_gather_typed` and `broadcast_typed` methods, by
/// dispatching on the buffer's element type.
macro_rules! typed_transport {
    ($ty:ty, $name:literal, $abort:ident) => {
        typed_transport!($ty, $name, $abort, {});
    };
    ($ty:ty, $name:literal, $abort:ident, $compressed:ident) => {
        typed_transport!($ty, $name, $abort, {
            fn all_reduce_compressed(
                &mut self,
                data: $crate::element::BufferMut<'_>,
                op: $crate::element::ReduceOp,
                compression: $crate::transport::WireCompression,
            ) -> $crate::error::Result<()> {
                typed_transport!(@each data, d => self.$compressed(d, op, compression))
            }
        });
    };
    ($ty:ty, $name:literal, $abort:ident, { $($extra:tt)* }) => {
        impl $crate::transport::Transport for $ty {
            fn name(&self) -> &'static str {
                $name
            }

            fn abort(&mut self) {
                self.$abort()
            }

            $($extra)*

            fn all_reduce(
                &mut self,
                data: $crate::element::BufferMut<'_>,
                op: $crate::element::ReduceOp,
            ) -> $crate::error::Result<()> {
                typed_transport!(@each data, d => self.all_reduce_typed(d, op))
            }

            fn reduce_scatter(
                &mut self,
                data: $crate::element::BufferMut<'_>,
                op: $crate::element::ReduceOp,
            ) -> $crate::error::Result<()> {
                typed_transport!(@each data, d => self.reduce_scatter_typed(d, op))
            }

            fn all_gather(&mut self, data: $crate::element::BufferMut<'_>) -> $crate::error::Result<()> {
                typed_transport!(@each data, d => self.all_gather_typed(d))
            }

            fn broadcast(
                &mut self,
                data: $crate::element::BufferMut<'_>,
                root: usize,
            ) -> $crate::error::Result<()> {
                typed_transport!(@each data, d => self.broadcast_typed(d, root))
            }
        }
    };
    (@each $buffer:expr, $data:ident => $call:expr) => {
        match $buffer {
            $crate::element::BufferMut::F32($data) => $call,
            $crate::element::BufferMut::F64($data) => $call,
            $crate::element::BufferMut::I32($data) => $call,
            $crate::element::BufferMut::I64($data) => $call,
            $crate::element::BufferMut::F16($data) => $call,
            $crate::element::BufferMut::BF16($data) => $call,
        }
    };
}

mod compress;
mod encoding;
mod hierarchical;
mod local;
mod shm;
mod tcp;

pub use compress::{WireCompression, COMPRESSION_VAR};
pub use hierarchical::{Hierarchical, Topology};
pub use local::SingleProcess;
pub use shm::SharedMemory;
#[cfg(test)]
pub(crate) use tcp::Handshake;
pub use tcp::TcpRing;

use crate::element::{BufferMut, ReduceOp};
use crate::error::Result;
use crate::job::JobToken;
use crate::store::Store;
use std::time::Duration;

/// What a transport needs to connect this rank to the others: who it is, the
/// store to exchange addresses through (under `key_prefix`, unique to this
/// group), the bound on every wait, and the job token peers must present.
#[derive(Clone, Copy)]
pub struct Rendezvous<'a> {
    /// This rank.
    pub rank: usize,
    /// Ranks in the group.
    pub world_size: usize,
    /// The group's store.
    pub store: &'a dyn Store,
    /// Prefix of this group's keys.
    pub key_prefix: &'a str,
    /// Bound on every wait during set-up.
    pub timeout: Duration,
    /// The job's token, required of every peer when set.
    pub token: Option<&'a JobToken>,
    /// For a sub-group (the ranks of one machine, say): the group rank of each
    /// member, by index, so errors name group ranks; `None`: the whole group.
    pub members: Option<&'a [usize]>,
}

impl<'a> Rendezvous<'a> {
    /// A rendezvous for tests: prefix `t/`, the given store, token and timeout.
    #[cfg(test)]
    pub(crate) fn for_test(
        rank: usize,
        world_size: usize,
        store: &'a dyn Store,
        token: Option<&'a JobToken>,
        timeout: Duration,
    ) -> Self {
        Self {
            rank,
            world_size,
            store,
            key_prefix: "t/",
            timeout,
            token,
            members: None,
        }
    }
}

impl Rendezvous<'_> {
    /// The token's bytes as they travel in handshakes (empty without one).
    pub(crate) fn token_bytes(&self) -> &[u8] {
        self.token.map_or(&[], |t| t.as_str().as_bytes())
    }

    /// The group ranks of the members, by index.
    pub(crate) fn member_ranks(&self) -> Vec<usize> {
        match self.members {
            Some(members) => members.to_vec(),
            None => (0..self.world_size).collect(),
        }
    }

    /// Whether a peer's presented token admits it.
    pub(crate) fn admits(&self, presented: &[u8]) -> bool {
        self.token.is_none_or(|t| t.matches(presented))
    }
}

/// Collectives on host buffers, all in place.
///
/// Every rank must call the same operations in the same order with buffers of
/// the same length and type; the process group checks what it cheaply can.
pub trait Transport: Send {
    /// A short name for logs (`"tcp"`, `"local"`).
    fn name(&self) -> &'static str;

    /// Replaces `data` on every rank with its reduction over all ranks.
    fn all_reduce(&mut self, data: BufferMut<'_>, op: ReduceOp) -> Result<()>;

    /// `data` holds `world_size` equal chunks; afterwards chunk `rank` holds the
    /// reduction of chunk `rank` over all ranks (the other chunks are scratch).
    fn reduce_scatter(&mut self, data: BufferMut<'_>, op: ReduceOp) -> Result<()>;

    /// `data` holds `world_size` equal chunks, of which chunk `rank` is this rank's
    /// input; afterwards every chunk holds the input of its rank.
    fn all_gather(&mut self, data: BufferMut<'_>) -> Result<()>;

    /// Copies `data` of rank `root` to every rank.
    fn broadcast(&mut self, data: BufferMut<'_>, root: usize) -> Result<()>;

    /// Gives up: marks the transport unusable and tells the peers at once (a
    /// closed connection, a failed counter), so none waits out its timeout.
    fn abort(&mut self);

    /// [`all_reduce`](Self::all_reduce), with f32 sums and means sent
    /// across machines in 16 bits (see [`WireCompression`]). A transport
    /// within one machine moves them as they are.
    fn all_reduce_compressed(
        &mut self,
        data: BufferMut<'_>,
        op: ReduceOp,
        compression: WireCompression,
    ) -> Result<()> {
        let _ = compression;
        self.all_reduce(data, op)
    }
}

/// The `index`-th of `parts` near-equal contiguous ranges of `0..len`.
pub(crate) fn chunk_range(len: usize, parts: usize, index: usize) -> std::ops::Range<usize> {
    len * index / parts..len * (index + 1) / parts
}

#[cfg(test)]
mod tests {
    use super::chunk_range;

    #[test]
    fn chunks_cover_the_buffer_in_order_even_when_shorter_than_parts() {
        for len in [0usize, 1, 2, 7, 100] {
            for parts in 1..6 {
                let mut next = 0;
                for i in 0..parts {
                    let r = chunk_range(len, parts, i);
                    assert_eq!(r.start, next);
                    assert!(r.len() <= len.div_ceil(parts));
                    next = r.end;
                }
                assert_eq!(next, len);
            }
        }
    }
}
