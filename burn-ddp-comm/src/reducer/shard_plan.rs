//! Which rank owns which parameter's optimizer state (ZeRO stage 1), and the
//! rounds its gradients and values travel in.
//!
//! Owners are chosen largest parameter first, each to the least-loaded rank
//! (ties: the lower rank), by position and size alone, so every rank computes
//! the same plan from the same layout without sending it. A round is one
//! collective: each rank contributes a chunk of the parameters it owns, in
//! declaration order, padded to the round's longest chunk so a reduce-scatter
//! hands each owner exactly its chunk. Where padding would cost more than
//! `padding_limit` times the real elements (one huge parameter among small
//! ones), the round is replicated instead: an all-reduce of its gradients,
//! and each owner broadcasts its updated chunk.

#[cfg(any(feature = "nccl", test))]
use super::gradient_set::Piece;
use super::layout::ParamLayout;
use crate::element::DType;

/// How a round moves its gradients and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundMode {
    /// Reduce-scatter of the gradients, all-gather of the values: the bytes of
    /// one all-reduce in all.
    Sharded,
    /// All-reduce of the gradients, one broadcast per owner for the values
    /// (where padding a reduce-scatter would cost more).
    Replicated,
}

/// One collective's parameters: each rank's chunk of parameters it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// Element type of every parameter in it.
    pub dtype: DType,
    /// Sharded or replicated.
    pub mode: RoundMode,
    /// Per rank, the parameters (positions in the layout) of its chunk.
    pub members: Vec<Vec<usize>>,
    /// Per rank, each member's offset (elements) in the round's buffer.
    pub offsets: Vec<Vec<usize>>,
    /// Per rank, where its chunk starts and how many elements it holds.
    pub chunks: Vec<(usize, usize)>,
    /// Elements of the round's buffer (padding included).
    pub numel: usize,
}

impl Round {
    /// Every member, with its owner and offset.
    pub fn all_members(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.members.iter().enumerate().flat_map(move |(owner, m)| {
            m.iter()
                .zip(&self.offsets[owner])
                .map(move |(&param, &offset)| (owner, param, offset))
        })
    }

    /// The round's buffer as the pieces a front-end packs on the device:
    /// each rank's chunk in rank order, its parameters where `filled(owner)`
    /// (zeros in their place otherwise), then the chunk's padding, so every
    /// parameter lands at its offset.
    #[cfg(any(feature = "nccl", test))]
    pub(crate) fn pieces(&self, filled: impl Fn(usize) -> bool) -> Vec<Piece> {
        let chunk = match self.mode {
            RoundMode::Sharded => Some(self.numel / self.members.len()),
            RoundMode::Replicated => None,
        };
        let mut pieces = Vec::new();
        for (owner, members) in self.members.iter().enumerate() {
            let (_, len) = self.chunks[owner];
            if filled(owner) {
                pieces.extend(members.iter().map(|&p| Piece::Param(p)));
            } else {
                pieces.push(Piece::Zeros(len));
            }
            if let Some(chunk) = chunk {
                pieces.push(Piece::Zeros(chunk - len));
            }
        }
        pieces
    }
}

/// The owners and the rounds of one layout over `world` ranks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardPlan {
    /// The owning rank of each parameter, by position.
    pub owners: Vec<usize>,
    /// The collectives, in order.
    pub rounds: Vec<Round>,
}

impl ShardPlan {
    /// The plan for `layout` over `world` ranks, with rounds of about
    /// `cap_bytes` (PyTorch's bucket cap) and padding allowed up to
    /// `padding_limit` times a round's real elements.
    pub fn new(layout: &[ParamLayout], world: usize, cap_bytes: usize, padding_limit: f64) -> Self {
        let world = world.max(1);
        let owners = assign_owners(layout, world);
        let mut dtypes: Vec<DType> = Vec::new();
        for param in layout {
            if !dtypes.contains(&param.dtype) {
                dtypes.push(param.dtype);
            }
        }
        let mut rounds = Vec::new();
        for dtype in dtypes {
            let mut queues: Vec<std::collections::VecDeque<usize>> =
                vec![Default::default(); world];
            for (index, param) in layout.iter().enumerate() {
                if param.dtype == dtype {
                    queues[owners[index]].push_back(index);
                }
            }
            let base = (cap_bytes / dtype.size() / world).max(1);
            while queues.iter().any(|q| !q.is_empty()) {
                // A chunk may hold the largest parameter at the head of a
                // queue, so one big parameter does not leave the others' chunks
                // nearly empty.
                let head = queues
                    .iter()
                    .filter_map(|q| q.front().map(|&p| layout[p].numel()))
                    .max()
                    .unwrap_or(0);
                let target = base.max(head);
                let members: Vec<Vec<usize>> = queues
                    .iter_mut()
                    .map(|queue| {
                        let (mut taken, mut len) = (Vec::new(), 0);
                        while let Some(&next) = queue.front() {
                            let numel = layout[next].numel();
                            if !taken.is_empty() && len + numel > target {
                                break;
                            }
                            taken.push(next);
                            len += numel;
                            queue.pop_front();
                        }
                        taken
                    })
                    .collect();
                rounds.push(round(layout, dtype, members, padding_limit));
            }
        }
        Self { owners, rounds }
    }

    /// The positions of the parameters `rank` owns, in declaration order.
    pub fn owned_by(&self, rank: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.owners.len()).filter(move |&p| self.owners[p] == rank)
    }
}

/// Largest first, each to the least-loaded rank (lowest rank on ties).
fn assign_owners(layout: &[ParamLayout], world: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..layout.len()).collect();
    order.sort_by_key(|&p| (std::cmp::Reverse(layout[p].bytes()), p));
    let mut load = vec![0usize; world];
    let mut owners = vec![0; layout.len()];
    for p in order {
        let rank = (0..world).min_by_key(|&r| (load[r], r)).unwrap();
        load[rank] += layout[p].bytes();
        owners[p] = rank;
    }
    owners
}

/// A round of `members` (per rank): sharded with padded equal chunks when
/// that costs at most `padding_limit` times its elements, else replicated.
fn round(layout: &[ParamLayout], dtype: DType, members: Vec<Vec<usize>>, limit: f64) -> Round {
    let lens: Vec<usize> = members
        .iter()
        .map(|m| m.iter().map(|&p| layout[p].numel()).sum())
        .collect();
    let real: usize = lens.iter().sum();
    let longest = lens.iter().copied().max().unwrap_or(0);
    let padded = longest * members.len();
    let sharded = padded as f64 <= limit * real as f64;
    let mut start = 0;
    let chunks: Vec<(usize, usize)> = lens
        .iter()
        .map(|&len| {
            let chunk = (start, len);
            start += if sharded { longest } else { len };
            chunk
        })
        .collect();
    let offsets = members
        .iter()
        .zip(&chunks)
        .map(|(m, &(start, _))| {
            let mut at = start;
            m.iter()
                .map(|&p| {
                    let offset = at;
                    at += layout[p].numel();
                    offset
                })
                .collect()
        })
        .collect();
    Round {
        dtype,
        mode: if sharded {
            RoundMode::Sharded
        } else {
            RoundMode::Replicated
        },
        members,
        offsets,
        chunks,
        numel: if sharded { padded } else { real },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(sizes: &[usize]) -> Vec<ParamLayout> {
        sizes
            .iter()
            .map(|&n| ParamLayout {
                shape: vec![n],
                dtype: DType::F32,
            })
            .collect()
    }

    #[test]
    fn owners_balance_bytes_largest_first_and_every_rank_computes_the_same() {
        let layout = layout(&[10, 40, 30, 20, 5, 5]);
        let plan = ShardPlan::new(&layout, 2, 1 << 20, 1.5);
        // 40 -> rank 0; 30 -> 1; 20 -> 1 (load 30 < 40); 10 -> 0 (40 < 50);
        // 5 -> 0 (50 = 50: the lower rank); 5 -> 1.
        assert_eq!(plan.owners, [0, 0, 1, 1, 0, 1]);
        assert_eq!(plan, ShardPlan::new(&layout, 2, 1 << 20, 1.5));
        let load = |r| plan.owned_by(r).map(|p| layout[p].numel()).sum::<usize>();
        assert_eq!((load(0), load(1)), (55, 55));
    }

    #[test]
    fn one_round_when_everything_fits_with_each_chunk_padded_to_the_longest() {
        let layout = layout(&[10, 40, 30, 20, 5, 5]);
        let plan = ShardPlan::new(&layout, 2, 1 << 20, 1.5);
        assert_eq!(plan.rounds.len(), 1);
        let round = &plan.rounds[0];
        assert_eq!(round.mode, RoundMode::Sharded);
        assert_eq!(round.members, [vec![0, 1, 4], vec![2, 3, 5]]);
        assert_eq!(round.offsets, [vec![0, 10, 50], vec![55, 85, 105]]);
        assert_eq!(round.chunks, [(0, 55), (55, 55)]);
        assert_eq!(round.numel, 110);
        // Every parameter exactly once.
        let mut all: Vec<usize> = round.all_members().map(|(_, p, _)| p).collect();
        all.sort();
        assert_eq!(all, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn small_caps_make_several_rounds_and_more_ranks_than_parameters_leave_empty_chunks() {
        let layout = layout(&[4, 4, 4, 4]);
        // A cap of 16 bytes is 2 elements per rank: each chunk takes just the
        // parameter at its head.
        let plan = ShardPlan::new(&layout, 2, 16, 1.5);
        assert_eq!(plan.rounds.len(), 2);
        for round in &plan.rounds {
            assert_eq!(round.chunks.iter().map(|c| c.1).collect::<Vec<_>>(), [4, 4]);
        }
        let plan = ShardPlan::new(&layout[..1], 3, 1 << 20, 1.5);
        assert_eq!(plan.owners, [0]);
        let round = &plan.rounds[0];
        // 3 x 4 padded for 4 real elements: over the limit, replicated.
        assert_eq!(round.mode, RoundMode::Replicated);
        assert_eq!(round.chunks, [(0, 4), (4, 0), (4, 0)]);
        assert_eq!(round.numel, 4);
    }

    #[test]
    fn one_huge_parameter_makes_its_round_replicated() {
        let layout = layout(&[1000, 10, 10]);
        let plan = ShardPlan::new(&layout, 4, 1 << 20, 1.5);
        assert_eq!(plan.owners, [0, 1, 2]);
        assert_eq!(plan.rounds[0].mode, RoundMode::Replicated);
        assert_eq!(plan.rounds[0].numel, 1020);
        assert_eq!(
            plan.rounds[0].offsets,
            [vec![0], vec![1000], vec![1010], vec![]]
        );
    }

    /// Where each parameter starts when `pieces` are packed one after the
    /// other, and the packed length.
    fn packed(layout: &[ParamLayout], pieces: &[Piece]) -> (Vec<(usize, usize)>, usize) {
        let mut at = 0;
        let mut starts = Vec::new();
        for piece in pieces {
            match *piece {
                Piece::Param(p) => {
                    starts.push((p, at));
                    at += layout[p].numel();
                }
                Piece::Zeros(n) => at += n,
            }
        }
        (starts, at)
    }

    #[test]
    fn device_pieces_put_every_parameter_at_its_offset_in_both_modes() {
        let layout = layout(&[10, 40, 30, 20, 5, 5, 7]);
        for (world, limit) in [(2, 1.5), (3, 1.5), (3, 1.0), (4, 4.0)] {
            let plan = ShardPlan::new(&layout, world, 1 << 20, limit);
            for round in &plan.rounds {
                let chunk = round.numel / world;
                // Gradients: every rank's parameters, each at its offset.
                let (starts, len) = packed(&layout, &round.pieces(|_| true));
                let want: Vec<(usize, usize)> =
                    round.all_members().map(|(_, p, at)| (p, at)).collect();
                assert_eq!((starts, len), (want, round.numel), "{world} ranks, {limit}");
                // Values: one rank's own, every other chunk zeros of its length.
                for rank in 0..world {
                    let (starts, len) = packed(&layout, &round.pieces(|o| o == rank));
                    let own: Vec<(usize, usize)> = round
                        .all_members()
                        .filter(|&(o, _, _)| o == rank)
                        .map(|(_, p, at)| (p, at))
                        .collect();
                    assert_eq!((starts, len), (own, round.numel));
                    if round.mode == RoundMode::Sharded {
                        // NCCL's in-place layout: this rank's chunk at rank * chunk.
                        assert_eq!(round.chunks[rank].0, rank * chunk);
                    }
                }
            }
            let modes: Vec<RoundMode> = plan.rounds.iter().map(|r| r.mode).collect();
            let want = if limit == 1.0 {
                RoundMode::Replicated
            } else {
                RoundMode::Sharded
            };
            assert_eq!(modes, [want], "{world} ranks, limit {limit}");
        }
    }

    #[test]
    fn element_types_travel_in_separate_rounds() {
        let mut layout = layout(&[8, 8]);
        layout[1].dtype = DType::F64;
        let plan = ShardPlan::new(&layout, 2, 1 << 20, 4.0);
        assert_eq!(plan.rounds.len(), 2);
        assert_eq!(plan.rounds[0].dtype, DType::F32);
        assert_eq!(plan.rounds[1].dtype, DType::F64);
        assert_eq!(plan.owners, [1, 0]); // the f64 one is bigger in bytes
    }
}
