//! Which host transport a group uses, from where its ranks run and what the
//! settings ask for, and connecting it.

use super::settings::{Algorithm, TransportChoice, ALGORITHM_VAR, TRANSPORT_VAR};
use crate::error::{CommError, Result};
use crate::transport::{Hierarchical, Rendezvous, SharedMemory, TcpRing, Topology, Transport};
use std::net::IpAddr;

/// The host transport chosen for a group.
#[derive(Debug)]
pub(super) enum HostPlan {
    SharedMemory,
    Ring,
    Hierarchical(Topology),
}

/// Whether every rank runs on one machine (whose identity is known).
pub(super) fn one_machine(machine_ids: &[String]) -> bool {
    machine_ids.iter().all(|id| *id == machine_ids[0]) && machine_ids[0] != "/"
}

/// The transport for ranks on `machine_ids` (by rank), or why the settings
/// cannot be met.
pub(super) fn plan(
    rank: usize,
    choice: TransportChoice,
    algorithm: Algorithm,
    machine_ids: &[String],
) -> Result<HostPlan> {
    match (choice, one_machine(machine_ids)) {
        (TransportChoice::SharedMemory, false) => Err(CommError::config(
            Some(rank),
            TRANSPORT_VAR,
            format!(
                "rank {rank}: {TRANSPORT_VAR}=shm, but the ranks run on several machines; \
             use tcp (or leave it unset)"
            ),
        )),
        (TransportChoice::SharedMemory, true) | (TransportChoice::Auto, true) => {
            Ok(HostPlan::SharedMemory)
        }
        (TransportChoice::Tcp, _) if algorithm == Algorithm::Hierarchical => {
            Err(CommError::config(
                Some(rank),
                ALGORITHM_VAR,
                format!(
                    "rank {rank}: {ALGORITHM_VAR}=hierarchical uses shared memory within each \
                 machine, but {TRANSPORT_VAR}=tcp; unset one of them"
                ),
            ))
        }
        (TransportChoice::Tcp, _) => Ok(HostPlan::Ring),
        (TransportChoice::Auto, false) => {
            let topology = Topology::from_machine_ids(machine_ids);
            match (algorithm, topology.suits_hierarchy()) {
                (Algorithm::Hierarchical, false) => Err(CommError::config(
                    Some(rank),
                    ALGORITHM_VAR,
                    format!(
                        "rank {rank}: {ALGORITHM_VAR}=hierarchical needs several machines with \
                     the same number (two or more) of ranks each; these ranks run on {}; \
                     unset it to use the ring",
                        topology.describe()
                    ),
                )),
                (Algorithm::Ring, _) | (Algorithm::Auto, false) => Ok(HostPlan::Ring),
                (_, true) => Ok(HostPlan::Hierarchical(topology)),
            }
        }
    }
}

/// Connects the planned transport (collectively: every rank at once).
pub(super) fn connect(
    plan: HostPlan,
    rdzv: Rendezvous<'_>,
    local_ip: IpAddr,
) -> Result<Box<dyn Transport>> {
    Ok(match plan {
        HostPlan::SharedMemory => Box::new(SharedMemory::connect(rdzv)?),
        HostPlan::Ring => Box::new(TcpRing::connect(rdzv, local_ip)?),
        HostPlan::Hierarchical(topology) => {
            log::debug!(
                "rank {}: hierarchical all-reduce over {}",
                rdzv.rank,
                topology.describe()
            );
            Box::new(Hierarchical::connect(rdzv, &topology, local_ip)?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(machines: &[&str]) -> Vec<String> {
        machines.iter().map(|m| m.to_string()).collect()
    }

    #[test]
    fn one_machine_uses_shared_memory_and_several_the_network() {
        let same = ids(&["a/1", "a/1"]);
        let two_by_two = ids(&["a/1", "a/1", "b/2", "b/2"]);
        let uneven = ids(&["a/1", "a/1", "b/2"]);
        let auto = |machines: &[String], algorithm| {
            plan(0, TransportChoice::Auto, algorithm, machines).unwrap()
        };
        assert!(matches!(
            auto(&same, Algorithm::Auto),
            HostPlan::SharedMemory
        ));
        assert!(matches!(
            auto(&two_by_two, Algorithm::Auto),
            HostPlan::Hierarchical(_)
        ));
        assert!(matches!(auto(&two_by_two, Algorithm::Ring), HostPlan::Ring));
        assert!(matches!(auto(&uneven, Algorithm::Auto), HostPlan::Ring));
        // Unknown machines are never taken for one.
        assert!(matches!(
            auto(&ids(&["/", "/"]), Algorithm::Auto),
            HostPlan::Ring
        ));
        assert!(matches!(
            plan(0, TransportChoice::Tcp, Algorithm::Auto, &same).unwrap(),
            HostPlan::Ring
        ));
    }

    #[test]
    fn settings_that_cannot_be_met_say_which_and_why() {
        let two = ids(&["a/1", "b/2"]);
        let cases = [
            (
                TransportChoice::SharedMemory,
                Algorithm::Auto,
                "several machines",
            ),
            (
                TransportChoice::Tcp,
                Algorithm::Hierarchical,
                "unset one of them",
            ),
            (
                TransportChoice::Auto,
                Algorithm::Hierarchical,
                "two or more",
            ),
        ];
        for (choice, algorithm, why) in cases {
            let err = plan(3, choice, algorithm, &two).unwrap_err().to_string();
            assert!(err.contains("rank 3") && err.contains(why), "{err}");
        }
    }
}
