//! Each worker on a share of this machine's CPUs of its own (`--cpu-bind`).
//!
//! Several workers on one machine, left to the scheduler, move between
//! CPUs and, when there are fewer CPUs to spare than workers, crowd some
//! while others idle; every step then waits for the worker that was crowded
//! (a synchronous step ends with its slowest rank). Bound, each worker
//! keeps the same CPUs, as `mpirun --bind-to core` and `srun --cpu-bind`
//! do. The shares are whole cores where there are enough (a core's
//! hardware threads stay with one worker), equal, and taken from the CPUs
//! the launcher itself may use (`taskset`, a cgroup's cpuset).

use crate::cli::CpuBind;
use std::collections::BTreeMap;

/// The CPUs each local rank runs on, by local rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CpuShares {
    by_local_rank: Vec<Vec<usize>>,
}

impl CpuShares {
    /// The CPUs of `local_rank`.
    pub fn of(&self, local_rank: usize) -> &[usize] {
        &self.by_local_rank[local_rank]
    }
}

/// The shares for this launch, or none (`--cpu-bind none`, one worker, or
/// more workers than CPUs), said once.
pub(crate) fn plan(bind: CpuBind, nproc_per_node: usize) -> Option<CpuShares> {
    if bind == CpuBind::None || nproc_per_node <= 1 || !cfg!(target_os = "linux") {
        return None;
    }
    let allowed = match allowed_cpus(0) {
        Ok(cpus) => cpus,
        Err(err) => {
            log::warn!(
                "cannot read the CPUs this launcher may use ({err}); workers are not bound \
                 (--cpu-bind none says so and skips this)"
            );
            return None;
        }
    };
    let cores = physical_cores(&allowed, read_core_id);
    let Some(shares) = split(&cores, nproc_per_node) else {
        log::info!(
            "{nproc_per_node} processes on {} cannot each have CPUs of their own; \
             leaving them to the scheduler",
            counted(allowed.len())
        );
        return None;
    };
    let used: usize = shares.iter().map(Vec::len).sum();
    let left = if used < allowed.len() {
        format!(
            " ({} left to the rest of the system)",
            counted(allowed.len() - used)
        )
    } else {
        String::new()
    };
    let listed: Vec<String> = shares
        .iter()
        .enumerate()
        .map(|(local_rank, cpus)| format!("local rank {local_rank}: {}", cpu_list(cpus)))
        .collect();
    log::info!(
        "binding each of the {nproc_per_node} processes to CPUs of its own ({}){left}; \
         --cpu-bind none to leave them to the scheduler",
        listed.join(", ")
    );
    Some(CpuShares {
        by_local_rank: shares,
    })
}

/// The CPUs process `pid` (0: this one) may run on, in order.
#[cfg(target_os = "linux")]
fn allowed_cpus(pid: libc::pid_t) -> std::io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is an empty set; sched_getaffinity
    // writes at most the size it is given.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    if unsafe { libc::sched_getaffinity(pid, size, &mut set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let capacity = 8 * size;
    // SAFETY: CPU_ISSET reads the set within its size.
    Ok((0..capacity)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus(_pid: i32) -> std::io::Result<Vec<usize>> {
    Err(std::io::Error::other("CPU binding is Linux-only"))
}

/// Which package `cpu` is in and which core: the smallest CPU among its
/// core's hardware threads (the kernel's own sibling list, the same on
/// every architecture, where `core_id` is not); `None` where sysfs does not
/// say (then the CPU counts as a core of its own).
fn read_core_id(cpu: usize) -> Option<(u64, u64)> {
    let read = |what: &str| {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}")).ok()
    };
    // Some ARM kernels say -1 (no package): one package then.
    let package: i64 = read("physical_package_id")?.trim().parse().ok()?;
    let package = package.max(0) as u64;
    let siblings = read("core_cpus_list").or_else(|| read("thread_siblings_list"))?;
    let first = siblings.trim().split([',', '-']).next()?.parse().ok()?;
    Some((package, first))
}

/// `cpus` grouped into physical cores (a core's hardware threads together),
/// cores in package and core order.
fn physical_cores(
    cpus: &[usize],
    core_of: impl Fn(usize) -> Option<(u64, u64)>,
) -> Vec<Vec<usize>> {
    let mut cores: BTreeMap<(u64, u64, usize), Vec<usize>> = BTreeMap::new();
    for &cpu in cpus {
        // A CPU without topology is its own core, placed by its number.
        let key = core_of(cpu).map_or((u64::MAX, 0, cpu), |(package, core)| (package, core, 0));
        cores.entry(key).or_default().push(cpu);
    }
    cores.into_values().collect()
}

/// Equal shares for `workers`, in order, each sorted: whole cores when there
/// are at least as many cores as workers (a core is never split; cores with
/// more hardware threads than the fewest any core has give only that many,
/// so every share is alike), else single hardware threads, every core's
/// first before any second (so no core idles while another holds two
/// workers); `None` with fewer CPUs than workers. What does not divide
/// evenly is left to the rest of the system.
fn split(cores: &[Vec<usize>], workers: usize) -> Option<Vec<Vec<usize>>> {
    let units: Vec<Vec<usize>> = if cores.len() >= workers {
        let fewest = cores.iter().map(Vec::len).min().unwrap_or(0);
        cores.iter().map(|core| core[..fewest].to_vec()).collect()
    } else {
        let most = cores.iter().map(Vec::len).max().unwrap_or(0);
        (0..most)
            .flat_map(|thread| cores.iter().filter_map(move |core| core.get(thread)))
            .map(|&cpu| vec![cpu])
            .collect()
    };
    let per = units.len() / workers;
    if per == 0 {
        return None;
    }
    Some(
        units
            .chunks(per)
            .take(workers)
            .map(|chunk| {
                let mut share: Vec<usize> = chunk.iter().flatten().copied().collect();
                share.sort_unstable();
                share
            })
            .collect(),
    )
}

/// `1 CPU`, `2 CPUs`.
pub(crate) fn counted(cpus: usize) -> String {
    match cpus {
        1 => "1 CPU".into(),
        n => format!("{n} CPUs"),
    }
}

/// `0-3,8,10-11`.
pub(crate) fn cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for cpu in sorted {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == cpu => *end = cpu,
            _ => runs.push((cpu, cpu)),
        }
    }
    runs.iter()
        .map(|&(start, end)| {
            if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Makes the worker `command` starts run on `cpus` alone (its threads
/// inherit the mask).
#[cfg(target_os = "linux")]
pub(crate) fn bind(command: &mut std::process::Command, cpus: &[usize]) {
    use std::os::unix::process::CommandExt;
    // SAFETY: an all-zero cpu_set_t is an empty set; CPU_SET writes within it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: sched_setaffinity is a plain system call, safe between fork
    // and exec. A failure (a CPU taken offline since the plan) leaves the
    // worker unbound rather than not started.
    unsafe {
        command.pre_exec(move || {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn bind(_command: &mut std::process::Command, _cpus: &[usize]) {}

/// Says so when the worker `pid` (rank `rank`) does not run on `cpus`: its
/// binding failed (a CPU taken offline since the plan), or the program
/// (`numactl`, `taskset`) already set its own, so the message that said it
/// was bound does not hold for it.
pub(crate) fn check_bound(rank: usize, pid: u32, cpus: &[usize]) {
    let Ok(pid) = pid.try_into() else { return };
    match allowed_cpus(pid) {
        Ok(actual) if actual != cpus => log::warn!(
            "rank {rank} runs on CPUs {}, not on the {} it was bound to (the binding failed, \
             or the program set its own; --cpu-bind none leaves that to the program)",
            cpu_list(&actual),
            cpu_list(cpus)
        ),
        _ => {} // bound, or already gone (its exit is reported as such)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cores` physical cores of `threads` hardware threads each, numbered as
    /// Linux does on x86: the first thread of every core, then the second.
    fn smt(cores: usize, threads: usize) -> (Vec<usize>, impl Fn(usize) -> Option<(u64, u64)>) {
        let cpus = (0..cores * threads).collect();
        (cpus, move |cpu| Some((0, (cpu % cores) as u64)))
    }

    #[test]
    fn workers_get_whole_cores_with_their_hardware_threads() {
        let (cpus, core_of) = smt(8, 2);
        let shares = split(&physical_cores(&cpus, core_of), 2).unwrap();
        // Sorted, as the kernel lists a process's CPUs (check_bound compares).
        assert_eq!(shares[0], [0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(shares[1], [4, 5, 6, 7, 12, 13, 14, 15]);
    }

    #[test]
    fn fewer_cores_than_workers_share_out_hardware_threads_first_ones_first() {
        let (cpus, core_of) = smt(2, 2);
        let shares = split(&physical_cores(&cpus, core_of), 4).unwrap();
        assert_eq!(shares, [vec![0], vec![1], vec![2], vec![3]]);
        // 3 cores of 2 threads, 4 workers: no core idles while one holds two.
        let (cpus, core_of) = smt(3, 2);
        let shares = split(&physical_cores(&cpus, core_of), 4).unwrap();
        assert_eq!(shares, [vec![0], vec![1], vec![2], vec![3]]);
    }

    #[test]
    fn cores_with_different_thread_counts_give_as_many_threads_each() {
        // A cpuset of 0, 1 and 8 on 8 cores of 2 threads: cores {0, 8} and {1}.
        let core_of = |cpu: usize| Some((0, (cpu % 8) as u64));
        let shares = split(&physical_cores(&[0, 1, 8], core_of), 2).unwrap();
        assert_eq!(shares, [vec![0], vec![1]]);
        // A hybrid CPU: 4 cores of 2 threads (0-7, siblings side by side),
        // then 4 of one (8-11). No core is split between two workers.
        let core_of = |cpu: usize| Some((0, if cpu < 8 { cpu / 2 } else { cpu } as u64));
        let cpus: Vec<usize> = (0..12).collect();
        let shares = split(&physical_cores(&cpus, core_of), 2).unwrap();
        assert_eq!(shares, [vec![0, 2, 4, 6], vec![8, 9, 10, 11]]);
    }

    #[test]
    fn more_workers_than_cpus_are_not_bound() {
        let (cpus, core_of) = smt(2, 1);
        assert_eq!(split(&physical_cores(&cpus, core_of), 3), None);
    }

    #[test]
    fn what_does_not_divide_evenly_is_left_over() {
        let cores: Vec<Vec<usize>> = (0..5).map(|c| vec![c]).collect();
        assert_eq!(split(&cores, 2).unwrap(), [vec![0, 1], vec![2, 3]]);
    }

    #[test]
    fn packages_come_before_cores_and_unknown_cpus_last() {
        // Two packages whose core ids repeat, and a CPU without topology.
        let core_of = |cpu: usize| (cpu < 4).then_some(((cpu / 2) as u64, (cpu % 2) as u64));
        let cores = physical_cores(&[4, 3, 2, 1, 0], core_of);
        assert_eq!(cores, [vec![0], vec![1], vec![2], vec![3], vec![4]]);
    }

    #[test]
    fn a_taskset_launcher_shares_out_only_its_own_cpus() {
        let cores = physical_cores(&[2, 3, 6, 7], |cpu| Some((0, cpu as u64)));
        assert_eq!(split(&cores, 2).unwrap(), [vec![2, 3], vec![6, 7]]);
    }

    #[test]
    fn cpu_lists_read_as_ranges() {
        assert_eq!(cpu_list(&[3, 0, 1, 2, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[5]), "5");
    }
}
