//! Parameter layouts and the cross-rank check that every rank has the same:
//! a mismatch would otherwise sum unrelated numbers or hang.

use crate::element::{DType, ReduceOp};
use crate::error::{CommError, Result};
use crate::group::ProcessGroup;

/// Shape and element type of one parameter's gradient.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParamLayout {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

impl ParamLayout {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of its gradient.
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

/// What every rank learns in the one small collective before a
/// synchronisation: whether all have the same layout, and whether any has a
/// gradient to share.
pub(crate) struct Agreement {
    pub same_layout: bool,
    pub any_gradients: bool,
}

/// One all-reduce of `[fingerprint, -fingerprint, has_gradients,
/// joiner_seen]` (max): equal to ours on every rank iff all fingerprints
/// agree. It also tells every rank at the same step whether any rank saw
/// a replacement ask to join (`ProcessGroup::joiners_waiting`): no round
/// trip of its own.
pub(crate) fn agree<'a>(
    group: &ProcessGroup,
    layout: impl Iterator<Item = &'a ParamLayout>,
    has_gradients: bool,
) -> Result<Agreement> {
    let mine = fingerprint(layout);
    let mut seen = [
        mine,
        mine.wrapping_neg(),
        has_gradients as i64,
        group.joiner_seen() as i64,
    ];
    group.all_reduce(&mut seen, ReduceOp::Max)?;
    group.agree_joiners(seen[3] > 0);
    Ok(Agreement {
        same_layout: seen[..2] == [mine, mine.wrapping_neg()],
        any_gradients: seen[2] > 0,
    })
}

/// The check every synchronisation starts with: `Ok(true)` when the ranks
/// have the same layout and some rank has a gradient, `Ok(false)` when none
/// has, an error naming the first differing parameter otherwise.
pub(crate) fn agree_on(
    group: &ProcessGroup,
    layout: &[ParamLayout],
    has_gradients: bool,
) -> Result<bool> {
    let agreement = agree(group, layout.iter(), has_gradients)?;
    if !agreement.same_layout {
        check_same_layout(group, layout)?;
        return Err(CommError::Mismatch {
            rank: group.rank(),
            message: "ranks' parameter layouts hash differently but compare equal; \
                      please report this"
                .into(),
        });
    }
    Ok(agreement.any_gradients)
}

/// What every rank must build alike.
const SAME_MODEL: &str =
    "Every rank must build the same model (same config, same layers in the same order)";

/// Fails on every rank, naming the first differing parameter, unless all ranks
/// describe the same parameters.
pub fn check_same_layout(group: &ProcessGroup, layout: &[ParamLayout]) -> Result<()> {
    check_layouts_agree(group, layout, "parameters", SAME_MODEL)
}

/// [`check_same_layout`] for any list of tensors: `what` names them in the
/// error (`"parameters"`, `"buffers"`), `fix` says what to do.
pub fn check_layouts_agree(
    group: &ProcessGroup,
    layout: &[ParamLayout],
    what: &str,
    fix: &str,
) -> Result<()> {
    let world = group.world_size();
    if world == 1 {
        return Ok(());
    }
    let words = encode(layout);
    let summary = group.all_gather(&[words.len() as i64])?;
    let longest = *summary.iter().max().unwrap() as usize;
    let mut padded = words.clone();
    padded.resize(longest, -1);
    let everyone = group.all_gather(&padded)?;
    let layouts: Vec<Vec<ParamLayout>> = (0..world)
        .map(|r| decode(&everyone[r * longest..r * longest + summary[r] as usize]))
        .collect();
    match first_difference(group.rank(), layout, &layouts, what, fix) {
        Some(message) => Err(CommError::Mismatch {
            rank: group.rank(),
            message,
        }),
        None => Ok(()),
    }
}

/// How this rank's `layout` first differs from another rank's, if it does.
fn first_difference(
    rank: usize,
    layout: &[ParamLayout],
    all: &[Vec<ParamLayout>],
    what: &str,
    fix: &str,
) -> Option<String> {
    let (other, theirs) = all
        .iter()
        .enumerate()
        .find(|(_, theirs)| *theirs != layout)?;
    let describe = |p: Option<&ParamLayout>| match p {
        Some(p) => format!("{:?} {:?}", p.shape, p.dtype),
        None => format!("nothing (fewer {what})"),
    };
    let first = (0..layout.len().max(theirs.len()))
        .find(|&i| layout.get(i) != theirs.get(i))
        .unwrap();
    let one = what.strip_suffix('s').unwrap_or(what);
    Some(format!(
        "the model's {what} differ between rank {rank} ({} {what}) and rank {other} ({} \
         {what}): {one} #{first} is {} on rank {rank} but {} on rank {other}. {fix}",
        layout.len(),
        theirs.len(),
        describe(layout.get(first)),
        describe(theirs.get(first)),
    ))
}

/// FNV-1a over the encoded layout (and its length): equal layouts, equal
/// fingerprints. Streamed, so a synchronisation allocates nothing for it.
pub(crate) fn fingerprint<'a>(layout: impl IntoIterator<Item = &'a ParamLayout>) -> i64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |word: i64| {
        for byte in word.to_le_bytes() {
            hash = (hash ^ byte as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    let mut count = 0i64;
    for p in layout {
        words_of(p, &mut mix);
        count += 1;
    }
    mix(count);
    hash as i64
}

/// `[rank, dims..., dtype code]` for one parameter.
fn words_of(p: &ParamLayout, mut push: impl FnMut(i64)) {
    push(p.shape.len() as i64);
    p.shape.iter().for_each(|d| push(*d as i64));
    push(p.dtype.code());
}

/// Every parameter's words, one after the other.
fn encode(layout: &[ParamLayout]) -> Vec<i64> {
    let mut words = Vec::new();
    for p in layout {
        words_of(p, |word| words.push(word));
    }
    words
}

fn decode(mut words: &[i64]) -> Vec<ParamLayout> {
    let mut layout = Vec::new();
    while let Some((&rank, rest)) = words.split_first() {
        let rank = rank as usize;
        if rest.len() < rank + 1 {
            break;
        }
        let Some(dtype) = DType::from_code(rest[rank]) else {
            break;
        };
        layout.push(ParamLayout {
            shape: rest[..rank].iter().map(|d| *d as usize).collect(),
            dtype,
        });
        words = &rest[rank + 1..];
    }
    layout
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn f32s(shapes: &[&[usize]]) -> Vec<ParamLayout> {
        shapes
            .iter()
            .map(|s| ParamLayout {
                shape: s.to_vec(),
                dtype: DType::F32,
            })
            .collect()
    }

    #[test]
    fn fingerprints_tell_layouts_apart() {
        let a = f32s(&[&[3, 4], &[4]]);
        let mut b = a.clone();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        b[1].shape = vec![5];
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&a[..1]));
        b = a.clone();
        b[0].dtype = DType::F64;
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn layouts_round_trip_through_words() {
        let mut layout = f32s(&[&[3, 4], &[], &[7]]);
        layout[2].dtype = DType::I64;
        layout[1].dtype = DType::BF16;
        assert_eq!(decode(&encode(&layout)), layout);
    }

    #[test]
    fn the_first_difference_names_both_ranks_and_the_parameter() {
        let mine = f32s(&[&[10, 1], &[1]]);
        let theirs = f32s(&[&[10, 2], &[2]]);
        let differ = |rank, all: &[Vec<ParamLayout>]| {
            first_difference(rank, &mine, all, "parameters", SAME_MODEL)
        };
        let message = differ(0, &[mine.clone(), theirs]).unwrap();
        assert!(
            message.contains("parameter #0 is [10, 1] F32 on rank 0 but [10, 2] F32 on rank 1"),
            "{message}"
        );
        let shorter = differ(1, &[mine[..1].to_vec(), mine.clone()]).unwrap();
        assert!(shorter.contains("nothing (fewer parameters)"), "{shorter}");
        assert!(differ(0, &[mine.clone(), mine.clone()]).is_none());
        let buffers = first_difference(0, &mine, &[mine[..1].to_vec()], "buffers", "Fix.").unwrap();
        assert!(
            buffers.contains("buffer #1 is [1] F32") && buffers.ends_with("Fix."),
            "{buffers}"
        );
    }
}
