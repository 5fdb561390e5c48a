//! All-reduce in two levels, for several machines with several ranks each.
//!
//! A flat ring sends every byte across the machines' links as often as across
//! any other hop. Here the ranks of a machine first reduce-scatter the buffer
//! among themselves over shared memory (each ends with the machine's sum of
//! one shard), then each shard is all-reduced across the machines by the ranks
//! holding it (the ranks with the same index on every machine, so every
//! rank's link carries its share), and the machine's ranks all-gather the
//! shards. The other collectives use a flat ring over all ranks.

use super::{Rendezvous, SharedMemory, TcpRing, Transport, WireCompression};
use crate::element::{finish_reduce, Element, ReduceOp};
use crate::error::Result;
use std::net::IpAddr;

/// Which ranks run on which machine: machines in the order of their lowest
/// rank, and on each its ranks in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    machines: Vec<Vec<usize>>,
}

impl Topology {
    /// From each rank's machine identity (rank `r` runs on `machine_ids[r]`).
    pub fn from_machine_ids(machine_ids: &[String]) -> Self {
        let mut machines: Vec<(&str, Vec<usize>)> = Vec::new();
        for (rank, id) in machine_ids.iter().enumerate() {
            match machines.iter_mut().find(|(m, _)| m == id) {
                Some((_, ranks)) => ranks.push(rank),
                None => machines.push((id, vec![rank])),
            }
        }
        Self {
            machines: machines.into_iter().map(|(_, ranks)| ranks).collect(),
        }
    }

    /// Number of machines.
    pub fn machine_count(&self) -> usize {
        self.machines.len()
    }

    /// Ranks per machine when every machine has the same number.
    pub fn ranks_per_machine(&self) -> Option<usize> {
        let first = self.machines.first()?.len();
        self.machines
            .iter()
            .all(|ranks| ranks.len() == first)
            .then_some(first)
    }

    /// Whether two levels make sense: several machines, the same number of
    /// ranks on each, and more than one.
    pub fn suits_hierarchy(&self) -> bool {
        self.machine_count() > 1 && self.ranks_per_machine().is_some_and(|n| n > 1)
    }

    /// `rank`'s machine and its index there.
    pub fn locate(&self, rank: usize) -> (usize, usize) {
        self.machines
            .iter()
            .enumerate()
            .find_map(|(m, ranks)| ranks.iter().position(|&r| r == rank).map(|i| (m, i)))
            .expect("every rank is on a machine")
    }

    /// The ranks on machine `machine`.
    fn machine(&self, machine: usize) -> &[usize] {
        &self.machines[machine]
    }

    /// The ranks with index `index` on their machine, one per machine.
    fn peers_at(&self, index: usize) -> Vec<usize> {
        self.machines.iter().map(|ranks| ranks[index]).collect()
    }

    /// A one-line description for logs: `2 machines x 2 ranks`.
    pub fn describe(&self) -> String {
        match self.ranks_per_machine() {
            Some(n) => format!("{} machines x {n} ranks", self.machine_count()),
            None => format!(
                "{} machines with {:?} ranks",
                self.machine_count(),
                self.machines.iter().map(Vec::len).collect::<Vec<_>>()
            ),
        }
    }
}

/// Two-level all-reduce (shared memory within machines, TCP across them); a
/// flat TCP ring for the other collectives.
pub struct Hierarchical {
    world_size: usize,
    rank: usize,
    /// Each machine's ranks (local index order), machines in ring order.
    machines: Vec<Vec<usize>>,
    machine: usize,
    /// This rank's index on its machine.
    local_index: usize,
    ranks_per_machine: usize,
    within: SharedMemory,
    across: TcpRing,
    flat: TcpRing,
}

impl Hierarchical {
    /// Connects the three transports (every rank in the same order): this
    /// machine's shared memory, the ring of this index across machines, and
    /// the flat ring. Needs [`Topology::suits_hierarchy`].
    pub fn connect(rdzv: Rendezvous<'_>, topology: &Topology, bind_ip: IpAddr) -> Result<Self> {
        let ranks_per_machine = topology
            .ranks_per_machine()
            .expect("checked by suits_hierarchy");
        let (machine, local_index) = topology.locate(rdzv.rank);
        let local_members = topology.machine(machine);
        let local_prefix = format!("{}machine/{machine}/", rdzv.key_prefix);
        let within = SharedMemory::connect(Rendezvous {
            rank: local_index,
            world_size: ranks_per_machine,
            key_prefix: &local_prefix,
            members: Some(local_members),
            ..rdzv
        })?;
        let across_members = topology.peers_at(local_index);
        let across_prefix = format!("{}across/{local_index}/", rdzv.key_prefix);
        let across = TcpRing::connect(
            Rendezvous {
                rank: machine,
                world_size: topology.machine_count(),
                key_prefix: &across_prefix,
                members: Some(&across_members),
                ..rdzv
            },
            bind_ip,
        )?;
        let flat = TcpRing::connect(rdzv, bind_ip)?;
        Ok(Self {
            world_size: rdzv.world_size,
            rank: rdzv.rank,
            machines: topology.machines.clone(),
            machine,
            local_index,
            ranks_per_machine,
            within,
            across,
            flat,
        })
    }

    /// Fails every level, so the peers waiting in any of them fail at once.
    /// Where each rank's chunk goes in the two-level layout: slot
    /// `local index * machines + machine`.
    fn slots(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let count = self.machines.len();
        (0..self.ranks_per_machine)
            .flat_map(move |i| (0..count).map(move |m| (i * count + m, self.machines[m][i])))
    }

    /// `data`'s chunks of `k` in the two-level layout.
    fn by_local_index<T: Element>(&self, data: &[T], k: usize) -> Vec<T> {
        let mut work = vec![T::zeroed(); data.len()];
        for (slot, rank) in self.slots() {
            work[slot * k..(slot + 1) * k].copy_from_slice(&data[rank * k..(rank + 1) * k]);
        }
        work
    }

    fn abort_all(&mut self) {
        self.within.abort();
        self.across.abort();
        self.flat.abort();
    }

    fn all_reduce_typed<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_with(data, op, WireCompression::None)
    }

    /// An all-reduce whose f32 sums and means cross machines (the ring
    /// across them) as `compression` says; within a machine they stay f32.
    fn all_reduce_with<T: Element>(
        &mut self,
        data: &mut [T],
        op: ReduceOp,
        compression: WireCompression,
    ) -> Result<()> {
        let per = self.ranks_per_machine;
        if data.len() < per {
            // Fewer elements than ranks on a machine: not worth two levels.
            return self.flat.all_reduce(T::buffer(data), op);
        }
        // Mean divides once, at the end, by the whole group.
        let level_op = if op == ReduceOp::Mean {
            ReduceOp::Sum
        } else {
            op
        };
        let shard = data.len().div_ceil(per);
        if data.len() == shard * per {
            self.levels(data, shard, level_op, compression)?;
        } else {
            // Shards must be equal: pad the last one; the padding is dropped.
            let mut padded = vec![T::zeroed(); shard * per];
            padded[..data.len()].copy_from_slice(data);
            self.levels(&mut padded, shard, level_op, compression)?;
            let len = data.len();
            data.copy_from_slice(&padded[..len]);
        }
        finish_reduce(op, data, self.world_size);
        Ok(())
    }

    /// Reduce-scatter within the machine, all-reduce of this rank's shard
    /// across machines, all-gather within the machine.
    fn levels<T: Element>(
        &mut self,
        work: &mut [T],
        shard: usize,
        op: ReduceOp,
        compression: WireCompression,
    ) -> Result<()> {
        let mine = self.local_index * shard..(self.local_index + 1) * shard;
        let result = self
            .within
            .reduce_scatter(T::buffer(work), op)
            .and_then(|()| {
                let shard = T::buffer(&mut work[mine]);
                self.across.all_reduce_compressed(shard, op, compression)
            })
            .and_then(|()| self.within.all_gather(T::buffer(work)));
        if result.is_err() {
            self.abort_all();
        }
        result
    }

    /// Within the machine, then across: the chunks are laid out local index
    /// first, machine second, so the machine-level reduce-scatter leaves
    /// each rank the machine's sums of the chunks of its peers at the same
    /// local index (one per machine), and a reduce-scatter among those peers
    /// leaves it its own. Each byte crosses the machines' links once, as in
    /// the two-level all-reduce.
    fn reduce_scatter_typed<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let k = data.len() / self.world_size;
        if k == 0 {
            return Ok(());
        }
        let level_op = if op == ReduceOp::Mean {
            ReduceOp::Sum
        } else {
            op
        };
        let mut work = self.by_local_index(data, k);
        let shard = self.machines.len() * k;
        let mine = self.local_index * shard..(self.local_index + 1) * shard;
        let result = self
            .within
            .reduce_scatter(T::buffer(&mut work), level_op)
            .and_then(|()| {
                self.across
                    .reduce_scatter(T::buffer(&mut work[mine.clone()]), level_op)
            });
        if result.is_err() {
            self.abort_all();
            return result;
        }
        let at = mine.start + self.machine * k;
        let chunk = &mut data[self.rank * k..(self.rank + 1) * k];
        chunk.copy_from_slice(&work[at..at + k]);
        finish_reduce(op, chunk, self.world_size);
        Ok(())
    }

    /// The reduce-scatter's steps backwards: across machines among the
    /// peers at this local index, then within the machine.
    fn all_gather_typed<T: Element>(&mut self, data: &mut [T]) -> Result<()> {
        let k = data.len() / self.world_size;
        if k == 0 {
            return Ok(());
        }
        let count = self.machines.len();
        let mut work = vec![T::zeroed(); data.len()];
        let shard = count * k;
        let mine = self.local_index * shard..(self.local_index + 1) * shard;
        let at = mine.start + self.machine * k;
        work[at..at + k].copy_from_slice(&data[self.rank * k..(self.rank + 1) * k]);
        let result = self
            .across
            .all_gather(T::buffer(&mut work[mine]))
            .and_then(|()| self.within.all_gather(T::buffer(&mut work)));
        if result.is_err() {
            self.abort_all();
            return result;
        }
        for (slot, rank) in self.slots() {
            data[rank * k..(rank + 1) * k].copy_from_slice(&work[slot * k..(slot + 1) * k]);
        }
        Ok(())
    }

    fn broadcast_typed<T: Element>(&mut self, data: &mut [T], root: usize) -> Result<()> {
        self.flat.broadcast(T::buffer(data), root)
    }
}

typed_transport!(Hierarchical, "hierarchical", abort_all, all_reduce_with);

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn machines_in_order_of_their_lowest_rank() {
        let topology = Topology::from_machine_ids(&ids(&["b", "a", "b", "a"]));
        assert_eq!(topology.machines, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(topology.ranks_per_machine(), Some(2));
        assert!(topology.suits_hierarchy());
        assert_eq!(topology.locate(3), (1, 1));
        assert_eq!(topology.peers_at(1), vec![2, 3]);
        assert_eq!(topology.describe(), "2 machines x 2 ranks");
    }

    #[test]
    fn uneven_single_or_one_rank_machines_do_not_suit() {
        let uneven = Topology::from_machine_ids(&ids(&["a", "a", "b"]));
        assert_eq!(uneven.ranks_per_machine(), None);
        assert!(!uneven.suits_hierarchy());
        assert_eq!(uneven.describe(), "2 machines with [2, 1] ranks");
        assert!(!Topology::from_machine_ids(&ids(&["a", "a"])).suits_hierarchy());
        assert!(!Topology::from_machine_ids(&ids(&["a", "b"])).suits_hierarchy());
    }
}
